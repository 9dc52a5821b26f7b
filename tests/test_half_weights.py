"""Half-width weights: a float16 copy only where it is exact, used only inside compiled inference graphs of a few
tokens, the C++ kernel that multiplies through it agrees with a float64 reference, and compiled decoding through
it (kernel or inductor's loop) emits the eager tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama

from specdec_lab import DraftModelDrafter, generate, half_weights
from specdec_lab.bench_costs import decode_floor
from specdec_lab.half_weights import (
    HALF_ROWS,
    KERNEL_ROWS,
    exactly_half,
    half_kernel,
    half_weight_bytes,
    pack_half,
    store_half_weights,
)


def half_exact_llama(seed: int = 5):
    """A tiny Llama whose fp32 weights are all float16 numbers, as the zoo's are once loaded."""
    model = make_llama(vocab_size=64, hidden_size=16, num_layers=2, seed=seed, logit_scale=4.0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
    return model


def linear_layers(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def half_copy(layer: torch.nn.Linear) -> torch.Tensor:
    """The float16 copy a layer's compiled forward reads: packed for the kernel, or as it is."""
    return layer.weight_packed if hasattr(layer, "weight_packed") else layer.weight_half


def needs_kernel():
    if not half_kernel():
        pytest.skip("the float16 kernel needs an x86 CPU with AVX2, FMA and F16C and a C++ compiler")


@pytest.fixture(params=["kernel", "inductor"])
def multiply(request, monkeypatch):
    """Each compiled path in turn: the C++ kernel (where this CPU can build it) and inductor's loop."""
    if request.param == "kernel":
        needs_kernel()
    else:
        monkeypatch.setattr(half_weights, "half_kernel", lambda: False)
    return request.param


@pytest.mark.parametrize(("out_features", "in_features", "rows"),
                         [(8, 16, 1), (100, 64, 3), (256, 20, 2), (48, 36, 13), (4096, 256, 1), (33, 704, 25)])
def test_the_kernel_computes_x_times_w_transposed_plus_bias(out_features, in_features, rows):
    # Widths not a multiple of 16 (the last block padded), depths not a multiple of the kernel's interleave,
    # and more rows than one pass of the kernel holds, against float64 products of the same float16 weights.
    needs_kernel()
    g = torch.Generator().manual_seed(out_features + rows)
    weight = torch.randn(out_features, in_features, generator=g).half()
    bias = torch.randn(out_features, generator=g)
    x = torch.randn(rows, in_features, generator=g)
    exact = x.double() @ weight.double().T
    half_linear = torch.ops.specdec.half_linear
    torch.testing.assert_close(half_linear(x, pack_half(weight), None, out_features).double(), exact,
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(half_linear(x, pack_half(weight), bias, out_features).double(),
                               exact + bias.double(), rtol=1e-5, atol=1e-4)
    strided = torch.randn(in_features, rows, generator=g).T  # a transposed view, as a graph may pass
    torch.testing.assert_close(half_linear(strided, pack_half(weight), None, out_features).double(),
                               strided.double() @ weight.double().T, rtol=1e-5, atol=1e-4)


def test_the_kernel_names_what_is_wrong_with_its_inputs():
    needs_kernel()
    weight, x = torch.randn(20, 8).half(), torch.randn(2, 8)
    half_linear = torch.ops.specdec.half_linear
    with pytest.raises(RuntimeError, match="x must be fp32"):
        half_linear(x.double(), pack_half(weight), None, 20)
    with pytest.raises(RuntimeError, match="pack_half's"):
        half_linear(x, weight, None, 20)  # not packed
    with pytest.raises(RuntimeError, match="pack_half's"):
        half_linear(torch.randn(2, 12), pack_half(weight), None, 20)  # in_features differ
    with pytest.raises(RuntimeError, match="bias must be fp32"):
        half_linear(x, pack_half(weight), torch.zeros(19), 20)


def test_exactly_half_tells_float16_numbers_apart():
    assert exactly_half(torch.tensor([0.5, -3.0, 1024.0, 2.0**-14]))
    assert not exactly_half(torch.tensor([0.5, 0.1]))  # 0.1 has more mantissa bits than float16 keeps
    assert not exactly_half(torch.tensor([1.0, 1e6]))  # past float16's range


def test_the_copy_is_stored_only_when_every_linear_weight_is_exact(multiply):
    model = half_exact_llama()
    assert store_half_weights(model) == len(linear_layers(model))
    for m in linear_layers(model):
        copy = half_copy(m)
        assert copy.dtype == torch.float16
        weights = copy if multiply == "inductor" else copy.transpose(1, 2).reshape(-1, m.in_features)
        assert torch.equal(weights[: m.out_features].float(), m.weight)  # the same values
    assert not any("weight_half" in k or "weight_packed" in k for k in model.state_dict())  # not saved
    linear = sum(m.weight.numel() for m in linear_layers(model))
    everything = sum(p.numel() for p in model.parameters())
    assert half_weight_bytes(model) == 4 * everything - 2 * linear  # 2 bytes a linear weight, 4 for the rest

    fp32_model = half_exact_llama()
    with torch.no_grad():  # all but one weight exact: the model is still left alone
        fp32_model.lm_head.weight[0, 0] = 0.1
    assert store_half_weights(fp32_model) == 0
    assert not any(hasattr(m, "weight_half") or hasattr(m, "weight_packed") for m in linear_layers(fp32_model))
    assert half_weight_bytes(fp32_model) is None


@pytest.mark.compile
def test_only_compiled_inference_graphs_of_few_tokens_read_the_copy(multiply):
    # Zeroing the float16 copy shows who reads it: the compiled graph of a few tokens does, eager calls, graphs
    # wider than the path's limit and graphs under autograd do not.
    torch._dynamo.reset()
    layer = torch.nn.Linear(16, 8, bias=True)
    with torch.no_grad():
        layer.weight.copy_(layer.weight.half().float())
    assert store_half_weights(layer) == 1
    limit = KERNEL_ROWS if multiply == "kernel" else HALF_ROWS
    narrow, wide = torch.randn(1, 3, 16), torch.randn(1, limit + 1, 16)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        expected_narrow, expected_wide = layer(narrow), layer(wide)
        torch.testing.assert_close(compiled(narrow), expected_narrow, rtol=0, atol=1e-6)
        half_copy(layer).zero_()
        torch.testing.assert_close(layer(narrow), expected_narrow, rtol=0, atol=0)  # eager: fp32 weights
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(narrow), layer.bias.expand(1, 3, 8))  # only the bias is left
        torch.testing.assert_close(compiled(wide), expected_wide, rtol=0, atol=1e-6)
    torch.testing.assert_close(compiled(narrow), expected_narrow, rtol=0, atol=1e-6)  # autograd on: fp32


@pytest.mark.compile
def test_compiled_decoding_through_half_weights_emits_the_eager_tokens(multiply):
    torch._dynamo.reset()
    model = half_exact_llama()
    for prompt in ([1, 5, 9], [7, 7, 2, 40, 3]):
        eager = generate(model, prompt, max_new_tokens=20).tokens
        assert generate(model, prompt, max_new_tokens=20, compile=True).tokens == eager
        speculative = generate(model, prompt, drafter=DraftModelDrafter(model, k=3), max_new_tokens=20, compile=True)
        assert speculative.tokens == eager
    stored = "weight_packed" if multiply == "kernel" else "weight_half"
    assert all(hasattr(m, stored) for m in linear_layers(model))  # the compiled run stored its copy


def test_the_bandwidth_floor_counts_the_bytes_compiled_forwards_read():
    bandwidth = {"read_gb_s": 10.0, "copy_gb_s": 8.0, "megabytes": 256, "trials": 5}
    model = half_exact_llama()
    floor = decode_floor(model, bandwidth)
    assert floor["half"]["weight_megabytes"] == pytest.approx(half_weight_bytes(model) / 1e6, abs=0.01)
    assert floor["half"]["floor_ms_per_token"] < floor["floor_ms_per_token"]
    assert "half" not in decode_floor(make_llama(seed=5), bandwidth)  # fp32 weights: no copy, one floor
