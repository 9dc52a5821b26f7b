"""Bad input a new user could give, each refused before any work with an error that names the problem: an EOS id
outside the vocabulary, a truncated weights file, a CUDA device on a machine without one, an unwritable
`specdec tune --out`."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from specdec_lab import generate, generate_batch, load_model
from specdec_lab.cli import main


@pytest.mark.parametrize("eos", [64, 10_000, -2])
def test_an_eos_id_outside_the_vocabulary_is_refused(tiny_target, eos):
    with pytest.raises(ValueError, match=f"eos_token_id {eos} is outside the model's vocabulary \\[0, 64\\)"):
        generate(tiny_target, [1, 2, 3], max_new_tokens=2, eos_token_id=eos)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate_batch(tiny_target, [[1, 2, 3]], max_new_tokens=2, eos_token_id=eos)


def test_an_eos_id_that_is_not_an_integer_is_refused(tiny_target):
    for eos in (2.0, "2", [2, 3], True):
        with pytest.raises(ValueError, match="eos_token_id must be one integer token id"):
            generate(tiny_target, [1, 2, 3], max_new_tokens=2, eos_token_id=eos)


def test_minus_one_still_means_never_stop_and_a_valid_id_still_stops(tiny_target):
    out = generate(tiny_target, [1, 2, 3], max_new_tokens=6, eos_token_id=-1)
    assert len(out.tokens) == 6 and out.stopped_by == "max_new_tokens"
    stop = generate(tiny_target, [1, 2, 3], max_new_tokens=6, eos_token_id=out.tokens[0])
    assert stop.tokens == out.tokens[:1] and stop.stopped_by == "eos"


def test_a_truncated_safetensors_file_is_named(saved_models, tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(saved_models / "target", folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt") as excinfo:
        load_model(folder, device="cpu")
    message = str(excinfo.value)
    assert str(weights) in message and "incomplete metadata" in message and "again" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: asking for it is not an error here")
def test_cuda_on_a_machine_without_it_names_the_device_and_what_there_is(saved_models):
    with pytest.raises(ValueError, match="device 'cuda' asked for.*it has cpu"):
        load_model(saved_models / "draft", device="cuda")


def test_a_device_name_torch_does_not_know_is_refused(saved_models):
    with pytest.raises(ValueError, match="unknown device 'gpu'.*this machine has cpu"):
        load_model(saved_models / "draft", device="gpu")


def test_tune_checks_its_out_path_before_calibrating(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("specdec_lab.tune.tune", lambda *a, **k: calls.append(1) or {})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    expected = f"cannot write --out {blocker / 'profile.json'}: {blocker} is a file, not a folder"
    with pytest.raises(SystemExit, match=re.escape(expected)):
        main(["tune", "--out", str(blocker / "profile.json")])
    with pytest.raises(SystemExit, match="is a folder; give a file name"):
        main(["tune", "--out", str(tmp_path)])
    assert calls == []  # refused before the calibration ran
