"""KV-cache bookkeeping on top of Hugging Face's `DynamicCache`.

Speculative decoding writes keys and values for every drafted token, then must forget the rejected ones
so that the cache holds exactly what plain decoding would have cached. In transformers 5.x,
`DynamicCache.crop` takes a negative count of tokens to remove; these helpers hide that.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty cache shaped for `model`."""
    return DynamicCache(config=model.config)


def cache_length(cache: DynamicCache) -> int:
    """Number of positions currently cached."""
    return cache.get_seq_length()


def truncate(cache: DynamicCache, length: int) -> None:
    """Roll the cache back to its first `length` positions (no-op if it is not longer)."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)


def keep_positions(cache: DynamicCache, start: int, kept: torch.Tensor) -> None:
    """Keep the first `start` positions plus the positions `start + kept` (in that order), drop the rest.

    Used after tree verification: the accepted root-to-leaf path is scattered over the tree's slots, and
    the next step must see it as a contiguous prefix, exactly as sequential decoding would have cached it.
    """
    index = torch.cat([torch.arange(start, device=kept.device), start + kept])
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.numel() > 0:
            layer.keys = layer.keys.index_select(-2, index.to(layer.keys.device))
            layer.values = layer.values.index_select(-2, index.to(layer.values.device))
