"""The zoo's draft stage: corpus distillation, then a second phase on corpus mixed with target outputs."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import AutoModelForCausalLM

from specdec_lab.models import zoo_path
from specdec_lab.train.recipe import ModelShape, RunConfig, TargetOutputs, ZooRecipe
from specdec_lab.train.zoo import run_stage


def tiny_zoo(tmp_path, llama_factory, tune: bool) -> tuple:
    """A zoo folder with the real tokenizer, a tiny random target and a recipe for a tiny draft; the work
    folder holds synthetic token streams (what tokenising the corpus and completing prompts would cache)."""
    zoo, runs = tmp_path / "zoo", tmp_path / "runs"
    shutil.copytree(zoo_path() / "tokenizer", zoo / "tokenizer")
    llama_factory(vocab_size=4096, hidden_size=32, num_layers=1, seed=0, eos_token_id=0).save_pretrained(
        str(zoo / "target"))
    run = RunConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, eval_every=3, eval_batches=1)
    recipe = ZooRecipe("tiny", draft=ModelShape(16, 1, 2, 32, 64), draft_run=run,
                       draft_tune_run=RunConfig(**{**run.__dict__, "steps": 2}) if tune else None,
                       target_outputs=TargetOutputs(prompts=4, share=0.5))
    recipe.save(zoo / "recipe.json")
    gen = torch.Generator().manual_seed(0)
    (runs / "tiny").mkdir(parents=True)
    torch.save({"train": torch.randint(1, 4096, (2000,), generator=gen, dtype=torch.int32),
                "val": torch.randint(1, 4096, (500,), generator=gen, dtype=torch.int32)}, runs / "tiny" / "streams.pt")
    torch.save(torch.randint(1, 4096, (800,), generator=gen, dtype=torch.int32), runs / "tiny" / "target_outputs.pt")
    return zoo, runs


def test_the_draft_trains_in_two_phases_and_ships(tmp_path, llama_factory):
    zoo, runs = tiny_zoo(tmp_path, llama_factory, tune=True)
    result = run_stage("draft", zoo / "recipe.json", runs)
    assert result["finished"] and result["steps"] == 3 + 2
    assert result["tokens_seen"] == (3 + 2) * 2 * 16
    phases = [runs / "tiny" / name / "log.jsonl" for name in ("draft", "draft-tune")]
    assert [len(p.read_text().splitlines()) for p in phases] == [3, 2]
    draft = AutoModelForCausalLM.from_pretrained(str(zoo / "draft"))
    assert draft.config.hidden_size == 16 and draft.dtype == torch.float16  # shipped as fp16
    assert json.loads((zoo / "training.json").read_text())["draft"]["steps"] == 5


def test_a_paused_draft_resumes_where_it_stopped(tmp_path, llama_factory):
    zoo, runs = tiny_zoo(tmp_path, llama_factory, tune=True)
    paused = run_stage("draft", zoo / "recipe.json", runs, max_minutes=0)
    assert not paused["finished"] and paused["steps"] == 1 and not (zoo / "draft").exists()
    assert run_stage("draft", zoo / "recipe.json", runs)["steps"] == 5


def test_without_a_second_phase_the_draft_is_corpus_distillation_only(tmp_path, llama_factory):
    zoo, runs = tiny_zoo(tmp_path, llama_factory, tune=False)
    (runs / "tiny" / "target_outputs.pt").unlink()  # must not be needed (nor generated)
    result = run_stage("draft", zoo / "recipe.json", runs)
    assert result["steps"] == 3 and not (runs / "tiny" / "target_outputs.pt").exists()
    assert not (runs / "tiny" / "draft-tune").exists()
