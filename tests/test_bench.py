"""The benchmark end to end on tiny random models that use the zoo tokenizer, and its measuring parts.

Speed is never asserted here; these tests check that every figure is there, that the bookkeeping of
Hugging Face's generate matches what it emitted, and that greedy methods reproduce the baseline.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec_lab import bench
from specdec_lab.bench import BenchConfig, BenchContext, HFStepRecorder, corpus_prompts, hf_runner
from specdec_lab.cli import main
from specdec_lab.models import ModelPair, zoo_path

ROW_FIELDS = {
    "label", "family", "kind", "lossless", "new_tokens", "tokens_per_second", "tokens_per_second_repeats",
    "speedup", "tau", "acceptance_rate", "per_position_acceptance", "conditional_acceptance", "target_forwards",
    "drafted", "accepted",
    "outputs_equal_to_baseline", "equal_to_baseline", "draft_share", "alpha", "measured_speedup_vs_own_ar",
    "predicted_speedup", "efficiency", "predicted_speedup_costed", "efficiency_costed", "times_floor",
}
CORE_METHODS = {"hf-generate", "plain", "hf-assisted", "draft", "hf-lookup", "lookup"}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, llama_factory, tokenizer):
    """A tiny target and draft over the zoo's 4096-token vocabulary, saved like real checkpoints."""
    folder = tmp_path_factory.mktemp("bench_models")
    shapes = {"target": dict(hidden_size=48, num_layers=2, seed=0), "draft": dict(hidden_size=32, num_layers=1, seed=1)}
    for name, shape in shapes.items():
        model = llama_factory(vocab_size=len(tokenizer), max_positions=1024, eos_token_id=tokenizer.eos_token_id,
                              logit_scale=4.0, **shape)
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    return folder / "target", folder / "draft"


def run_cli(saved_pair, tmp_path, *extra):
    target, draft = saved_pair
    out = tmp_path / "out"
    main(["bench", "--target", str(target), "--draft", str(draft), "--prompts", "2", "--max-new-tokens", "8",
          "--repeats", "1", "--threads", "1", "--json", str(out / "bench.json"), "--html", str(out / "bench.html"),
          "--markdown", str(out / "bench.md"), *extra])
    return json.loads((out / "bench.json").read_text()), out


def test_bench_end_to_end_json_has_every_field_for_every_method(saved_pair, tmp_path, capsys):
    result, out = run_cli(saved_pair, tmp_path)
    assert set(result["sets"]) == {"heldout", "grounded"}
    for block in result["sets"].values():
        assert block["prompts"] == 2
        assert CORE_METHODS <= set(block["methods"])
        # Every known method either ran or is listed as skipped, with its reason.
        assert set(block["methods"]) | set(result["skipped"]) == set(bench.method_names())
        for name, row in block["methods"].items():
            assert set(row) == ROW_FIELDS, name
            assert row["new_tokens"] > 0 and row["tokens_per_second"] > 0
            if row["lossless"]:
                assert row["equal_to_baseline"] is True, f"{name} differs from HF greedy output"
        assert block["methods"]["hf-generate"]["speedup"] == 1.0
        for name in ("draft", "hf-assisted"):
            assert block["methods"][name]["predicted_speedup"] is not None
    assert all(reason for reason in result["skipped"].values())
    for key in ("cpu", "torch_threads", "torch", "transformers"):
        assert result["machine"][key]
    assert result["costs"]["c"] > 0
    page = (out / "bench.html").read_text()
    assert page.count("<table>") == 2 and page.count("Plotly.newPlot") == 4
    assert re.search(r"<script[^>]*\ssrc=", page) is None  # nothing is fetched from the network
    assert len(page) > 1_000_000  # plotly.js is embedded: the page works offline
    markdown = (out / "bench.md").read_text()  # the README's tables: one per set, a row per method, same figures
    for kind, block in result["sets"].items():
        assert f"**{kind} prompts** (2 prompts" in markdown
        for name, row in block["methods"].items():
            assert f"| {name} | {row['tokens_per_second']:.1f} | {row['speedup']:.2f}x |" in markdown
    assert sorted(p.name for p in out.iterdir()) == ["bench.html", "bench.json", "bench.md"]  # no temporary files
    for block in result["sets"].values():  # every row's untimed warm-up is kept; with nothing compiled, not shown
        assert set(block["warmup_seconds"]) == set(block["methods"]) and min(block["warmup_seconds"].values()) >= 0
    assert "warm-up before timing" not in markdown
    printed = capsys.readouterr().out
    assert "hf-assisted" in printed and "meas/pred" in printed


