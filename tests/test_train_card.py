"""The model card's renderer: figures come from the stages' records, whatever the run went through."""

from __future__ import annotations

import json
import shutil

from specdec_lab.models import zoo_path
from specdec_lab.train.card import write_model_card


def card_for(tmp_path, edit) -> str:
    """Render the shipped zoo's card after `edit` changed a copy of its training record."""
    for name in ("recipe.json", "training.json"):
        shutil.copy(zoo_path() / name, tmp_path / name)
    record = json.loads((tmp_path / "training.json").read_text())
    edit(record)
    (tmp_path / "training.json").write_text(json.dumps(record))
    return write_model_card(tmp_path).read_text()


def test_training_time_leaves_out_the_hours_a_job_sat_paused(tmp_path):
    def paused_for_hours(record):  # both of the target's phases: pre-training, then the loop phase
        record["target"].update(train_seconds=4000 + 3 * 3600, compute_seconds=4000)
        record["target"]["loop_unlikelihood"].update(train_seconds=1000 + 3600, compute_seconds=1000)

    card = card_for(tmp_path, paused_for_hours)
    assert "| training time | 83 min |" in card and "median step" in card


def test_the_draft_phases_acceptance_is_printed_as_measured(tmp_path):
    def measured(record):
        record["draft"]["acceptance_after_phase"] = {
            "prompts": 100, "k": 4, "max_new_tokens": 64,
            "phases": {"corpus": 0.4912, "corpus, then target outputs": 0.6451}}

    card = card_for(tmp_path, measured)
    assert "0.491 after training on corpus, 0.645 after training on corpus, then target outputs" in card
    assert "first 100 held-out prompts" in card


def test_the_sample_completions_say_how_they_were_chosen(tmp_path):
    card = card_for(tmp_path, lambda record: None)
    assert "The first 3 of the 100 held-out prompts, in their fixed order (not chosen)" in card


def test_a_schedule_changed_mid_run_is_disclosed(tmp_path):
    def cut_then_extended(record):
        record["target"]["notes"] = ["Why the target's schedule changed."]
        record["target"]["off_schedule"] = {"steps": 3950, "first_step": 51, "last_step": 4000,
                                            "lr_ratio_min": 0.31, "lr_ratio_max": 1.114}
        record["draft"]["notes"] = ["A draft note."]

    card = card_for(tmp_path, cut_then_extended)
    disclosed = "The target's learning-rate schedule was changed during training: 3950 steps (steps 51 to 4000)"
    assert disclosed in card and "0.31x to 1.11x" in card
    # It follows the target's own notes, before the draft's.
    assert card.index("Why the target's schedule changed.") < card.index(disclosed) < card.index("A draft note.")
    assert "schedule was changed" not in card_for(tmp_path, lambda record: None)


def test_a_draft_trained_on_text_of_its_own_and_chosen_among_candidates_says_so(tmp_path):
    def chosen_on_a_gpu(record):
        record["draft"]["candidates"] = {"chosen": "b", "selection_prompts": 100, "selection_acceptance": {
            "a": None, "b": {"rate": 0.5561, "prompts": 100, "of": 100},
            "c": {"rate": 0.538, "prompts": 79, "of": 100}}}
        record["draft"]["stopped_early"] = [{"phase": "draft", "steps": 3241, "of": 3496}]

    recipe = json.loads((zoo_path() / "recipe.json").read_text())
    recipe["draft_target_outputs"] = {"prompts": 6558, "new_tokens": 128, "max_prompt_tokens": 160,
                                      "batch_size": 512, "share": 0.5}
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    shutil.copy(zoo_path() / "training.json", tmp_path / "training.json")
    record = json.loads((tmp_path / "training.json").read_text())
    chosen_on_a_gpu(record)
    (tmp_path / "training.json").write_text(json.dumps(record))
    card = write_model_card(tmp_path).read_text()
    assert "The Medusa heads and the EAGLE heads draw" in card and "The draft's second phase, the Medusa" not in card
    assert "completions of its own: the target's greedy 128-token completions of 6558 training-split" in card
    assert "the draft is `b`, the best of 3 candidates" in card
    assert "a not scored" in card and "b 0.556" in card and "c 0.538 (on the first 79" in card
    assert "corpus phase stopped at its time cap after 3241 of the 3496 steps" in card


def test_a_target_fine_tuned_against_its_loops_says_what_the_phase_changed(tmp_path):
    recipe = json.loads((zoo_path() / "recipe.json").read_text())
    recipe["target_tune"] = {"prompts_per_step": 16, "new_tokens": 64, "min_loop_tokens": 8,
                             "run": {"steps": 200, "batch_size": 8, "seq_len": 512}}
    record = json.loads((zoo_path() / "training.json").read_text())
    record["target"]["pretrained_from"] = {"zoo": "stdlib-14m-r2", "digest": "abc"}
    record["target"]["loop_unlikelihood"] = {
        "steps": 200, "hardware": "CUDA: a GPU", "train_seconds": 900.0, "compute_seconds": 600.0,
        "best": {"step": 150, "val_loss": 2.401, "selection_degenerate_share": 0.02,
                 "selection_first_statement_parses": 0.84}}
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    (tmp_path / "training.json").write_text(json.dumps(record))
    card = write_model_card(tmp_path).read_text()
    before = record["target"]["best"]
    assert (f"went from loops in {before['selection_degenerate_share']:.0%} and first statements parsing in "
            f"{before['selection_first_statement_parses']:.0%} (pre-training, step {before['step']}) to 2% and 84% "
            "(step 150 of 200)") in card
    assert "5000 x 8 x 512, then 200 x 8 x 512 plus 16 completions of its own of 64 tokens per step" in card
    assert f"| training time | {record['target']['compute_seconds'] / 60 + 10:.0f} min |" in card
    assert "| hardware | CPU: x86_64, 2 threads, then CUDA: a GPU |" in card
    assert "the target of `stdlib-14m-r2`" in card
    recipe.pop("target_tune")
    record["target"].pop("loop_unlikelihood")
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    (tmp_path / "training.json").write_text(json.dumps(record))
    assert "loop unlikelihood" not in write_model_card(tmp_path).read_text()  # a target trained in one phase
