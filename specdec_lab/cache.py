"""KV-cache bookkeeping on top of Hugging Face's `DynamicCache`.

Speculative decoding writes keys and values for every drafted token, then must forget the rejected ones
so that the cache holds exactly what plain decoding would have cached. In transformers 5.x,
`DynamicCache.crop` takes a negative count of tokens to remove; these helpers hide that.

`new_cache` also swaps transformers' `DynamicLayer` for `GrowingLayer`, which appends in place: the stock
layer concatenates, so every forward copies the whole cache, and speculative decoding, which forwards and
crops at every step, pays that copy on every step.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedConfig
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 64  # positions reserved by a layer's first append


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of a buffer with room to spare.

    An append writes only the new positions (the buffer doubles when it is full, so appends cost O(1)
    amortised); a crop only shortens the views, and the next append overwrites what was cut. If anything
    replaces `keys`/`values` with tensors of its own (a tree's path selection, beam reordering), the next
    append copies them back into the buffer. While autograd records (training), it falls back to
    concatenation: writing in place would corrupt tensors that the backward pass still needs.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            return super().update(key_states, value_states, *args, **kwargs)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        self._make_room(key_states, value_states, start, end)
        self.key_buffer[..., start:end, :] = key_states
        self.value_buffer[..., start:end, :] = value_states
        self.keys = self.key_buffer[..., :end, :]
        self.values = self.value_buffer[..., :end, :]
        return self.keys, self.values

    def _make_room(self, key_states: torch.Tensor, value_states: torch.Tensor, start: int, end: int) -> None:
        """Make the buffers hold the `start` cached positions, with room up to position `end`."""
        fits = (self.key_buffer is not None and self.key_buffer.shape[-2] >= end
                and self.key_buffer.shape[:-2] == key_states.shape[:-2])
        if fits and (start == 0 or is_prefix_view(self.keys, self.key_buffer)):
            return  # the views already lie at the start of the buffers: append in place
        cached_keys, cached_values = self.keys, self.values  # the `start` positions cached so far
        if not fits:
            capacity = max(2 * end, MIN_CAPACITY)
            self.key_buffer = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
            self.value_buffer = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if start:
            self.key_buffer[..., :start, :] = cached_keys
            self.value_buffer[..., :start, :] = cached_values


def is_prefix_view(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    """Whether `tensor` is `buffer[..., :n, :]` for some n (same first element, same strides)."""
    return tensor.data_ptr() == buffer.data_ptr() and tensor.stride() == buffer.stride()


def new_cache(model: torch.nn.Module | PreTrainedConfig) -> DynamicCache:
    """An empty cache shaped for `model` (a model or its config), with in-place appends on full-attention layers."""
    config = model if isinstance(model, PreTrainedConfig) else model.config
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


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
    Only the kept rows move (gathered, then written in place after the first `start`), so the cost follows the
    path's length, not the context's, and a `GrowingLayer` keeps appending in place afterwards.
    """
    rows = start + kept
    with torch.inference_mode():  # caches filled under inference mode may only be written in place under it
        for layer in cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys.numel() > 0:
                for tensor in (layer.keys, layer.values):
                    tensor[..., start : start + len(kept), :] = tensor.index_select(-2, rows.to(tensor.device))
    truncate(cache, start + len(kept))
