"""Batched generation: per-sequence greedy equality with `generate`, per-sequence losslessness, bad input.

The batch holds prompts of different lengths (left padding), and sequences accept different numbers of draft
tokens at every step (per-row rollback in `RaggedCache`), stop at their own EOS or budget, and leave the batch.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_bigram_llama, make_llama
from test_decode import check_greedy_equal, exact_first_tokens, lossless_p_value

import specdec_lab.batch as batch_module
import specdec_lab.batch_cache as batch_cache
from specdec_lab import DraftModelDrafter, PromptLookupDrafter, generate, load_pair
from specdec_lab.batch import generate_batch
from specdec_lab.sampling import SamplingConfig

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def close_draft(tiny_target):
    """A draft that agrees with the tiny target about half the time: its LM head is the target's, perturbed."""
    draft = copy.deepcopy(tiny_target)
    with torch.no_grad():
        noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
        draft.lm_head.weight.add_(0.6 * noise * draft.lm_head.weight.std())
    return draft


@pytest.fixture(scope="module")
def plain_references(tiny_target, prompts):
    return [generate(tiny_target, p, max_new_tokens=NEW_TOKENS, eos_token_id=-1).tokens for p in prompts[:10]]


def assert_batch_matches(target, prompts, batch_tokens, references, label):
    for i, (prompt, tokens, reference) in enumerate(zip(prompts, batch_tokens, references, strict=True)):
        check_greedy_equal(target, prompt, tokens, reference, f"{label}, sequence {i}")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["plain", "draft model", "close draft", "draft = target"])
def test_greedy_batch_equals_per_sequence_generate(name, cache, tiny_target, tiny_draft, close_draft, prompts,
                                                   plain_references):
    drafter = {"plain": None, "draft model": DraftModelDrafter(tiny_draft, k=4),
               "close draft": DraftModelDrafter(close_draft, k=3), "draft = target": DraftModelDrafter(tiny_target, 4)}
    batch = prompts[:10]
    assert len({len(p) for p in batch}) >= 5  # prompts of different lengths
    out = generate_batch(tiny_target, batch, drafter=drafter[name], max_new_tokens=NEW_TOKENS, eos_token_id=-1,
                         cache=cache)
    assert_batch_matches(tiny_target, batch, out.tokens, plain_references, f"{name}, {cache} cache")
    assert out.stopped_by == ["max_new_tokens"] * len(batch)
    if name == "close draft":  # sequences really advanced by different amounts at the same step
        per_step = [s.accepted_per_step for s in out.stats]
        assert any(len({steps[j] for steps in per_step if j < len(steps)}) > 1 for j in range(3))
        assert 0.2 < sum(s.accepted for s in out.stats) / sum(s.drafted for s in out.stats) < 0.9
    if name == "draft = target":
        assert out.forwards == 4 and all(s.acceptance_rate == 1.0 for s in out.stats)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_compacting_the_cache_every_step_keeps_the_outputs(cache, tiny_target, close_draft, prompts, plain_references,
                                                           monkeypatch):
    monkeypatch.setattr(batch_cache, "COMPACT_SLACK", 0)
    monkeypatch.setattr(batch_cache, "COMPACT_SHARE", 0.0)
    compactions = []
    original = batch_cache.RaggedCache.compact
    monkeypatch.setattr(batch_cache.RaggedCache, "compact", lambda self: (compactions.append(1), original(self)))
    out = generate_batch(tiny_target, prompts[:10], drafter=DraftModelDrafter(close_draft, k=3),
                         max_new_tokens=NEW_TOKENS, eos_token_id=-1, cache=cache)
    assert len(compactions) > 5
    assert_batch_matches(tiny_target, prompts[:10], out.tokens, plain_references, "compacted")


def test_per_sequence_budgets_and_eos(tiny_target, close_draft, prompts, plain_references):
    budgets = [NEW_TOKENS, 7, 1, 0, 13, NEW_TOKENS, 3, NEW_TOKENS, 9, NEW_TOKENS]
    eos = plain_references[0][5]  # a token that some sequences emit
    out = generate_batch(tiny_target, prompts[:10], drafter=DraftModelDrafter(close_draft, k=3),
                         max_new_tokens=budgets, eos_token_id=eos)
    stops = []
    for prompt, budget, tokens, stopped in zip(prompts[:10], budgets, out.tokens, out.stopped_by, strict=True):
        single = generate(tiny_target, prompt, max_new_tokens=budget, eos_token_id=eos)
        assert tokens == single.tokens and stopped == single.stopped_by
        stops.append(stopped)
    assert "eos" in stops and "max_new_tokens" in stops and out.tokens[3] == []


