"""A batched KV cache whose rows hold different numbers of tokens: left padding, holes and per-row rollback.

At batch size 1, rolling the cache back after a rejection is a crop. In a batch each sequence keeps a different
number of its draft tokens, so the rows of one rectangular cache (B, heads, slots, dim) disagree about which
slots are real. `RaggedCache` keeps a (B, slots) mask `valid` next to the cache and never lets the model see an
invalid slot:

- the attention mask of a forward is `valid` followed by the new tokens' own mask, so left padding (prompts of
  different lengths) and the rejected drafts of a row are invisible to that row;
- position ids are per row: a token's position is the number of valid slots before it, so padding and holes do
  not shift anyone's positions;
- rolling back a row marks its rejected slots invalid (`keep`); columns that no row uses any more are cropped
  off the end, and when holes take up too much of the cache the rows are compacted (gathered, right-aligned),
  which is the batched form of a crop.

Rows that finish leave the batch (`select_rows`), so the forward shrinks with the batch.

Under a static `cache_plan` the cache is preallocated (`specdec_lab.cache`): a forward then attends over the whole
buffer through a 4-D mask (`valid`, the new tokens' causal mask, the unused tail hidden), crops only move its
length, and compaction gathers the rows in place. With compiling on, every forward after the prefill goes through
torch.compile; its shapes are (rows, tokens fed, slots), so a run compiles one graph per batch size and width fed
(the width is k + 1 for the target and 1 or 2 for a draft model at every step; the batch shrinks as rows finish).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from specdec_lab.cache import is_static, new_cache, truncate
from specdec_lab.forward import compiled_forward

# Compact once the slots no row needs (the cache's width minus its longest row) exceed both of these:
COMPACT_SLACK = 16  # slots
COMPACT_SHARE = 0.25  # of the width


class RaggedCache:
    """A model's `DynamicCache` for a batch of sequences, plus which slots of each row hold real tokens.

    model: the Hugging Face causal LM whose cache this is; batch: the number of rows.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        self.model = model
        self.cache: Cache = new_cache(model)
        device = next(model.parameters()).device
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self.limit = int(getattr(model.config, "max_position_embeddings", 1 << 30))

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) how many real tokens each row holds."""
        return self.valid.sum(1)

    def forward(self, tokens: torch.Tensor, new_valid: torch.Tensor, keep: int) -> torch.Tensor:
        """Run the model on `tokens` (B, q) after the cache; return the float logits of the last `keep` columns.

        new_valid: (B, q) which of the new tokens are real (False: left padding of a shorter row). Positions
        past the model's context are clamped: they only occur for tokens beyond a finished row's budget.
        """
        positions = (self.lengths[:, None] + new_valid.long().cumsum(1) - 1).clamp(0, self.limit - 1)
        mask = torch.cat([self.valid, new_valid], dim=1).long()
        static = is_static(self.cache)
        attention = self.static_mask(new_valid) if static else mask
        call = self.model
        if static and self.cache.compile and self.valid.shape[1] > 0:  # the prefill runs eager
            call = compiled_forward(self.model, self.cache.mode, (tuple(tokens.shape), attention.shape[-1], False))
            if self.cache.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
        out = call(input_ids=tokens, attention_mask=attention, position_ids=positions, cache=self.cache,
                   use_cache=True, logits_to_keep=keep)
        self.valid = mask.bool()
        return out.logits.float().clone() if static and self.cache.mode == "reduce-overhead" else out.logits.float()

    def static_mask(self, new_valid: torch.Tensor) -> torch.Tensor:
        """The (B, 1, q, slots) additive mask over a static cache: each new token sees its row's valid slots and
        the real new tokens up to itself; the unused tail of the buffer is hidden."""
        width, (rows, fed) = self.valid.shape[1], new_valid.shape
        slots = self.cache.layers[0].max_cache_len
        if width + fed > slots:
            raise RuntimeError(f"the static cache holds {slots} slots; {width} are in use and {fed} more were fed "
                               "(the run's plan sized it too short)")
        causal = torch.ones(fed, fed, dtype=torch.bool, device=new_valid.device).tril()
        allowed = torch.zeros(rows, fed, slots, dtype=torch.bool, device=new_valid.device)
        allowed[:, :, :width] = self.valid[:, None, :]
        allowed[:, :, width : width + fed] = new_valid[:, None, :] & causal
        dtype = self.model.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)[:, None]

    def keep(self, kept: torch.Tensor) -> None:
        """Roll rows back: slot j of row b stays only where `kept[b, j]` (B, slots) is True.

        Trailing columns that no row uses are cropped; rows are compacted when holes waste too much room.
        """
        self.valid = self.valid & kept
        used = self.valid.any(0).nonzero()
        width = int(used[-1]) + 1 if len(used) else 0
        if width < self.valid.shape[1]:
            self.cache.crop(width - self.valid.shape[1])
            self.valid = self.valid[:, :width]
        longest = int(self.lengths.max()) if len(self.valid) else 0
        if width - longest > COMPACT_SLACK and width - longest > COMPACT_SHARE * width:
            self.compact()

    def first(self, counts: torch.Tensor) -> None:
        """Roll every row back to its first `counts[b]` real tokens."""
        self.keep(self.valid.long().cumsum(1) <= counts[:, None])

    def compact(self) -> None:
        """Move each row's real slots to the right end of a cache as wide as the longest row (order kept)."""
        lengths = self.lengths
        width = int(lengths.max())
        # Destination of each real slot: right-aligned, in order; the source index of each destination slot.
        destination = width - lengths[:, None] + self.valid.long().cumsum(1) - 1
        source = torch.zeros(len(lengths), width, dtype=torch.long, device=self.valid.device)
        rows, slots = self.valid.nonzero(as_tuple=True)
        source[rows, destination[rows, slots]] = slots
        static = is_static(self.cache)
        for layer in self.cache.layers:
            index = source[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            if static:  # gather in place into the preallocated buffer, then move its length back
                layer.keys[:, :, :width] = layer.keys.gather(2, index)
                layer.values[:, :, :width] = layer.values.gather(2, index)
            else:
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)
        if static:
            truncate(self.cache, width)
        self.valid = torch.arange(width, device=lengths.device)[None, :] >= width - lengths[:, None]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (e.g. drop the sequences that finished)."""
        rows = rows.to(self.valid.device)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys.numel() > 0:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
