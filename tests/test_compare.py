"""The drafters side by side (`specdec_lab.compare`), on the shipped zoo."""

import math

import pytest
import torch

import specdec_lab as sd
from specdec_lab.bench import corpus_prompts
from specdec_lab.compare import compare_drafters, comparison_table


@pytest.fixture(scope="module")
def zoo_comparison():
    torch.set_num_threads(1)
    pair = sd.load_pair()
    prompts = [p.ids for p in corpus_prompts("heldout", pair.tokenizer, 2, 400)]
    return compare_drafters(pair, prompts, max_new_tokens=24, k=3, names=["medusa", "eagle", "draft"])


def test_every_drafter_is_lossless_and_its_depth_figures_are_consistent(zoo_comparison):
    rows = zoo_comparison["drafters"]
    assert set(rows) == {"medusa", "eagle", "draft"}  # only the names asked for
    for name, row in rows.items():
        assert row["same_as_plain"] == zoo_comparison["prompts"], name  # greedy chains give the plain tokens
        assert row["depth"] == 3 and len(row["survival"]) == len(row["conditional"]) == 3
        # Keeping depth d needs every earlier depth kept: the kept counts can only fall, and at depth 1 the two
        # shares agree.
        assert row["kept"] == sorted(row["kept"], reverse=True) and row["kept"][0] > 0, name
        assert row["drafted"] == sorted(row["drafted"], reverse=True), name
        assert row["survival"][0] == row["conditional"][0]
        # Under the chain rule, survival at depth d is the product of the conditionals up to d (the counts are
        # the same steps, up to the shorter drafts at the end of a run).
        product = math.prod(c for c in row["conditional"] if c is not None)
        assert row["survival"][-1] == pytest.approx(product, abs=0.08), name
        assert 1.0 <= row["tau"] <= 4.0 and row["draft_ms_per_step"] > 0


def test_the_table_has_a_row_per_drafter_and_a_column_per_depth(zoo_comparison):
    table = comparison_table(zoo_comparison).splitlines()
    assert table[0].count("depth") == 3 and len(table) == 2 + len(zoo_comparison["drafters"])
    assert any(line.startswith("| Medusa heads") for line in table)


def test_a_drafter_missing_from_the_zoo_is_skipped_with_its_reason(tmp_path):
    pair = sd.load_pair()
    result = compare_drafters(pair, [pair.tokenizer("def f(x):")["input_ids"]], max_new_tokens=4, k=2,
                              names=["mtp", "draft"], zoo=tmp_path)
    assert set(result["drafters"]) == {"draft"}
    assert "mtp" in result["skipped"] and str(tmp_path) in result["skipped"]["mtp"]
