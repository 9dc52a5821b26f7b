"""The KV cache: in-place appends must give exactly what transformers' own `DynamicCache` gives, and the static
(preallocated) cache the same logits and rows as the growing one."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specdec_lab.cache import (
    MIN_CAPACITY,
    MIN_STATIC_LENGTH,
    CachePlan,
    GrowingLayer,
    cache_length,
    cache_plan,
    is_static,
    keep_positions,
    new_cache,
    truncate,
)
from specdec_lab.forward import additive_mask_over, causal_mask_over
from specdec_lab.forward import forward as engine_forward


def forward(model, cache, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True).logits[0]


def test_new_cache_appends_in_place(tiny_target):
    cache = new_cache(tiny_target)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    forward(tiny_target, cache, [1, 2, 3])
    layer = cache.layers[0]
    buffer = layer.key_buffer
    assert buffer.shape[-2] == MIN_CAPACITY and layer.keys.data_ptr() == buffer.data_ptr()
    truncate(cache, 2)
    forward(tiny_target, cache, [4, 5])
    assert layer.key_buffer is buffer and cache_length(cache) == 4  # cropped, then appended, no new buffer


def test_appends_crops_and_path_selection_match_the_dynamic_cache(tiny_target):
    """A speculative-decoding-like history, long enough to grow the buffer twice."""
    generator = torch.Generator().manual_seed(0)
    ours, reference = new_cache(tiny_target), DynamicCache(config=tiny_target.config)
    for step in range(70):
        tokens = torch.randint(0, 64, (int(torch.randint(1, 8, (1,), generator=generator)),),
                               generator=generator).tolist()
        torch.testing.assert_close(forward(tiny_target, ours, tokens), forward(tiny_target, reference, tokens),
                                   atol=0, rtol=0)
        length = cache_length(reference)
        if step % 3 == 0:  # keep a scattered "accepted path" of the tokens just fed
            kept = torch.tensor(sorted({0, len(tokens) - 1}))
            for cache in (ours, reference):
                keep_positions(cache, length - len(tokens), kept)
        else:
            rejected = int(torch.randint(0, len(tokens), (1,), generator=generator))
            for cache in (ours, reference):
                truncate(cache, length - rejected)
        assert cache_length(ours) == cache_length(reference)
    assert cache_length(ours) > 2 * MIN_CAPACITY
    for mine, theirs in zip(ours.layers, reference.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=0, rtol=0)
        torch.testing.assert_close(mine.values, theirs.values, atol=0, rtol=0)


def test_training_through_the_cache_still_backpropagates(llama_factory):
    """With autograd recording, appends concatenate: writing in place would break the backward pass."""
    model = llama_factory(vocab_size=50, hidden_size=32, num_layers=2, seed=1)
    cache = new_cache(model)
    model(input_ids=torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)
    loss = model(input_ids=torch.tensor([[4, 5]]), cache=cache, use_cache=True).logits.sum()
    loss.backward()
    grad = model.model.layers[0].self_attn.k_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_the_static_cache_matches_the_growing_cache_through_forwards_crops_and_path_gathers(tiny_target):
    """The same speculative-decoding-like history over both kinds of cache (through `forward`, which masks the
    static cache's unused tail): the same logits, lengths and cached rows; rollbacks never move the buffer."""
    generator = torch.Generator().manual_seed(1)
    with cache_plan(CachePlan("static", length=200)):
        static = new_cache(tiny_target)
    growing = new_cache(tiny_target)
    assert is_static(static) and not is_static(growing) and static.layers[0].max_cache_len == MIN_STATIC_LENGTH
    buffers = None
    with torch.inference_mode():
        for step in range(40):
            fed = int(torch.randint(1, 8, (1,), generator=generator))
            tokens = torch.randint(0, 64, (fed,), generator=generator)
            tree = step % 4 == 3  # a tree-like visibility: every new token sees the first one and itself
            visible = (torch.eye(fed, dtype=torch.bool) | (torch.arange(fed) == 0)[None]) if tree else None
            past = cache_length(growing)
            positions = past + torch.tensor([0] + [1] * (fed - 1)) if tree else None
            outs = [engine_forward(tiny_target, cache, tokens, visible, positions) for cache in (static, growing)]
            torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=1e-5, rtol=1e-5)
            if buffers is None:
                buffers = [layer.keys.data_ptr() for layer in static.layers]
            if tree or step % 3 == 0:
                kept = torch.tensor(sorted({0, fed - 1}))
                for cache in (static, growing):
                    keep_positions(cache, past, kept)
            else:
                kept_length = past + int(torch.randint(0, fed + 1, (1,), generator=generator))
                for cache in (static, growing):
                    truncate(cache, kept_length)
            assert cache_length(static) == cache_length(growing)
    assert [layer.keys.data_ptr() for layer in static.layers] == buffers  # preallocated once, written in place
    length = cache_length(growing)
    for mine, theirs in zip(static.layers, growing.layers, strict=True):
        torch.testing.assert_close(mine.keys[..., :length, :], theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values[..., :length, :], theirs.values, atol=1e-5, rtol=1e-5)


def test_a_static_cache_too_short_for_a_forward_says_so(tiny_target):
    with cache_plan(CachePlan("static", length=1)):
        cache = new_cache(tiny_target)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="the static cache holds 256 positions"):
        engine_forward(tiny_target, cache, torch.zeros(300, dtype=torch.long))


@pytest.mark.parametrize(("rows", "past", "width"), [(1, 0, 8), (1, 5, 16), (6, 10, 32), (12, 0, 20)])
def test_the_causal_mask_is_the_general_mask_of_a_chain(rows, past, width):
    # The decode steps' three-operation mask against the general one with a lower-triangular visibility.
    chain = torch.ones(rows, rows, dtype=torch.bool).tril()
    expected = additive_mask_over(chain, past, width, torch.float32)
    assert torch.equal(causal_mask_over(rows, past, width, torch.float32, torch.device("cpu")), expected)