def test_bench_sampling_reports_no_equality_and_keeps_fields(saved_pair, tmp_path):
    result, _ = run_cli(saved_pair, tmp_path, "--temperature", "1", "--methods", "draft,draft-adaptive,lookup",
                        "--sets", "heldout", "--adaptive-k", "6", "--min-confidence", "0.3")
    rows = result["sets"]["heldout"]["methods"]
    assert set(rows) == {"hf-generate", "draft", "draft-adaptive", "lookup"}
    assert result["settings"]["adaptive_k"] == 6 and result["settings"]["min_confidence"] == 0.3
    for row in rows.values():
        assert set(row) == ROW_FIELDS
        assert row["equal_to_baseline"] is None and row["outputs_equal_to_baseline"] is None


def test_unknown_method_is_refused_with_the_choices(saved_pair, tmp_path):
    with pytest.raises(SystemExit, match="unknown method.*medusa"):
        run_cli(saved_pair, tmp_path, "--methods", "warp-drive")


def test_hf_step_recorder_accounts_for_every_emitted_token(tiny_target, tokenizer):
    """accepted = emitted - forwards: each HF step emits its accepted candidates plus one target token."""
    # A copy of the target drafting for it (the same object would count its draft forwards as target ones).
    for assistant, expect_all_accepted in ((copy.deepcopy(tiny_target), True), (None, False)):
        config = BenchConfig(max_new_tokens=20, k=3)
        pair = ModelPair(tiny_target, assistant, tokenizer)
        context = BenchContext(pair, config, eos_token_id=None)
        if assistant is not None:
            run = bench.build_hf_assisted(context)
        else:
            run = hf_runner(context, prompt_lookup_num_tokens=3)
        result = run([5, 6, 7, 5, 6, 7, 5, 6], seed=0)
        stats = result.stats
        assert stats.new_tokens == len(result.tokens) == 20
        assert stats.accepted == stats.new_tokens - stats.target_forwards
        assert stats.accepted <= stats.drafted
        if expect_all_accepted:  # the target drafting for itself: every candidate survives
            assert stats.accepted == stats.drafted > 0


def test_hf_step_recorder_restores_the_model(tiny_target):
    with HFStepRecorder(tiny_target):
        assert "_get_candidate_generator" in vars(tiny_target)
    assert "_get_candidate_generator" not in vars(tiny_target)
    assert not tiny_target._forward_pre_hooks


def test_prompt_sets_come_from_validation_files(tokenizer):
    from specdec_lab.train.corpus import load_corpus

    val = set(load_corpus().val_files)
    heldout = corpus_prompts("heldout", tokenizer, 5, 300)
    grounded = corpus_prompts("grounded", tokenizer, 5, 300)
    assert len({p.source.rsplit(":", 1)[0] for p in heldout}) == 5  # five different files
    for prompt in heldout + grounded:
        assert prompt.source.rsplit(":", 1)[0] in val
        assert prompt.ids == tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    for prompt in heldout:
        assert prompt.text.startswith(("def ", "async def ")) and prompt.text.endswith(('"""', "'''"))
    for prompt in grounded:  # the header at the end was already shown above: the answer is in the prompt
        shown, header = prompt.text.split(", copied unchanged:\n")
        assert header.strip() and header.strip() in shown and not header.endswith("\n")
    assert corpus_prompts("heldout", tokenizer, 5, 300) == heldout  # deterministic


def test_efficiency_matches_the_closed_form():
    from specdec_lab.theory import expected_speedup

    method = bench.Method("draft", "", "ours", "chain", lambda c: None, draft_model=True)
    reference = bench.MethodRecord(bench.all_methods()[1], [bench.RunResult([1] * 10, None)], [[1.0]])
    row = {"tau": 3.0, "tokens_per_second": 20.0}
    figures = bench.efficiency(bench.MethodRecord(method, []), row, reference, BenchConfig(k=4),
                               {"c": 0.1, "verify_ratio": 1.2})
    predicted = expected_speedup(figures["alpha"], 4, 0.1)
    assert figures["predicted_speedup"] == pytest.approx(predicted, abs=2e-3)
    assert figures["measured_speedup_vs_own_ar"] == pytest.approx(2.0)
    assert figures["efficiency"] == pytest.approx(2.0 / predicted, abs=2e-3)
    assert figures["predicted_speedup_costed"] == pytest.approx(3.0 / (0.4 + 1.2), abs=1e-3)


def test_bad_settings_name_the_problem():
    with pytest.raises(ValueError, match="repeats"):
        BenchConfig(repeats=0).check()
    with pytest.raises(ValueError, match="tree_tokens"):
        BenchConfig(tree_tokens=0).check()
    with pytest.raises(ValueError, match="prompt sets"):
        BenchConfig(prompt_sets=("poems",)).check()
    assert torch.get_num_threads() >= 1


