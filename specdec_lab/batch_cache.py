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
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec_lab.cache import new_cache

# Compact once the slots no row needs (the cache's width minus its longest row) exceed both of these:
COMPACT_SLACK = 16  # slots
COMPACT_SHARE = 0.25  # of the width


class RaggedCache:
    """A model's `DynamicCache` for a batch of sequences, plus which slots of each row hold real tokens.

    model: the Hugging Face causal LM whose cache this is; batch: the number of rows.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        self.model = model
        self.cache: DynamicCache = new_cache(model)
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
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=self.cache,
                         use_cache=True, logits_to_keep=keep)
        self.valid = mask.bool()
        return out.logits.float()

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
        for layer in self.cache.layers:
            index = source[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.valid = torch.arange(width, device=lengths.device)[None, :] >= width - lengths[:, None]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (e.g. drop the sequences that finished)."""
        rows = rows.to(self.valid.device)
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False) and layer.keys.numel() > 0:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
