"""Loading models saved as Hugging Face folders: device, dtype, eval mode, and where the tokenizer is found."""

from __future__ import annotations

import pytest
import torch

from specdec_lab import generate, load_model, load_pair, zoo_path
from specdec_lab.models import pick_device, pick_dtype


def test_load_model_gives_an_fp32_cpu_model_in_eval_mode_and_the_sibling_tokenizer(saved_models):
    model, tokenizer = load_model(saved_models / "target", device="cpu")
    parameter = next(model.parameters())
    assert parameter.dtype == torch.float32 and parameter.device.type == "cpu"
    assert not model.training
    assert model.config.hidden_size == 32  # the target, not another folder's model
    # No tokenizer in target/: the zoo layout's sibling tokenizer/ folder was used.
    assert not (saved_models / "target" / "tokenizer_config.json").exists()
    assert len(tokenizer) == model.config.vocab_size == 4096
    assert tokenizer.decode(tokenizer("def add(a, b):")["input_ids"]) == "def add(a, b):"


def test_a_tokenizer_inside_the_model_folder_is_used(saved_models):
    model, tokenizer = load_model(saved_models / "standalone", device="cpu")
    assert model.config.hidden_size == 16 and len(tokenizer) == 4096


def test_loaded_weights_are_the_saved_ones(saved_models, llama_factory):
    model, _ = load_model(saved_models / "draft", device="cpu")
    original = llama_factory(vocab_size=4096, hidden_size=16, num_layers=1, seed=1)
    torch.testing.assert_close(model.lm_head.weight, original.lm_head.weight)


def test_load_pair_loads_target_draft_and_their_shared_tokenizer(saved_models):
    pair = load_pair(target=saved_models / "target", draft=saved_models / "draft", device="cpu")
    assert pair.target.config.hidden_size == 32 and pair.draft.config.hidden_size == 16
    assert not pair.target.training and not pair.draft.training
    assert next(pair.draft.parameters()).dtype == torch.float32
    ids = pair.tokenizer("import os", add_special_tokens=False)["input_ids"]
    assert len(generate(pair.target, ids, max_new_tokens=3).tokens) == 3


def test_load_pair_without_a_draft(saved_models):
    pair = load_pair(target=saved_models / "target", device="cpu")
    assert pair.draft is None and pair.target is not None


def test_an_explicit_dtype_is_honoured(saved_models):
    model, _ = load_model(saved_models / "draft", device="cpu", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_device_and_dtype_defaults():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device().type == expected and pick_device("cpu").type == "cpu"
    assert pick_dtype(torch.device("cpu")) == torch.float32
    assert pick_dtype(torch.device("cuda")) == torch.float16
    assert pick_dtype(torch.device("cpu"), torch.float64) == torch.float64


def test_an_unknown_model_path_is_a_clear_file_not_found_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="could not load a causal LM from") as excinfo:
        load_model(missing, device="cpu")
    assert str(missing) in str(excinfo.value)
    assert "specdec_lab" in str(excinfo.traceback[-1].path)  # raised by our loader, not deep in transformers
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__


def test_an_empty_folder_is_a_clear_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="local folder"):
        load_model(tmp_path, device="cpu")


def test_draft_and_target_with_different_tokenizers_are_refused(saved_models):
    with pytest.raises(ValueError, match="use different tokenizers"):
        load_pair(target=saved_models / "target", draft=saved_models / "other-vocab", device="cpu")


def test_the_zoo_folder_is_inside_the_package():
    assert (zoo_path() / "tokenizer" / "tokenizer.json").is_file()
    assert zoo_path().parent.name == "zoo" and zoo_path().parent.parent.name == "specdec_lab"
