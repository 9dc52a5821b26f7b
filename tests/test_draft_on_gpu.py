"""scripts/draft_on_gpu.py: the GPU run's schedules fit its budget, and a corpus that is not the target's is refused."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "draft_on_gpu.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("draft_on_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_two_phases_fill_the_budget_at_the_measured_step_times(script):
    corpus, mixed = script.runs((0.03, 0.05), 300.0)
    spent = corpus.steps * 0.03 + mixed.steps * 0.05
    assert spent == pytest.approx(300.0, rel=0.01)
    assert corpus.steps * 0.03 == pytest.approx(script.CORPUS_SHARE * 300.0, rel=0.01)
    assert corpus.warmup_steps < corpus.steps and corpus.eval_every <= corpus.steps


def test_a_carried_corpus_that_is_not_the_targets_is_refused(script, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "only.py").write_text("x = 1\n")
    tarball = tmp_path / "corpus.tar.xz"
    with tarfile.open(tarball, "w:xz") as tar:
        tar.add(tmp_path / "src" / "only.py", arcname="only.py")
    with pytest.raises(SystemExit, match="the carried corpus has fingerprint .* the target was trained on"):
        script.load_carried_corpus(tarball, tmp_path / "unpacked")
