"""The zoo's draft stage: corpus distillation, then a second phase on corpus mixed with target outputs."""

from __future__ import annotations

import json

import torch
from conftest import make_llama
from transformers import AutoModelForCausalLM

from specdec_lab.train.recipe import TargetOutputs, ZooRecipe
from specdec_lab.train.zoo import against_target, run_stage


def test_the_draft_trains_in_two_phases_and_ships(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=True)
    result = run_stage("draft", zoo / "recipe.json", runs)
    assert result["finished"] and result["steps"] == 3 + 2
    assert result["tokens_seen"] == (3 + 2) * 2 * 16
    phases = [against_target(runs / "tiny", zoo) / name / "log.jsonl" for name in ("draft", "draft-tune")]
    assert [len(p.read_text().splitlines()) for p in phases] == [3, 2]
    draft = AutoModelForCausalLM.from_pretrained(str(zoo / "draft"))
    assert draft.config.hidden_size == 16 and draft.dtype == torch.float16  # shipped as fp16
    assert json.loads((zoo / "training.json").read_text())["draft"]["steps"] == 5
    checks = result["acceptance_after_phase"]  # what the second phase bought, measured after each phase
    assert checks["prompts"] == 2 and list(checks["phases"]) == ["corpus", "corpus, then target outputs"]
    assert all(0 <= rate <= 1 for rate in checks["phases"].values())


def test_a_paused_draft_resumes_where_it_stopped(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=True)
    paused = run_stage("draft", zoo / "recipe.json", runs, max_minutes=0)
    assert not paused["finished"] and paused["steps"] == 1 and not (zoo / "draft").exists()
    assert run_stage("draft", zoo / "recipe.json", runs)["steps"] == 5


def test_without_a_second_phase_the_draft_is_corpus_distillation_only(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=False)
    state = against_target(runs / "tiny", zoo)
    (state / "target_outputs.pt").unlink()  # must not be needed (nor generated)
    result = run_stage("draft", zoo / "recipe.json", runs)
    assert result["steps"] == 3 and not (state / "target_outputs.pt").exists()
    assert not (state / "draft-tune").exists()
    assert list(result["acceptance_after_phase"]["phases"]) == ["corpus"]  # one phase, one measurement


def test_a_retrained_target_starts_the_draft_afresh(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=False)
    old_state = against_target(runs / "tiny", zoo)
    run_stage("draft", zoo / "recipe.json", runs)
    assert (old_state / "draft" / "checkpoint.pt").exists()
    # A new target (other weights): the finished checkpoint above was distilled from the old one and must not
    # be resumed (it would export the old draft without training a step).
    make_llama(vocab_size=4096, hidden_size=32, num_layers=1, seed=1, eos_token_id=0).save_pretrained(
        str(zoo / "target"))
    new_state = against_target(runs / "tiny", zoo)
    assert new_state != old_state
    run_stage("draft", zoo / "recipe.json", runs)
    assert len((new_state / "draft" / "log.jsonl").read_text().splitlines()) == 3  # trained all its steps


def record_many(zoo, prefix):
    from specdec_lab.train.zoo import record_result

    for i in range(300):
        record_result(zoo, f"{prefix}{i}", {"i": i})


def test_stages_recording_side_by_side_lose_nothing(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=record_many, args=(tmp_path, prefix)) for prefix in ("draft", "medusa")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    record = json.loads((tmp_path / "training.json").read_text())
    assert len(record) == 600  # an unlocked read-modify-write loses some of the other process's sections


def test_a_paused_draft_carried_to_a_new_machine_resumes_there(tmp_path, tiny_zoo):
    """Both draft phases' carries are written against the target; a fresh work folder resumes from them
    (only the remaining steps run), and finishing the stage removes the carries."""
    import shutil

    from specdec_lab.train.zoo import carry_folder, write_stage_carry

    zoo, runs = tiny_zoo(tmp_path, tune=True)
    run_stage("draft", zoo / "recipe.json", runs, max_minutes=0)  # paused after one step of phase one
    state = write_stage_carry(zoo / "recipe.json", runs, "draft")
    assert state["step"] == 1 and (carry_folder(zoo, "draft") / "against_target.txt").exists()
    fresh = tmp_path / "fresh"  # the new machine: the caches it would rebuild, no checkpoint
    (fresh / "tiny").mkdir(parents=True)
    shutil.copy(runs / "tiny" / "streams.pt", fresh / "tiny" / "streams.pt")
    outputs = against_target(fresh / "tiny", zoo) / "target_outputs.pt"
    outputs.parent.mkdir()
    shutil.copy(against_target(runs / "tiny", zoo) / "target_outputs.pt", outputs)
    result = run_stage("draft", zoo / "recipe.json", fresh)
    assert result["finished"] and result["steps"] == 5
    steps_trained_here = [json.loads(line)["step"] for line in
                          (against_target(fresh / "tiny", zoo) / "draft" / "log.jsonl").read_text().splitlines()]
    assert steps_trained_here == [1, 2, 3]  # the carried step's record, then the two steps left
    assert not (zoo / "carry").exists()


def test_a_carry_made_against_another_target_is_not_resumed(tmp_path, tiny_zoo):
    from specdec_lab.train.zoo import stage_carry, write_stage_carry

    zoo, runs = tiny_zoo(tmp_path, tune=False)
    run_stage("draft", zoo / "recipe.json", runs, max_minutes=0)
    write_stage_carry(zoo / "recipe.json", runs, "draft")
    assert stage_carry(zoo, "draft") is not None
    make_llama(vocab_size=4096, hidden_size=32, num_layers=1, seed=1, eos_token_id=0).save_pretrained(
        str(zoo / "target"))
    assert stage_carry(zoo, "draft") is None  # distilled from the old target's weights


def test_a_draft_with_target_text_of_its_own_reads_that_text_not_the_heads(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=True)
    recipe = ZooRecipe.load(zoo / "recipe.json")
    recipe.draft_target_outputs = TargetOutputs(prompts=6, share=1.0)
    recipe.save(zoo / "recipe.json")
    state = against_target(runs / "tiny", zoo)
    (state / "target_outputs.pt").rename(state / "target_outputs-6.pt")  # the draft's own completions
    result = run_stage("draft", zoo / "recipe.json", runs)
    assert result["finished"]
    assert not (state / "target_outputs.pt").exists(), "the heads' text was neither read nor generated"
    assert ZooRecipe.load(zoo / "recipe.json").draft_target_outputs == TargetOutputs(prompts=6, share=1.0)
