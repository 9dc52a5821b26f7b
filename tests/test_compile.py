"""Compiled forwards (torch.compile over the static cache): the same tokens as eager decoding, a handful of graphs
per run (lengths bucketed), a message when compiling, and CUDA graphs chosen only on CUDA.

Compiling is slow on 2 cores (seconds per graph even for these tiny models, more when inductor's on-disk
cache is cold), so these tests compile one tiny model and few shapes; they carry the `compile` marker.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import make_llama

from specdec_lab import DraftModelDrafter, generate
from specdec_lab.cache import CachePlan, cache_plan, new_cache
from specdec_lab.decode import plan_for
from specdec_lab.forward import QUERY_BUCKETS, forward, query_bucket, unguarded_buffers


@pytest.fixture(scope="module")
def small_model():
    """The tiniest Llama that still has attention, MLP and two layers: cheap to compile."""
    return make_llama(vocab_size=64, hidden_size=16, num_layers=2, seed=3, logit_scale=4.0, num_heads=2)


def compiled_shapes(model) -> set:
    """The (tokens, cache length, hidden) shapes the model's compiled forward has been called with."""
    return set().union(*(seen for _, seen in model.__dict__.get("_specdec_compiled", {}).values()))


@pytest.mark.compile
def test_compiled_decoding_emits_the_eager_tokens_with_a_handful_of_graphs(small_model, capfd):
    prompts = [[1, 5, 9], [7, 7, 2, 40, 3]]
    for prompt in prompts:
        eager = generate(small_model, prompt, max_new_tokens=20).tokens
        assert generate(small_model, prompt, max_new_tokens=20, compile=True).tokens == eager
        # The model drafts for itself: every draft is accepted, so the draft forwards take 1 and 2 tokens, the
        # target's verification k + 1 = 4, and the end of the budget shortens the last drafts (padded up).
        speculative = generate(small_model, prompt, drafter=DraftModelDrafter(small_model, k=3), max_new_tokens=20,
                               compile=True)
        assert speculative.tokens == eager and speculative.stats.mean_accepted_tokens > 3
        sampled = [generate(small_model, prompt, drafter=DraftModelDrafter(small_model, k=3), max_new_tokens=12,
                            temperature=1.0, seed=len(prompt), cache=kind, compile=kind == "static").tokens
                   for kind in ("dynamic", "static")]
        assert sampled[0] == sampled[1]  # same logits up to rounding, same seeded draws
    shapes = compiled_shapes(small_model)
    # Decoding and verification take 1, 2 and 4 tokens; the prefills (3 and 5 prompt tokens, alone or with the
    # first draft riding along: 6 and 8) are compiled too, padded up to their buckets.
    prefills = {query_bucket(n) for prompt in prompts for n in (len(prompt), len(prompt) + 3)}
    assert {tokens for tokens, _, _ in shapes} <= {1, 2, 4} | prefills and len(shapes) <= 6, shapes
    messages = capfd.readouterr().err.count("specdec: compiling")
    assert messages == len(shapes)  # once per shape, not per call


@pytest.mark.compile
def test_cpu_graphs_are_called_directly_once_compiled(small_model):
    # On CPU each shape's graph is compiled ahead at its first call; a second run calls the graphs past dynamo,
    # so the profiler sees no dynamo cache lookup (the per-call cost this path removes) and the tokens stay.
    drafter = DraftModelDrafter(small_model, k=3)
    first = generate(small_model, [4, 8, 15], drafter=drafter, max_new_tokens=16, compile=True).tokens
    shapes = compiled_shapes(small_model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        again = generate(small_model, [4, 8, 15], drafter=drafter, max_new_tokens=16, compile=True).tokens
    events = {event.key for event in profile.key_averages()}
    assert again == first and compiled_shapes(small_model) == shapes
    assert not any("TorchDynamo Cache Lookup" in key or "Torch-Compiled Region" in key for key in events), events


@pytest.mark.compile
def test_a_long_prompt_is_prefilled_in_compiled_chunks(small_model):
    # 150 prompt tokens: two chunks of the widest bucket and a third of 22 (which reuses the widest graph,
    # padded), each a compiled forward after the chunks before it; EAGLE-style callers get every prompt row's
    # hidden states.
    prompt = [(7 * i) % 60 + 1 for i in range(150)]
    eager = generate(small_model, prompt, max_new_tokens=8).tokens
    assert generate(small_model, prompt, max_new_tokens=8, compile=True).tokens == eager
    widths = {tokens for tokens, _, _ in compiled_shapes(small_model)}
    assert QUERY_BUCKETS[-1] in widths
    # (The eager call first: transformers installs its hidden-state hooks at the first call that asks for them,
    # which a compiled graph cannot do, so until then such calls run eager.)
    with torch.inference_mode(), cache_plan(CachePlan("static", 256)):
        whole = forward(small_model, new_cache(small_model), torch.tensor(prompt), hidden=True)
    with torch.inference_mode(), cache_plan(CachePlan("static", 256, compile=True)):
        chunked = forward(small_model, new_cache(small_model), torch.tensor(prompt), hidden=True)
    assert (QUERY_BUCKETS[-1], 256, True) in compiled_shapes(small_model)
    assert chunked.logits.shape == whole.logits.shape == (1, 150, 64)
    torch.testing.assert_close(chunked.logits, whole.logits, rtol=1e-4, atol=1e-4)
    assert [h.shape for h in chunked.hidden_states] == [h.shape for h in whole.hidden_states]
    torch.testing.assert_close(chunked.hidden_states[-1], whole.hidden_states[-1], rtol=1e-4, atol=1e-4)


def test_query_lengths_are_bucketed():
    assert [query_bucket(n) for n in (1, 2, 3, 5, 7, 9, 33, 64)] == [1, 2, 4, 6, 8, 12, 48, 64]
    assert query_bucket(QUERY_BUCKETS[-1] + 1) == QUERY_BUCKETS[-1] + 1  # past the buckets: eager, unpadded
    assert all(a < b <= 1.5 * a + 1 for a, b in zip(QUERY_BUCKETS, QUERY_BUCKETS[1:], strict=False))


@pytest.mark.parametrize("device, mode", [("cpu", None), ("cuda", "reduce-overhead")])
def test_cuda_graphs_are_asked_for_on_cuda_only(device, mode):
    run = SimpleNamespace(prompt=[1, 2, 3], budget=10, device=torch.device(device))
    plan = plan_for(run, None, None, compile=True)
    assert plan.kind == "static" and plan.compile and plan.mode == mode
    eager = plan_for(run, None, None, compile=False)
    assert eager.mode is None and not eager.compile


def test_the_guard_filter_drops_only_the_tensor_checks_that_callers_fix():
    # The float16 copies and the cache's tensors lose their per-call tensor checks; the inputs that tell graphs
    # apart (tokens, mask, positions), the parameters and every other kind of guard keep theirs.
    def guard(name, kind="TENSOR_MATCH"):
        return SimpleNamespace(name=name, guard_type=kind)

    entries = [guard("kwargs['cache'].layers[0].keys"), guard("L['cache'].layers[3].cumulative_length"),
               guard("args[0]._modules['lm_head']._buffers['weight_packed']"),
               guard("L['self']._modules['q_proj']._buffers['weight_half']"),
               guard("kwargs['input_ids']"), guard("kwargs['attention_mask']"),
               guard("args[0]._modules['lm_head']._parameters['weight']"),
               guard("kwargs['cache'].layers[0].max_cache_len", "EQUALS_MATCH")]
    assert unguarded_buffers(entries) == [False] * 4 + [True] * 4
