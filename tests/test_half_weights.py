"""Half-width weights: a float16 copy only where it is exact, used only inside compiled inference graphs of a few
tokens, and compiled decoding through it emits the eager tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import make_llama

from specdec_lab import DraftModelDrafter, generate
from specdec_lab.bench_costs import decode_floor
from specdec_lab.half_weights import HALF_ROWS, exactly_half, half_weight_bytes, store_half_weights


def half_exact_llama(seed: int = 5):
    """A tiny Llama whose fp32 weights are all float16 numbers, as the zoo's are once loaded."""
    model = make_llama(vocab_size=64, hidden_size=16, num_layers=2, seed=seed, logit_scale=4.0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
    return model


def linear_layers(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def test_exactly_half_tells_float16_numbers_apart():
    assert exactly_half(torch.tensor([0.5, -3.0, 1024.0, 2.0**-14]))
    assert not exactly_half(torch.tensor([0.5, 0.1]))  # 0.1 has more mantissa bits than float16 keeps
    assert not exactly_half(torch.tensor([1.0, 1e6]))  # past float16's range


def test_the_copy_is_stored_only_when_every_linear_weight_is_exact():
    model = half_exact_llama()
    assert store_half_weights(model) == len(linear_layers(model))
    assert all(m.weight_half.dtype == torch.float16 for m in linear_layers(model))
    assert "weight_half" not in "".join(model.state_dict())  # not saved with the model
    linear = sum(m.weight.numel() for m in linear_layers(model))
    everything = sum(p.numel() for p in model.parameters())
    assert half_weight_bytes(model) == 4 * everything - 2 * linear  # 2 bytes a linear weight, 4 for the rest

    fp32_model = half_exact_llama()
    with torch.no_grad():  # all but one weight exact: the model is still left alone
        fp32_model.lm_head.weight[0, 0] = 0.1
    assert store_half_weights(fp32_model) == 0
    assert not any(hasattr(m, "weight_half") for m in linear_layers(fp32_model))
    assert half_weight_bytes(fp32_model) is None


@pytest.mark.compile
def test_only_compiled_inference_graphs_of_few_tokens_read_the_copy():
    # Zeroing the float16 copy shows who reads it: the compiled graph of a few tokens does, eager calls, graphs
    # wider than HALF_ROWS and graphs under autograd do not.
    layer = torch.nn.Linear(16, 8, bias=True)
    with torch.no_grad():
        layer.weight.copy_(layer.weight.half().float())
    assert store_half_weights(layer) == 1
    narrow, wide = torch.randn(1, 3, 16), torch.randn(1, HALF_ROWS + 1, 16)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    with torch.inference_mode():
        expected_narrow, expected_wide = layer(narrow), layer(wide)
        torch.testing.assert_close(compiled(narrow), expected_narrow, rtol=0, atol=1e-6)
        layer.weight_half.zero_()
        torch.testing.assert_close(layer(narrow), expected_narrow, rtol=0, atol=0)  # eager: fp32 weights
        torch._dynamo.reset()
        torch.testing.assert_close(compiled(narrow), layer.bias.expand(1, 3, 8))  # only the bias is left
        torch.testing.assert_close(compiled(wide), expected_wide, rtol=0, atol=1e-6)
    torch.testing.assert_close(compiled(narrow), expected_narrow, rtol=0, atol=1e-6)  # autograd on: fp32


@pytest.mark.compile
def test_compiled_decoding_through_half_weights_emits_the_eager_tokens():
    model = half_exact_llama()
    for prompt in ([1, 5, 9], [7, 7, 2, 40, 3]):
        eager = generate(model, prompt, max_new_tokens=20).tokens
        assert generate(model, prompt, max_new_tokens=20, compile=True).tokens == eager
        speculative = generate(model, prompt, drafter=DraftModelDrafter(model, k=3), max_new_tokens=20, compile=True)
        assert speculative.tokens == eager
    assert all(hasattr(m, "weight_half") for m in linear_layers(model))  # the compiled run stored the copy


def test_the_bandwidth_floor_counts_the_bytes_compiled_forwards_read():
    bandwidth = {"read_gb_s": 10.0, "copy_gb_s": 8.0, "megabytes": 256, "trials": 5}
    model = half_exact_llama()
    floor = decode_floor(model, bandwidth)
    assert floor["half"]["weight_megabytes"] == pytest.approx(half_weight_bytes(model) / 1e6, abs=0.01)
    assert floor["half"]["floor_ms_per_token"] < floor["floor_ms_per_token"]
    assert "half" not in decode_floor(make_llama(seed=5), bandwidth)  # fp32 weights: no copy, one floor
