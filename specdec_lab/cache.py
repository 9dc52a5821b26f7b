"""KV-cache bookkeeping on top of Hugging Face's `DynamicCache`.

Speculative decoding writes keys and values for every drafted token, then must forget the rejected ones
so that the cache holds exactly what plain decoding would have cached. In transformers 5.x,
`DynamicCache.crop` takes a negative count of tokens to remove; these helpers hide that.

`new_cache` also swaps transformers' `DynamicLayer` for `GrowingLayer`, which appends in place: the stock
layer concatenates, so every forward copies the whole cache, and speculative decoding, which forwards and
crops at every step, pays that copy on every step.

A static cache (gpt-fast's lesson) is the other kind: transformers' `StaticCache`, preallocated to the run's
length, whose every forward attends over the whole buffer (the unused tail masked), so shapes never change and
a compiled forward can be reused step after step. A rollback only moves its length back (`crop`), and a tree's
accepted path is gathered in place, as for the growing cache. A run chooses the kind with `cache_plan`; every
`new_cache` made inside it (the target's and the drafters') follows the plan.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedConfig, StaticCache
from transformers.cache_utils import Cache, DynamicLayer

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


CACHE_KINDS = ("dynamic", "static")
MIN_STATIC_LENGTH = 256  # static caches are sized in powers of two from here, so runs share compiled graphs


@dataclass(frozen=True)
class CachePlan:
    """How the caches of one run are kept.

    kind: "dynamic" (a growing cache, the default) or "static" (preallocated, fixed shapes); length: the most
    positions one static cache must hold (prompt + budget + the room a step's draft needs); compile: whether
    forwards over a static cache go through `torch.compile` (see `specdec_lab.forward`); mode: torch.compile's
    mode (None: its default; "reduce-overhead" captures CUDA graphs on CUDA).
    """

    kind: str = "dynamic"
    length: int = 0
    compile: bool = False
    mode: str | None = None

    def __post_init__(self):
        if self.kind not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {self.kind!r}")
        if self.compile and self.kind != "static":
            raise ValueError("compiled forwards need the static cache (cache='static'): a growing cache changes "
                             "shape at every step")

    @property
    def static_length(self) -> int:
        """The preallocated length: `length` rounded up to a power of two (at least MIN_STATIC_LENGTH)."""
        size = MIN_STATIC_LENGTH
        while size < self.length:
            size *= 2
        return size


DEFAULT_PLAN = CachePlan()
_PLAN: contextvars.ContextVar[CachePlan | None] = contextvars.ContextVar("specdec_cache_plan", default=None)


@contextlib.contextmanager
def cache_plan(plan: CachePlan) -> Iterator[CachePlan]:
    """Within the block, `new_cache` makes the kind of cache `plan` says (the decode loops set it per run)."""
    token = _PLAN.set(plan)
    try:
        yield plan
    finally:
        _PLAN.reset(token)


def current_plan() -> CachePlan:
    """The cache plan in force (the default: growing caches, eager forwards)."""
    return _PLAN.get() or DEFAULT_PLAN


class RunStaticCache(StaticCache):
    """transformers' `StaticCache`, labelled with how forwards over it run (`compile`, `mode`)."""

    def __init__(self, config: PreTrainedConfig, max_cache_len: int, compile: bool = False,
                 mode: str | None = None):
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.compile = compile
        self.mode = mode


def new_cache(model: torch.nn.Module | PreTrainedConfig, allow_static: bool = True) -> Cache:
    """An empty cache shaped for `model` (a model or its config), of the kind the current `cache_plan` says.

    Dynamic (the default): in-place appends on full-attention layers. Static: preallocated to the plan's
    length. allow_static: False for callers whose forwards build their own masks over the cached length only
    (they always get a dynamic cache).
    """
    config = model if isinstance(model, PreTrainedConfig) else model.config
    plan = current_plan()
    if plan.kind == "static" and allow_static:
        return RunStaticCache(config, plan.static_length, plan.compile, plan.mode)
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def is_static(cache: Cache) -> bool:
    """Whether `cache` is preallocated (its forwards attend over the whole buffer)."""
    return isinstance(cache, StaticCache)


def cache_length(cache: Cache) -> int:
    """Number of positions currently cached."""
    return int(cache.get_seq_length())


def truncate(cache: Cache, length: int) -> None:
    """Roll the cache back to its first `length` positions (no-op if it is not longer); a static cache only
    moves its length back (the next forward overwrites the rows that were cut)."""
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)


def keep_positions(cache: Cache, start: int, kept: torch.Tensor) -> None:
    """Keep the first `start` positions plus the positions `start + kept` (in that order), drop the rest.

    Used after tree verification: the accepted root-to-leaf path is scattered over the tree's slots, and
    the next step must see it as a contiguous prefix, exactly as sequential decoding would have cached it.
    Only the kept rows move (gathered, then written in place after the first `start`), so the cost follows the
    path's length, not the context's, and a `GrowingLayer` keeps appending in place afterwards (a static
    layer's `keys` is its whole buffer: the same in-place gather, then its length moves back).
    """
    rows = start + kept
    with torch.inference_mode():  # caches filled under inference mode may only be written in place under it
        for layer in cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys.numel() > 0:
                for tensor in (layer.keys, layer.values):
                    tensor[..., start : start + len(kept), :] = tensor.index_select(-2, rows.to(tensor.device))
    truncate(cache, start + len(kept))