def test_the_zoo_pair_batched_equals_generate():
    pair = load_pair()
    texts = ["def is_prime(n):\n", "import os\n", "class Stack:\n    def __init__(self):\n        self.items = []\n",
             "for i in range(10):\n", "    return", "# Copyright", "def main():\n    args = parse_args()\n",
             "with open(path) as f:\n", "x"]
    ids = [pair.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert len({len(i) for i in ids}) >= 5
    references = [generate(pair.target, p, max_new_tokens=16).tokens for p in ids]
    for drafter in (None, DraftModelDrafter(pair.draft, k=4)):
        out = generate_batch(pair.target, ids, drafter=drafter, max_new_tokens=16)
        assert_batch_matches(pair.target, ids, out.tokens, references, f"zoo, {drafter}")
    # Drafting in a batch accepts as often as drafting alone (same drafts, same verdicts).
    alone = [generate(pair.target, p, drafter=DraftModelDrafter(pair.draft, k=4), max_new_tokens=16).stats
             for p in ids]
    rate = sum(s.accepted for s in out.stats) / sum(s.drafted for s in out.stats)
    assert abs(rate - sum(s.accepted for s in alone) / sum(s.drafted for s in alone)) < 0.05


# --- Losslessness, per sequence ---------------------------------------------------------------------------------

VOCAB = 8
COPIES = 700


@pytest.fixture(scope="module")
def known_pair():
    """A bigram-like target and a sharpened, perturbed draft (as in test_decode), and two prompts."""
    generator = torch.Generator().manual_seed(2)
    target_logits = 1.5 * torch.randn(VOCAB, VOCAB, generator=generator)
    draft_logits = 4 * target_logits + torch.randn(VOCAB, VOCAB, generator=generator)
    return make_bigram_llama(target_logits), make_bigram_llama(draft_logits, seed=1), [list(range(VOCAB)) + [0], [3]]


def batched_first_tokens(target, draft, prompts, config: SamplingConfig, k: int,
                         cache: str | None = None) -> list[torch.Tensor]:
    """Per prompt, counts (V, V, V) of the first three new tokens over COPIES copies of it in ONE batch."""
    batch = [p for p in prompts for _ in range(COPIES)]
    out = generate_batch(target, batch, drafter=DraftModelDrafter(draft, k=k), max_new_tokens=3,
                         temperature=config.temperature, top_k=config.top_k, top_p=config.top_p, seed=5,
                         eos_token_id=-1, cache=cache)
    counts = [torch.zeros((VOCAB,) * 3) for _ in prompts]
    for i, tokens in enumerate(out.tokens):
        counts[i // COPIES][tuple(tokens)] += 1
    return counts


@pytest.mark.parametrize(("config", "k", "cache"), [(SamplingConfig(1.0), 1, "dynamic"),
                                                    (SamplingConfig(0.7, top_p=0.8), 2, "dynamic"),
                                                    (SamplingConfig(0.7, top_p=0.8), 2, "static")])
def test_each_sequence_of_a_sampled_batch_is_distributed_as_target_sampling(config, k, cache, known_pair, chi_square):
    target, draft, prompts = known_pair
    for prompt, counts in zip(prompts, batched_first_tokens(target, draft, prompts, config, k, cache), strict=True):
        p_value = lossless_p_value(counts, exact_first_tokens(target, prompt, config), chi_square)
        assert p_value > 1e-3, f"prompt {prompt}, {config}: p = {p_value:.3g}"


def test_the_batch_check_rejects_mixed_up_sequences(known_pair, chi_square, monkeypatch):
    """Control: a batching bug that verifies each sequence against another sequence's target rows (here the
    batch order reversed) must fail the test above."""
    real = batch_module.verify_batch

    def reversed_rows(tokens, cu, logits, *args, **kwargs):
        batch = len(cu)
        return real(tokens, cu, logits.reshape(batch, -1, logits.shape[-1]).flip(0).reshape(logits.shape), *args,
                    **kwargs)

    monkeypatch.setattr(batch_module, "verify_batch", reversed_rows)
    target, draft, prompts = known_pair
    config = SamplingConfig(1.0)
    counts = batched_first_tokens(target, draft, prompts, config, 1)[0]
    assert lossless_p_value(counts, exact_first_tokens(target, prompts[0], config), chi_square) < 1e-6


# --- Bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda t, d: generate_batch(t, [[1, 2], []]), "prompt 1: the prompt is empty"),
    (lambda t, d: generate_batch(t, []), "non-empty list of prompts"),
    (lambda t, d: generate_batch(t, [1, 2, 3]), "got a single list of ids"),
    (lambda t, d: generate_batch(t, [[1, 2], [1.5, 2.0]]), "prompt 1: input_ids must hold integer token ids"),
    (lambda t, d: generate_batch(t, [[1, 2], [3]], drafter=DraftModelDrafter(make_llama(vocab_size=32), k=2)),
     r"different vocabularies \(32 vs 64 tokens\)"),
    (lambda t, d: generate_batch(t, [[1, 2], [1] * 250], max_new_tokens=10),
     "prompt 1 has 250 tokens; with max_new_tokens=10 the sequence would exceed the model's context of 256"),
    (lambda t, d: generate_batch(t, [[1, 2], [3]], max_new_tokens=[4]), "max_new_tokens has 1 entries for 2"),
    (lambda t, d: generate_batch(t, [[1, 2], [3]], drafter=PromptLookupDrafter()), "DraftModelDrafter or none"),
    (lambda t, d: generate_batch(t, [[1, 2]], temperature=float("nan")), "temperature must be >= 0 and finite"),
    (lambda t, d: generate_batch(t, [[1, 2]], drafter=DraftModelDrafter(d, k=2, verification="block"),
                                 temperature=1.0), "generate_batch verifies token by token .* verification='block'"),
], ids=["empty prompt", "no prompts", "flat list", "float ids", "vocabularies differ", "exceeds the context",
        "budget count", "unsupported drafter", "NaN temperature", "block verification"])
