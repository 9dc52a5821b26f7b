"""The Medusa stage: train heads on the frozen target, build trees, measure, ship, and write the card."""

from __future__ import annotations

import json

from specdec_lab.drafters.medusa import MedusaHeads
from specdec_lab.train.medusa import run_medusa_stage


def test_the_stage_trains_measures_and_ships_the_fastest_tree(tmp_path, tiny_zoo):
    zoo, runs = tiny_zoo(tmp_path, tune=False)
    section = {"num_heads": 3, "ranks": 4, "tree_budgets": [4, 6], "measure_prompts": 2, "measure_tokens": 6,
               "run": {"steps": 3, "batch_size": 2, "seq_len": 16, "warmup_steps": 1, "eval_every": 3,
                       "eval_batches": 1}}
    recipe = json.loads((zoo / "recipe.json").read_text())
    recipe["medusa"] = section
    (zoo / "recipe.json").write_text(json.dumps(recipe))
    result = run_medusa_stage(zoo / "recipe.json", runs)
    assert result["finished"] and result["steps"] == 3
    rows = {row["tree"]: row for row in result["measured"]["rows"]}
    assert set(rows) == {"chain", "sparse-4", "sparse-6"}
    assert all(row["same_as_plain"] == "2/2" for row in rows.values())  # greedy: every tree is exact
    fastest = max(rows.values(), key=lambda row: row["tokens_per_second"])["tree"]
    heads = MedusaHeads.load(zoo / "medusa")
    assert result["tree_name"] == fastest and [tuple(c) for c in result["tree"]] == list(heads.tree)
    assert len(result["tree_rank_accuracy"]) == 3 and len(result["head_top1"]) == 3
    card = json.loads((zoo / "training.json").read_text())["medusa"]["card"]
    assert "top-1 on target outputs" in card and f"| {fastest} |" in card
