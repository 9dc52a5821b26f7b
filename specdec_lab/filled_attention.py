"""Attention over the filled part of a static cache, for compiled CPU forwards.

A static cache is preallocated to a run's whole length, and a compiled forward's attention sees all of it, the
unused tail hidden by the mask. Scaled dot-product attention still reads every slot: over the zoo target's
512-slot cache that is 16 MB of fp32 keys and values per forward, when a 128-token prompt has filled 200 of them.
The count of filled slots changes at every step, so it cannot be a shape of a compiled graph (each would be
compiled again); the C++ op `specdec::filled_attention` (`filled_attention.cpp`) reads it from the mask at run
time and attends over those slots only. The columns it cuts are hidden from every row, so their weights after
the softmax are exactly zero: the same attention, from fewer bytes.

`use_filled_attention(model)` registers it as a transformers attention implementation ("specdec_filled") and
sets the model to it; eager calls (and any call without a mask over the cache) keep transformers' SDPA path.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specdec_lab.cpu_kernels import kernels_loaded

NAME = "specdec_filled"


def filled_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function contract: (batch, queries, heads, head_dim) outputs, no weights.

    Inside a compiled inference graph with a 4-D mask over the whole cache, the op; else SDPA as before."""
    over_cache = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] == key.shape[2]
    if not (torch.compiler.is_compiling() and over_cache and dropout == 0.0 and not torch.is_grad_enabled()):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return torch.ops.specdec.filled_attention(query, key, value, attention_mask, scale), None


def use_filled_attention(model: torch.nn.Module) -> bool:
    """Switch `model` (a transformers model on SDPA, on the CPU) to `filled_attention_forward` where the C++
    kernels load; returns whether it was switched. Other models (custom heads, eager or flash attention) stay
    as they are."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation not in ("sdpa", NAME) or not hasattr(model, "set_attn_implementation"):
        return False
    if next(model.parameters()).device.type != "cpu" or not kernels_loaded():
        return False
    AttentionInterface.register(NAME, filled_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
