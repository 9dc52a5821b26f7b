"""Weights kept at half width, arithmetic in fp32: how a compiled CPU forward reads half the bytes, losslessly.

A decode step reads every weight once, so on a CPU its time is the bytes of the weights over the memory
bandwidth (`bench_costs.decode_floor`). The zoo ships its weights in float16 and the engine computes in fp32, so
every fp32 weight it holds is a float16 number widened: storing the float16 copy and widening each weight as it
is loaded gives the same products in fp32 from half the bytes (the zoo target's 55.6 MB of fp32 weights become
27.8 MB, small enough to sit mostly in a 32 MB last-level cache). Only the order of the fp32 sums differs, as
between any two matrix-multiply kernels.

`store_half_weights` gives every `nn.Linear` of a model whose fp32 weights are all exactly float16 numbers a
float16 copy and a forward that, inside a compiled inference graph of a few tokens, multiplies through it. Where
the CPU allows (x86 with AVX2, FMA and F16C), the multiply is `half_matmul.cpp`, a small C++ kernel registered as
the custom op `specdec::half_linear`: it streams the copy, packed in blocks of 16 output columns, and keeps every
token's sums in vector registers, as a matrix multiply's micro-kernel does. Elsewhere it is written as one
broadcast product and sum per token, which inductor turns into a C++ loop that loads each float16 weight once,
widens it and multiplies it into every token's sum (slower, and only for a few tokens). Wider graphs (prefills,
large trees) keep the fp32 matrix multiply, as does every eager call. A model with any weight that float16
cannot hold exactly is left as it is: that would change the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec_lab.cpu_kernels import kernels_loaded

# Tokens per compiled forward up to which the float16 copy is used when the C++ kernel below is not available
# and inductor's loop multiplies through it instead: each token adds its own loads and multiply-adds for every
# weight (the zoo target's compiled forward took 3.6, 4.6 and 7.8 ms at 1, 4 and 8 tokens on a 2-core AMD
# EPYC), and the unrolled graph compiles slower with every token (32 tokens did not finish in 10 minutes).
HALF_ROWS = 8
# The same for the C++ kernel, which keeps blocks of sums in registers as a matrix multiply does: over the zoo
# target's 113 linear layers it took 2.4, 4.0, 4.8 and 9.4 ms for 1, 8, 12 and 32 rows where torch's fp32 matrix
# multiply took 3.4, 6.0, 9.0 and 16.8 ms (2-core Xeon, AVX-512), so it serves every width up to the largest
# bucket the engine compiles (`forward.QUERY_BUCKETS`).
KERNEL_ROWS = 64
BLOCK = 16  # output columns per packed block (the kernel's kBlock)


def half_kernel() -> bool:
    """Whether `torch.ops.specdec.half_linear` (half_matmul.cpp) is loaded (`cpu_kernels`: built on first use
    for this CPU). Where it cannot be, compiled forwards multiply through inductor's loop instead."""
    return kernels_loaded()


def pack_half(weight: torch.Tensor) -> torch.Tensor:
    """The (blocks, in_features, 16) float16 layout the kernel reads: output columns in blocks of 16 (the last
    padded with zeros), each block's weights k-major, so that a block is one contiguous stream.

    weight: (out_features, in_features), its values float16 numbers."""
    out_features, in_features = weight.shape
    blocks = -(-out_features // BLOCK)
    padded = weight.new_zeros(blocks * BLOCK, in_features, dtype=torch.float16)
    padded[:out_features] = weight
    return padded.view(blocks, BLOCK, in_features).transpose(1, 2).contiguous()


def exactly_half(weight: torch.Tensor) -> bool:
    """Whether every value of fp32 `weight` is a float16 number (finite), so a float16 copy loses nothing."""
    half = weight.to(torch.float16)
    return bool(torch.isfinite(half).all()) and torch.equal(half.to(weight.dtype), weight)


def half_linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module(x)`: through the float16 copy inside a compiled inference graph of at most KERNEL_ROWS tokens (the
    kernel) or HALF_ROWS (inductor's loop), all rows of a batch counted; else as usual (eager calls, training,
    wide graphs).

    x: (..., in_features) activations in fp32."""
    rows = x.numel() // x.shape[-1]
    packed = getattr(module, "weight_packed", None)
    limit = HALF_ROWS if packed is None else KERNEL_ROWS
    if not torch.compiler.is_compiling() or torch.is_grad_enabled() or rows > limit:
        return F.linear(x, module.weight, module.bias)
    flat = x.reshape(rows, x.shape[-1])
    if packed is not None:
        out = torch.ops.specdec.half_linear(flat, packed, module.bias, module.out_features)
        return out.reshape(*x.shape[:-1], module.out_features)
    weight = module.weight_half.to(x.dtype)  # widened as loaded: inductor fuses it into the loop below
    out = torch.cat([(flat[i : i + 1, None, :] * weight).sum(-1) for i in range(rows)])
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out if module.bias is None else out + module.bias


def half_exact_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The linear layers of `model` if all hold fp32 CPU weights that are float16 numbers, else none.

    All or none: a partial copy would still be lossless, but a model trained in fp32 gains nothing from the
    few layers that happen to fit."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32 for m in layers):
        return []
    with torch.inference_mode(False), torch.no_grad():
        return layers if all(exactly_half(m.weight) for m in layers) else []


def store_half_weights(model: torch.nn.Module) -> int:
    """Give every linear layer of `model` a float16 copy of its weights for its compiled forwards, if
    `half_exact_layers` allows; returns how many layers have one. The copy is a non-persistent buffer: packed
    for the kernel (`weight_packed`) where `half_kernel` is loaded, else as it is (`weight_half`).

    The copy is taken now: weights changed later (training) must be stored again."""
    layers = half_exact_layers(model)
    kernel = bool(layers) and half_kernel()
    with torch.inference_mode(False), torch.no_grad():
        for m in layers:
            half = m.weight.detach().to(torch.float16)
            if kernel:
                m.register_buffer("weight_packed", pack_half(half), persistent=False)
            else:
                m.register_buffer("weight_half", half, persistent=False)
            m.forward = half_linear_forward.__get__(m)
    return len(layers)


def half_weight_bytes(model: torch.nn.Module) -> int | None:
    """Bytes a compiled one-token forward of `model` reads from its weights when its linear layers read float16
    copies (a tied matrix counted once), or None when `half_exact_layers` finds none."""
    layers = half_exact_layers(model)
    if not layers:
        return None
    halved = {id(m.weight) for m in layers}
    return sum(p.nbytes // 2 if id(p) in halved else p.nbytes for p in model.parameters())
