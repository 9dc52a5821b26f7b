"""The `specdec` command: help a newcomer can read, generation on saved models, clean errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lab.cli import main


def run_cli(args: list[str], capsys) -> tuple[str, str]:
    main(args)
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_top_level_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    assert "speculative decoding" in text.lower()
    for command in ("generate", "demo", "train"):
        assert command in text


def test_generate_help_explains_the_options(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["generate", "--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    for option in ("--method", "--k", "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--seed",
                   "--target", "--draft", "greedy"):
        assert option in text


@pytest.mark.parametrize("method", ["draft", "lookup", "plain"])
def test_generate_on_saved_models_prints_the_text_and_the_statistics(method, saved_models, capsys):
    out, _ = run_cli(["generate", "def add(a, b):", "--method", method, "--max-new-tokens", "8",
                      "--target", str(saved_models / "target"), "--draft", str(saved_models / "draft")], capsys)
    text, _, stats = out.partition("\n---\n")
    assert text.startswith("def add(a, b):") and len(text) > len("def add(a, b):")
    figures = dict(line.split(":", 1) for line in stats.strip().splitlines())
    figures = {key.strip(): value.strip() for key, value in figures.items()}
    assert figures["new_tokens"] == "8"
    if method == "plain":
        assert figures["tau"] == "1.0"
    else:
        assert float(figures["tau"]) >= 1.0


def test_sampled_generation_is_reproducible_from_the_seed(saved_models, capsys):
    args = ["generate", "import", "--temperature", "1.0", "--top-p", "0.9", "--seed", "5", "--max-new-tokens", "6",
            "--target", str(saved_models / "target"), "--draft", str(saved_models / "draft")]
    first, _ = run_cli(args, capsys)
    again, _ = run_cli(args, capsys)
    assert first.split("\n---\n")[0] == again.split("\n---\n")[0]


def test_a_bad_model_path_is_a_clean_error(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as excinfo:
        main(["generate", "hello", "--target", str(missing)])
    message = str(excinfo.value.code)
    assert message.startswith("error:") and str(missing) in message
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__


def test_bad_sampling_settings_are_a_clean_error(saved_models):
    with pytest.raises(SystemExit, match=r"error: top_p must lie in \(0, 1\]"):
        main(["generate", "x", "--temperature", "1", "--top-p", "2", "--method", "plain",
              "--target", str(saved_models / "target")])


def test_the_draft_method_without_a_draft_model_is_a_clean_error(saved_models):
    with pytest.raises(SystemExit, match="needs a draft model"):
        main(["generate", "x", "--target", str(saved_models / "target")])


def test_the_installed_command_reports_a_bad_path_without_a_traceback(tmp_path):
    script = Path(sys.executable).parent / "specdec"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "specdec_lab.cli"]
    result = subprocess.run([*command, "generate", "hi", "--target", str(tmp_path / "missing")],
                            capture_output=True, text=True, timeout=1200)  # a hang guard only
    assert result.returncode == 1
    assert "error: could not load a causal LM" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_zoo_method_prints_the_same_greedy_text_as_plain(capsys):
    texts = {}
    for method in ("plain", "lookahead", "medusa", "eagle"):
        out, _ = run_cli(["generate", "def area(radius):", "--method", method, "--max-new-tokens", "24"], capsys)
        texts[method] = out.partition("\n---\n")[0]
    assert len(texts["plain"]) > len("def area(radius):")
    assert all(text == texts["plain"] for text in texts.values()), texts


def test_sweep_runs_a_tiny_setting_and_writes_its_figure(saved_models, tmp_path, capsys):
    import json

    html, data = tmp_path / "sweep.html", tmp_path / "sweep.json"
    out, _ = run_cli(["sweep", "--temperatures", "0,1", "--methods", "draft,draft-block,medusa", "--prompts", "1",
                      "--max-new-tokens", "4", "--seeds", "1", "--threads", "1", "--html", str(html),
                      "--json", str(data),
                      "--target", str(saved_models / "target"), "--draft", str(saved_models / "draft")], capsys)
    result = json.loads(data.read_text())
    assert set(result["methods"]) == {"draft", "draft-block"}
    assert "medusa" in result["skipped"]  # the zoo's heads do not fit this tiny target: skipped with the reason
    for row in result["methods"].values():
        assert row["temperature"] == [0.0, 1.0] and all(0 <= a <= 1 for a in row["alpha"])
        assert all(1 <= t <= 5 for t in row["tau"])  # k = 4: at most 4 kept + 1 per forward
    page = html.read_text()
    assert "plotly" in page and "draft model, block verification" in page and "T=1" in page
    assert "draft-block" in out and "skipped medusa" in out


def test_sweep_refuses_an_unknown_method(saved_models):
    with pytest.raises(SystemExit, match="unknown method"):
        main(["sweep", "--methods", "warp", "--target", str(saved_models / "target")])


def test_pretrained_is_refused_for_a_stage_it_cannot_start(tmp_path):
    with pytest.raises(SystemExit, match="has no meaning for 'medusa'"):
        main(["train", "medusa", "--pretrained", str(tmp_path), "--workdir", str(tmp_path)])