def test_bad_batches_get_a_clear_error(call, message, tiny_target, tiny_draft):
    with pytest.raises(ValueError, match=message):
        call(tiny_target, tiny_draft)


# --- Measuring batches (the lesson's table and chart, the device check's step 4) -----------------------------------


def test_measure_batches_reports_both_methods_and_their_agreement(tiny_target, close_draft, prompts):
    from specdec_lab.batch_bench import format_table, measure_batches
    from specdec_lab.models import ModelPair

    points = measure_batches(ModelPair(tiny_target, close_draft, None), [1, 3], k=3, max_new_tokens=6, repeats=1,
                             prompts=prompts[:3], warmup=0)
    assert [p.batch for p in points] == [1, 3]
    assert all(p.same_as_plain == p.batch for p in points)  # fp32 greedy: every sequence equals plain decoding
    assert all(p.speedup == round(p.speculative_tokens_per_second / p.plain_tokens_per_second, 2) for p in points)
    assert all(1.0 <= p.tau <= 4.0 for p in points)
    assert format_table(points).splitlines()[3].startswith("| 3 |")
    with pytest.raises(ValueError, match="needs a pair with a draft model"):
        measure_batches(ModelPair(tiny_target, None, None), [1])


def test_vllms_rows_come_from_its_runs_on_our_prompts_and_count_its_outputs_equal_to_ours(monkeypatch):
    """vllm_points asks vLLM for plain and draft-model runs on exactly the prompts and batch sizes given, takes
    the speedup over vLLM's own plain run, and counts (greedy only) the sequences equal to our plain outputs."""
    from specdec_lab import vllm
    from specdec_lab.batch_bench import format_engine_table, vllm_points

    prompts = [[1, 2], [3, 4], [5, 6]]
    ours = {1: [[7, 7]], 3: [[7, 7], [8, 8], [9, 9]]}
    asked = []

    def fake_run_batches(method, batches, max_new_tokens, k, threads, temperature, repeats, given):
        asked.append((method, batches, given))
        rate, tau = (100.0, 1.0) if method == "plain" else (150.0, 2.5)
        wrong = [0, 0] if method == "draft" else [5, 5]  # draft differs on the second sequence, plain on the third
        outputs = {1: [[7, 7]], 3: [[7, 7], wrong if method == "draft" else [8, 8],
                                    [9, 9] if method == "draft" else wrong]}
        return {"points": [{"batch": b, "tokens_per_second": rate * b, "tau": tau, "outputs": outputs[b]}
                           for b in batches]}

    monkeypatch.setattr(vllm, "run_batches", fake_run_batches)
    points = vllm_points(prompts, [1, 3], ours, k=4, max_new_tokens=2, repeats=1)
    assert asked == [("plain", [1, 3], prompts), ("draft", [1, 3], prompts)]
    assert [(p.batch, p.speedup, p.tau) for p in points] == [(1, 1.5, 2.5), (3, 1.5, 2.5)]
    assert [(p.plain_same_as_ours, p.speculative_same_as_ours) for p in points] == [(1, 1), (2, 2)]
    assert format_engine_table("vLLM", points).splitlines()[3] == "| 3 | 300.0 | 450.0 | 1.50x | 2.50 | 2/3 | 2/3 |"
    sampled = vllm_points(prompts, [1], ours, temperature=1.0)
    assert sampled[0].plain_same_as_ours is None and format_engine_table("vLLM", sampled).endswith("| - | - |")


def test_verify_cost_times_both_forwards_and_restores_the_cache(tiny_target):
    from specdec_lab.batch_bench import verify_cost

    cost = verify_cost(tiny_target, batch=2, k=3, context=8, repeats=2)
    assert cost["batch"] == 2 and cost["one_token_ms"] > 0 and cost["k_plus_1_tokens_ms"] > 0
    assert cost["ratio"] == pytest.approx(cost["k_plus_1_tokens_ms"] / cost["one_token_ms"], abs=0.02)


def test_the_batch_chart_labels_each_speculative_point_with_its_speedup():
    from specdec_lab import viz

    fig = viz.batch_scaling([1, 2, 4], [10.0, 18.0, 30.0], [20.0, 27.0, 24.0])
    plain, speculative = fig.data
    assert list(plain.y) == [10.0, 18.0, 30.0] and list(speculative.text) == ["2.00x", "1.50x", "0.80x"]
    assert fig.layout.xaxis.type == "log"