def test_forward_costs_time_the_cases_in_turns(tiny_target, tiny_draft):
    order, hooks = [], []
    for name, model in (("target", tiny_target), ("draft", tiny_draft)):
        hooks.append(model.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: order.append((name, kwargs["input_ids"].shape[1])),
            with_kwargs=True))
    try:
        costs = bench.forward_costs(ModelPair(tiny_target, tiny_draft, None), list(range(1, 20)), k=3, trials=4)
    finally:
        for hook in hooks:
            hook.remove()
    assert order[:3] == [("target", 19), ("target", 19), ("draft", 19)]  # one cached prefix per case
    assert order[3:] == [("target", 1), ("target", 4), ("draft", 1)] * 4  # then the cases take turns
    assert costs["verify_ratio"] == pytest.approx(costs["target_k1_ms"] / costs["target_1_ms"], rel=1e-3)
    assert costs["c"] == pytest.approx(costs["draft_1_ms"] / costs["target_1_ms"], rel=1e-3)
    assert costs["prefix_tokens"] == 19 and min(costs["target_1_ms"], costs["draft_1_ms"]) > 0


@pytest.mark.compile
def test_hf_generate_compiled_baseline_matches_the_eager_baseline(saved_pair, tmp_path):
    # Like with like: transformers' own static cache and compiled forward, as a second baseline row. Greedy,
    # it must emit what the eager `generate` emits; without --compile it runs only when asked for by name.
    result, _ = run_cli(saved_pair, tmp_path, "--methods", "plain,hf-generate-compiled", "--sets", "heldout")
    row = result["sets"]["heldout"]["methods"]["hf-generate-compiled"]
    assert row["family"] == "hf" and row["outputs_equal_to_baseline"] == result["settings"]["prompts"]
    warmup = result["sets"]["heldout"]["warmup_seconds"]["hf-generate-compiled"]  # where it compiled
    assert f"warm-up before timing (compiling, then one pass over the prompts): hf-generate-compiled {warmup:.0f} s" \
        in (tmp_path / "out" / "bench.md").read_text()
    skipped, _ = run_cli(saved_pair, tmp_path / "again", "--methods", "plain", "--sets", "heldout")
    assert "hf-generate-compiled" not in skipped["sets"]["heldout"]["methods"]


def test_hf_generate_compiled_runs_a_copy_that_our_compiled_rows_leave_alone(monkeypatch):
    # Our compiled forwards switch the model they compile to our attention (and give it float16 weight copies);
    # transformers' compiled row must trace transformers' own model, so it runs a copy taken when it is built.
    from conftest import make_llama

    from specdec_lab import bench_methods
    from specdec_lab.filled_attention import use_filled_attention

    target = make_llama(seed=2)
    runner = bench_methods.hf_compiled_runner(BenchContext(ModelPair(target, None, None), BenchConfig(compile=True),
                                                           eos_token_id=None))
    ran = []
    monkeypatch.setattr(bench_methods, "hf_runner", lambda context, **kwargs: lambda ids, seed: ran.append(context))
    if not use_filled_attention(target):  # what our first compiled forward does, where the kernels load
        target.config._attn_implementation = "eager"  # elsewhere: any change to the original would do
    runner([1, 2, 3], 0)
    copy_run = ran[0].pair.target
    assert copy_run is not target and copy_run.config._attn_implementation == "sdpa"
    assert all(torch.equal(a, b) for a, b in zip(copy_run.parameters(), target.parameters(), strict=True))


def test_bench_holds_plain_rows_against_the_bandwidth_floor(saved_pair, tmp_path):
    result, out = run_cli(saved_pair, tmp_path, "--methods", "plain,draft", "--sets", "heldout")
    floor = result["costs"]["floor"]
    target_bytes = sum(t.numel() * t.element_size() for t in
                       AutoModelForCausalLM.from_pretrained(str(saved_pair[0])).parameters())
    assert floor["weight_megabytes"] == pytest.approx(target_bytes / 1e6, abs=0.01)
    assert floor["floor_ms_per_token"] == pytest.approx(1e3 * target_bytes / (floor["read_gb_s"] * 1e9), rel=1e-2)
    rows = result["sets"]["heldout"]["methods"]
    for name in ("hf-generate", "plain"):  # time per token over the floor
        expected = 1e3 / rows[name]["tokens_per_second"] / floor["floor_ms_per_token"]
        assert rows[name]["times_floor"] == pytest.approx(expected, rel=1e-2)
    assert rows["draft"]["times_floor"] is None  # speculative rows are not one weight pass per token
    assert "bandwidth floor" in (out / "bench.md").read_text()


def test_memory_bandwidth_is_measured_not_assumed():
    from specdec_lab.bench_costs import memory_bandwidth

    small = memory_bandwidth(megabytes=8, trials=2)
    assert small["read_gb_s"] > 0.1 and small["copy_gb_s"] > 0.1 and small["megabytes"] == 8
