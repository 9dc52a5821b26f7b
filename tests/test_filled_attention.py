"""Attention over a static cache's filled slots: the op equals SDPA over the same mask and never reads the unused
tail, a model switches to it only where it applies, and compiled decoding through it emits the eager tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama

from specdec_lab import filled_attention, generate
from specdec_lab.cpu_kernels import kernels_loaded
from specdec_lab.filled_attention import NAME, use_filled_attention

HIDDEN = torch.finfo(torch.float32).min


def needs_kernels():
    if not kernels_loaded():
        pytest.skip("the C++ kernels need an x86 CPU with AVX2, FMA and F16C and a C++ compiler")


def cache_and_mask(rows: int, heads: int, kv_heads: int, filled: int, length: int = 40, seed: int = 0,
                   dim: int = 64):
    """Queries, a static cache of `length` slots whose slots past `filled` hold NaN (an op that read them
    would return NaN), and an additive mask: causal over the last `rows` filled slots, one of the earlier
    slots hidden from the first row (a tree's masks hide slots in the middle too)."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(1, rows, heads, dim, generator=g).transpose(1, 2)  # strided, as a projection hands it over
    key, value = (torch.full((1, kv_heads, length, dim), float("nan")) for _ in range(2))
    key[:, :, :filled] = torch.randn(1, kv_heads, filled, dim, generator=g)
    value[:, :, :filled] = torch.randn(1, kv_heads, filled, dim, generator=g)
    visible = torch.zeros(rows, length, dtype=torch.bool)
    past = filled - rows
    visible[:, :past] = True
    visible[:, past:filled] = torch.ones(rows, rows, dtype=torch.bool).tril()
    visible[0, 1] = False
    return query, key, value, visible


@pytest.mark.parametrize(("rows", "heads", "kv_heads", "filled", "dim", "scale"),
                         [(1, 4, 4, 23, 64, 0.125), (1, 4, 4, 8, 64, 0.125), (1, 8, 2, 5, 64, 0.125),
                          (3, 4, 4, 23, 64, 0.125), (12, 8, 2, 30, 64, 0.125), (6, 4, 4, 37, 40, 0.125),
                          (6, 4, 4, 37, 136, 0.125), (4, 4, 4, 19, 64, 3.0), (2, 4, 4, 9, 12, 0.125)])
def test_the_op_is_sdpa_over_the_filled_slots(rows, heads, kv_heads, filled, dim, scale):
    # One query and several, grouped heads, fill counts not a multiple of the four keys a pass reads, head
    # sizes that are not 64 (40 and 136: partial vectors of sums; 12: not whole vectors, torch's kernel), and a
    # large scale (softmax arguments down to about -100, where the vector exp must give 0 and keep the rest),
    # against float64 attention over the filled slots only.
    needs_kernels()
    query, key, value, visible = cache_and_mask(rows, heads, kv_heads, filled, dim=dim)
    additive = torch.zeros(visible.shape).masked_fill_(~visible, HIDDEN)[None, None]
    group = heads // kv_heads
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key[:, :, :filled].double().repeat_interleave(group, 1),
        value[:, :, :filled].double().repeat_interleave(group, 1), attn_mask=visible[None, None, :, :filled],
        scale=scale).transpose(1, 2)
    for mask in (additive, visible[None, None]):
        out = torch.ops.specdec.filled_attention(query, key, value, mask, scale)
        assert out.shape == (1, rows, heads, dim) and out.is_contiguous()
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_mask_per_head_is_read_head_by_head():
    # A mask with a row per head (each head hiding a different slot) against SDPA over the filled slots.
    needs_kernels()
    query, key, value, visible = cache_and_mask(1, 4, 4, 12)
    per_head = visible[None].repeat(4, 1, 1)
    for head in range(4):
        per_head[head, 0, 2 + head] = False
    additive = torch.zeros(per_head.shape).masked_fill_(~per_head, HIDDEN)[None]
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key[:, :, :12].double(), value[:, :, :12].double(), attn_mask=per_head[None, :, :, :12],
        scale=0.125).transpose(1, 2)
    out = torch.ops.specdec.filled_attention(query, key, value, additive, 0.125)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_the_op_names_what_is_wrong_with_its_inputs():
    needs_kernels()
    query, key, value, visible = cache_and_mask(1, 4, 4, 10)
    attention = torch.ops.specdec.filled_attention
    with pytest.raises(RuntimeError, match="one column per key"):
        attention(query, key, value, visible[None, None, :, :-1], 0.125)
    with pytest.raises(RuntimeError, match="fp32 .additive. or boolean"):
        attention(query, key, value, visible[None, None].double(), 0.125)
    with pytest.raises(RuntimeError, match="must be fp32"):
        attention(query.double(), key, value, visible[None, None], 0.125)
    with pytest.raises(RuntimeError, match="multiple of the key-value heads"):
        attention(query, key[:, :3], value[:, :3], visible[None, None], 0.125)


def test_only_sdpa_transformers_models_on_the_cpu_are_switched(monkeypatch):
    needs_kernels()
    model = make_llama(seed=1)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.inference_mode():
        before = model(tokens).logits
        assert use_filled_attention(model) and model.config._attn_implementation == NAME
        # Eager calls keep transformers' SDPA path: the same logits, bit for bit.
        assert torch.equal(model(tokens).logits, before)
    eager = make_llama(seed=1)
    eager.set_attn_implementation("eager")
    assert not use_filled_attention(eager) and eager.config._attn_implementation == "eager"
    monkeypatch.setattr(filled_attention, "kernels_loaded", lambda: False)
    unbuilt = make_llama(seed=1)
    assert not use_filled_attention(unbuilt) and unbuilt.config._attn_implementation == "sdpa"


@pytest.mark.compile
def test_compiled_decoding_through_filled_attention_emits_the_eager_tokens():
    # Caches of two lengths (256 and 512 slots: the prompt decides) filled to many different lengths, the
    # same graphs called again on the longer cache after the shorter one.
    needs_kernels()
    torch._dynamo.reset()
    model = make_llama(vocab_size=64, hidden_size=16, num_layers=2, seed=7, logit_scale=4.0, num_heads=2)
    prompts = [[1, 5, 9], list(range(1, 60)) * 4, [7, 7, 2]]
    for prompt in prompts:
        eager = generate(model, prompt, max_new_tokens=16).tokens
        assert generate(model, prompt, max_new_tokens=16, compile=True).tokens == eager
    assert model.config._attn_implementation == NAME
    lengths = {length for _, seen in model._specdec_compiled.values() for _, length, _ in seen}
    assert lengths == {256, 512}
