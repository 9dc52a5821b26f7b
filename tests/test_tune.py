"""The tuner: choosing settings from a cost curve (pure, on synthetic curves), and an end-to-end smoke run.

No timing is asserted: the synthetic curves stand in for a GPU (flat: verifying 64 tokens costs what one
costs) and a CPU (every token fed costs), and the choice must follow them.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_llama
from transformers import AutoTokenizer

import specdec_lab as sd
from specdec_lab.cli import main
from specdec_lab.drafters.eagle import EagleConfig, EagleHead
from specdec_lab.tune import (
    Candidate,
    CostCurve,
    chain_candidates,
    choose,
    load_profile,
    one_branch_tree,
    run_calibration,
    step_overhead,
    tune,
    tuned_settings,
)

SIZES = [1, 2, 4, 8, 16, 32, 64]


def curve(per_token_ms: float, base_ms: float = 5.0) -> CostCurve:
    seconds = [(base_ms + per_token_ms * (n - 1)) / 1e3 for n in SIZES]
    return CostCurve(SIZES, seconds, [s * 1.05 for s in seconds])


def trees() -> list[Candidate]:
    """Bigger trees accept more, with diminishing returns (the shape measured on the zoo)."""
    return [Candidate("eagle-tree", {"total_tokens": n}, tau, 0.5e-3 * depth, n + 1, "tree")
            for n, tau, depth in [(4, 2.2, 4), (8, 2.8, 4), (16, 3.4, 6), (32, 3.9, 6), (48, 4.1, 6)]]


def test_a_flat_curve_picks_the_biggest_tree_and_a_steep_one_a_small_tree():
    gpu = choose(trees(), curve(per_token_ms=0.0))["eagle-tree"]
    cpu = choose(trees(), curve(per_token_ms=0.5))["eagle-tree"]
    assert gpu.settings == {"total_tokens": 48}
    assert cpu.settings["total_tokens"] < 16
    assert gpu.predicted_tokens_per_second == pytest.approx(4.1 / (3e-3 + 5e-3 * 1.05))


def test_chain_tau_of_every_k_comes_from_one_run_at_the_longest_k():
    candidates = chain_candidates("eagle", [0, 1, 2, 3], drafted=12, draft_seconds=0.0012, k_max=3, setting="depth")
    assert [c.settings for c in candidates] == [{"depth": 1}, {"depth": 2}, {"depth": 3}]
    assert [c.tau for c in candidates] == pytest.approx([1.75, 2.25, 2.5])
    assert [c.draft_seconds for c in candidates] == pytest.approx([0.0001, 0.0002, 0.0003])
    assert [c.fed for c in candidates] == [2, 3, 4]
    # Expensive verification makes the shortest chain the fastest; free verification, the longest.
    assert choose(candidates, curve(per_token_ms=4.0))["eagle"].settings == {"depth": 1}
    assert choose(candidates, curve(per_token_ms=0.0))["eagle"].settings == {"depth": 3}
    with pytest.raises(ValueError, match="no steps"):
        chain_candidates("eagle", [], 0, 0.0, 3, "depth")


def test_each_run_pays_its_own_overhead_so_a_costly_tree_loses_to_the_chain():
    flat = curve(per_token_ms=0.0)  # 5 ms a forward, however many tokens are fed
    # 10 steps in 0.2 s: 40 ms of drafting and 130 ms inside the target's forwards (the prompt's included),
    # so 30 ms, 3 ms a step, were the loop's own.
    run = {"steps": 10, "total_seconds": 0.2, "draft_seconds": 0.04, "forward_seconds": 0.13}
    assert step_overhead(run) == pytest.approx(0.003)
    assert step_overhead({**run, "forward_seconds": 0.17}) == 0.0  # nothing outside: no overhead
    # The tree accepts more but its mask and gather cost 3 ms a step more than the chain's bookkeeping.
    chain = Candidate("eagle", {"depth": 5}, 3.2, 3.2e-3, 6, "chain", overhead_seconds=1e-3)
    tree = Candidate("eagle-tree", {"total_tokens": 8}, 3.6, 4.0e-3, 9, "tree", overhead_seconds=4e-3)
    best = choose([chain, tree], flat)
    assert best["eagle"].predicted_tokens_per_second > best["eagle-tree"].predicted_tokens_per_second
    shared = choose([Candidate(**{**chain.__dict__, "overhead_seconds": 1e-3}),
                     Candidate(**{**tree.__dict__, "overhead_seconds": 1e-3})], flat)
    assert shared["eagle-tree"].predicted_tokens_per_second > shared["eagle"].predicted_tokens_per_second


def test_the_cost_curve_interpolates_and_extrapolates_linearly():
    c = CostCurve([1, 4, 8], [1.0, 4.0, 6.0], [1.0, 5.0, 9.0])
    assert c.seconds(2) == pytest.approx(2.0) and c.seconds(6, "tree") == pytest.approx(7.0)
    assert c.seconds(12) == pytest.approx(8.0) and c.seconds(1, "tree") == 1.0
    with pytest.raises(ValueError, match="shape"):
        c.seconds(2, "star")


@pytest.fixture(scope="module")
def zoo_tokenizer_pair():
    tokenizer = AutoTokenizer.from_pretrained(str(sd.zoo_path() / "tokenizer"))
    target = make_llama(vocab_size=len(tokenizer), hidden_size=32, num_layers=2, seed=0, max_positions=1024,
                        logit_scale=4.0)
    draft = make_llama(vocab_size=len(tokenizer), hidden_size=16, num_layers=1, seed=1, max_positions=1024)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig.from_target(target)).attach(target).eval()
    return sd.ModelPair(target, draft, tokenizer), head


def test_tune_end_to_end_on_tiny_models_writes_a_profile_that_generate_uses(zoo_tokenizer_pair, tmp_path):
    pair, head = zoo_tokenizer_pair
    grid = {"total_tokens": (4, 8), "depth": (2, 4), "top_k": (2,)}
    profile = tune(pair, head, prompts=2, max_new_tokens=8, temperatures=(0.0, 1.0), threads=None, tree_grid=grid,
                   chain_k=3, trials=1, log=None)
    assert profile["device"]["cpu"] and profile["device"]["torch"]
    assert profile["cost_curve"]["tokens"][-1] == 64 and len(profile["cost_curve"]["tree_ms"]) == 12
    for key in ("greedy", "sampled"):
        entry = profile["choices"][key]
        assert set(entry["choice"]) == {"draft", "eagle", "eagle-tree"}
        best = max((c for c in entry["candidates"] if c["method"] == "eagle-tree"),
                   key=lambda c: c["predicted_tokens_per_second"])
        assert entry["choice"]["eagle-tree"] == best["settings"]
    assert "alpha" in profile["choices"]["sampled"]["choice"]["eagle-tree"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    # generate(..., tuned=) sets the drafter from the profile; greedy output is still plain decoding's.
    ids = pair.tokenizer("def f(x):", add_special_tokens=False)["input_ids"]
    drafter = sd.EagleDrafter(head, mode="tree")
    out = sd.generate(pair.target, ids, drafter=drafter, max_new_tokens=12, tuned=path)
    assert out.tokens == sd.generate(pair.target, ids, max_new_tokens=12).tokens
    chosen = tuned_settings(path, "eagle-tree", 0.0)
    assert (drafter.total_tokens, drafter.depth, drafter.top_k) == (chosen["total_tokens"], chosen["depth"],
                                                                    chosen["top_k"])
    draft_drafter = sd.DraftModelDrafter(pair.draft)
    sd.generate(pair.target, ids, drafter=draft_drafter, max_new_tokens=4, temperature=1.0, tuned=path)
    assert draft_drafter.k == profile["choices"]["sampled"]["choice"]["draft"]["k"]


def test_bad_profiles_and_requests_are_named(tmp_path, tiny_target, tiny_draft):
    with pytest.raises(FileNotFoundError, match="specdec tune"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="not a specdec tuner profile"):
        load_profile({"format": "something else"})
    profile = {"format": "specdec-tune/1", "choices": {"greedy": {"temperature": 0.0, "choice": {"draft": {"k": 3}}}}}
    assert tuned_settings(profile, "draft", 0.0) == {"k": 3}
    with pytest.raises(ValueError, match="no sampled choice"):
        tuned_settings(profile, "draft", 1.0)
    with pytest.raises(ValueError, match="no setting for 'eagle'"):
        tuned_settings(profile, "eagle", 0.0)
    with pytest.raises(ValueError, match="pass a drafter"):
        sd.generate(tiny_target, [1, 2], tuned=profile)
    with pytest.raises(ValueError, match="draft-model and EAGLE drafters only"):
        sd.generate(tiny_target, [1, 2], drafter=sd.PromptLookupDrafter(), tuned=profile)


def test_the_tune_command_writes_a_profile_the_other_commands_read(saved_models, tmp_path, capsys):
    out = tmp_path / "p.json"
    main(["tune", "--target", str(saved_models / "target"), "--draft", str(saved_models / "draft"), "--prompts", "1",
          "--max-new-tokens", "6", "--temperatures", "0", "--threads", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "tokens fed" in printed and "chose" in printed and "wrote" in printed
    profile = load_profile(out)
    k = profile["choices"]["greedy"]["choice"]["draft"]["k"]
    main(["generate", "def f(x):", "--method", "draft", "--target", str(saved_models / "target"), "--draft",
          str(saved_models / "draft"), "--max-new-tokens", "6", "--tuned", str(out)])
    printed = capsys.readouterr().out.split("---")[1].strip().splitlines()
    figures = dict((part.strip() for part in line.split(":", 1)) for line in printed)
    assert int(figures["drafted"]) <= k * int(figures["target_forwards"])  # at most the tuned k per step


def test_the_tree_method_can_fall_back_to_the_chain_it_contains():
    chain = chain_candidates("eagle", [2, 3, 1, 3], drafted=12, draft_seconds=0.003, k_max=3, setting="depth",
                             overhead_seconds=1e-3)
    bushy = Candidate("eagle-tree", {"total_tokens": 16, "depth": 4, "top_k": 4}, 5.0, 2e-3, 17, "tree", 1e-3)
    steep, flat = curve(per_token_ms=1.0), curve(per_token_ms=0.0)
    trees = [bushy] + [one_branch_tree(c, alpha=0.7) for c in chain]
    assert trees[-1].settings == {"total_tokens": 3, "depth": 3, "top_k": 1, "alpha": 0.7}
    assert choose(trees, steep)["eagle-tree"].settings["top_k"] == 1  # 16 fed tokens cost too much here
    assert choose(trees, flat)["eagle-tree"] is bushy
    best_chain = choose(chain, steep)["eagle"]
    assert choose(trees, steep)["eagle-tree"].predicted_tokens_per_second == best_chain.predicted_tokens_per_second


def test_compiled_calibration_times_only_runs_after_an_untimed_compiling_pass(monkeypatch):
    import specdec_lab.decode as decode
    from specdec_lab.stats import DecodeStats

    calls = []

    def fake_generate(target, ids, **settings):  # the first run of each prompt "compiles": 10 s of drafting
        compiling = ids not in calls
        calls.append(ids)
        stats = DecodeStats(accepted_per_step=[2], drafted=3, draft_seconds=10.0 if compiling else 0.001,
                            total_seconds=10.0 if compiling else 0.004)
        return decode.GenerationOutput([], stats, "max_new_tokens")

    monkeypatch.setattr(decode, "generate", fake_generate)
    prompts = [[1, 2], [3, 4]]
    compiled = run_calibration(None, prompts, lambda: None, 8, 0.0, compile=True)
    assert len(calls) == 4 and compiled["steps"] == 2
    assert compiled["draft_seconds"] == pytest.approx(0.002)
    calls.clear()
    eager = run_calibration(None, prompts, lambda: None, 8, 0.0, compile=False)
    assert len(calls) == 2 and eager["draft_seconds"] == pytest.approx(20.0)  # eager runs are timed at once
