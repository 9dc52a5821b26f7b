"""The target's loop unlikelihood phase (`train.unlikelihood`): its loss, and the stage that runs it."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_llama

from specdec_lab.train.recipe import LoopUnlikelihood, ModelShape, RunConfig, ZooRecipe
from specdec_lab.train.unlikelihood import before_end, greedy_completions, unlikelihood_loss
from specdec_lab.train.zoo import run_stage


def test_the_unlikelihood_loss_pushes_down_exactly_the_marked_tokens():
    torch.manual_seed(0)
    model = make_llama(vocab_size=32, hidden_size=16, num_layers=1)
    ids = torch.randint(1, 32, (2, 10))
    mask = torch.ones_like(ids)
    width = 6  # tokens 6..9 are the completion
    marked = torch.zeros(2, 4, dtype=torch.bool)
    marked[0, 2] = True  # row 0's third completion token, ids[0, 8]
    loss = unlikelihood_loss(model, ids, mask, width, marked)
    p = torch.softmax(model(ids).logits[0, 7], -1)[ids[0, 8]]
    assert loss.item() == pytest.approx(-torch.log1p(-p).item(), rel=1e-5)
    loss.backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer.step()
    assert torch.softmax(model(ids).logits[0, 7], -1)[ids[0, 8]] < p  # a step against it lowers its probability
    assert unlikelihood_loss(model, ids, mask, width, torch.zeros_like(marked)).item() == 0


def test_completions_start_at_one_column_and_end_at_the_first_end_of_text(tmp_path):
    from transformers import AutoTokenizer

    from specdec_lab.models import zoo_path

    tokenizer = AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))
    model = make_llama(vocab_size=4096, hidden_size=16, num_layers=1, eos_token_id=0)
    settings = LoopUnlikelihood(new_tokens=5, max_prompt_tokens=8)
    ids, mask, width = greedy_completions(model, tokenizer, ["def f(x):", "import os\nimport sys\nprint(1)"], settings)
    assert ids.shape == (2, width + 5) and width == 8  # the longer prompt was cut to its last 8 tokens
    assert mask[0, :width].sum() < width and mask[:, width:].all()  # the short one is padded on the left
    assert before_end(torch.tensor([[4, 5, 0, 0, 7]]), 0).tolist() == [[True, True, False, False, False]]


def test_the_target_stage_fine_tunes_a_pretrained_target_against_its_loops(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=False)
    pretrained = tmp_path / "previous" / "target"  # another zoo's target, with room for the held-out prompts
    make_llama(vocab_size=4096, hidden_size=32, num_layers=1, eos_token_id=0, max_positions=1024).save_pretrained(
        str(pretrained))
    (pretrained.parent / "training.json").write_text(json.dumps({"target": {"steps": 5000, "hardware": "CPU"}}))
    (pretrained.parent / "recipe.json").write_text(json.dumps({"name": "previous-zoo"}))
    recipe = ZooRecipe.load(zoo / "recipe.json")
    recipe.target = ModelShape(32, 1, 2, 64, 1024)
    recipe.target_tune = LoopUnlikelihood(prompts_per_step=2, new_tokens=16, min_loop_tokens=2, prompt_pool=8,
                                          run=RunConfig(steps=2, batch_size=2, seq_len=16, lr=1e-3, warmup_steps=1,
                                                        eval_every=2, eval_batches=1))
    recipe.save(zoo / "recipe.json")
    with pytest.raises(ValueError, match="hidden size 32 with 1 layers, but the recipe asks for hidden size 64"):
        wrong = ZooRecipe.load(zoo / "recipe.json")
        wrong.target = ModelShape(64, 1, 2, 64, 1024)
        wrong.save(tmp_path / "wrong.json")
        (tmp_path / "tokenizer").symlink_to(zoo / "tokenizer")
        run_stage("target", tmp_path / "wrong.json", runs, pretrained=pretrained)
    result = run_stage("target", zoo / "recipe.json", runs, pretrained=pretrained)
    assert result["pretrained_from"]["zoo"] == "previous-zoo" and result["steps"] == 5000  # the pre-training's record
    pretraining = recipe.target_run
    assert result["tokens_seen"] == pretraining.steps * pretraining.batch_size * pretraining.seq_len + 2 * 2 * 16
    tune = result["loop_unlikelihood"]
    assert tune["finished"] and tune["steps"] == 2 and "selection_degenerate_share" in tune
    before = torch.load(runs / "tiny" / "target-tune" / "checkpoint.pt")["module"]
    shipped = json.loads((zoo / "training.json").read_text())["target"]
    assert shipped["loop_unlikelihood"]["steps"] == 2
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(zoo / "target"))
    original = AutoModelForCausalLM.from_pretrained(str(pretrained))
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.allclose(exported.state_dict()[name].float(), before[name].half().float())
    assert not torch.equal(exported.state_dict()[name], original.state_dict()[name])  # it was trained


def test_the_draft_stage_can_start_its_second_phase_from_another_zoos_draft(tmp_path, tiny_zoo):
    from specdec_lab.train.card import draft_runs, pretrained_draft_line
    from specdec_lab.train.lm import build_llama

    zoo, runs = tiny_zoo(tmp_path, tune=True)
    previous = tmp_path / "previous"
    recipe = ZooRecipe.load(zoo / "recipe.json")
    build_llama(recipe.draft, 4096, 0, seed=5).save_pretrained(str(previous / "draft"))
    (previous / "training.json").write_text(json.dumps({"draft": {"steps": 7, "tokens_seen": 1000,
                                                                   "compute_seconds": 120.0, "hardware": "GPU"}}))
    (previous / "recipe.json").write_text(json.dumps({"name": "previous-zoo"}))
    result = run_stage("draft", zoo / "recipe.json", runs, pretrained=previous / "draft")
    assert result["steps"] == 2 and result["pretrained_from"]["zoo"] == "previous-zoo"  # the second phase only
    assert result["tokens_seen"] == 1000 + 2 * 2 * 16
    assert list(result["acceptance_after_phase"]["phases"]) == ["the draft of previous-zoo, as it was",
                                                                "the outputs of this target"]
    assert draft_runs(json.loads((zoo / "recipe.json").read_text()), result).startswith("the draft of `previous-zoo`")
    assert "(7 steps, 2 min on GPU" in pretrained_draft_line(result)[0]
    recipe.draft_tune_run = None
    recipe.save(zoo / "recipe.json")
    with pytest.raises(ValueError, match="has no draft_tune_run"):
        run_stage("draft", zoo / "recipe.json", runs, pretrained=previous / "draft")
