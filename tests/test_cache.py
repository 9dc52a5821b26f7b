"""The KV cache: in-place appends must give exactly what transformers' own `DynamicCache` gives."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec_lab.cache import MIN_CAPACITY, GrowingLayer, cache_length, keep_positions, new_cache, truncate


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
