"""The batched verification contract shared by the torch reference and the Triton kernels.

A batch of B sequences verifies drafts of different lengths k_0, ..., k_{B-1} in one call, laid out flat as in
vLLM's v1 rejection sampler:

- `draft_tokens` (T,): every sequence's draft, one after the other (T = sum of k_b);
- `cu_num_draft` (B,): the inclusive cumulative draft counts, so sequence b owns draft positions
  [cu_num_draft[b - 1], cu_num_draft[b]) (0 for b = 0);
- target rows (T + B, V): each sequence has k_b + 1 target rows (one per draft token, then the row after the
  whole draft), so the row of sequence b's draft position j is cu_start[b] + b + j;
- draft rows (T, V): the processed q each draft token was drawn from (None: deterministic drafts, q = one-hot).

The random stream is explicit, so two implementations given the same randoms pick the same tokens:

- `uniforms` (T,): u for the accept test u < p(x) / q(x) of each draft token (written u * q(x) < p(x));
- `race` (B, V): positive weights 1 / E with E ~ Exp(1) i.i.d. Each sequence emits exactly one token that is not
  a draft token (the correction after the first rejection, or the bonus token), drawn from a distribution d as
  argmax_v d(v) * race[b, v]: the exponential race (Gumbel-max trick). argmin_v E_v / d(v) is distributed as
  d normalised, so d need not sum to 1 and no multinomial is materialised. Only products and comparisons touch
  the randoms, and those round identically everywhere, so the choice is bit-for-bit the same on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchVerdict:
    """The outcome of verifying a batch of drafts.

    accepted: (B,) how many leading draft tokens each sequence keeps; next_tokens: (B,) the token the target adds
    after them (the correction at the first rejection, or the bonus token when the whole draft was kept).
    """

    accepted: torch.Tensor
    next_tokens: torch.Tensor

    def emitted(self, draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor) -> list[list[int]]:
        """Per sequence, the tokens this step emits: its accepted draft tokens, then `next_tokens[b]`.

        draft_tokens / cu_num_draft: the flat drafts that were verified (see the module docstring).
        """
        starts = draft_starts(cu_num_draft).tolist()
        drafts, accepted, nexts = draft_tokens.tolist(), self.accepted.tolist(), self.next_tokens.tolist()
        return [drafts[s : s + a] + [n] for s, a, n in zip(starts, accepted, nexts, strict=True)]


@dataclass
class BatchRandoms:
    """The randoms one batched verification consumes (see the module docstring).

    uniforms: (T,) accept-test uniforms in [0, 1); race: (B, V) exponential-race weights 1 / Exp(1).
    """

    uniforms: torch.Tensor
    race: torch.Tensor


def draw_randoms(num_draft: int, batch: int, vocab: int, generator: torch.Generator | None,
                 device: torch.device | str = "cpu") -> BatchRandoms:
    """Draw the randoms of one batched verification from `generator`.

    num_draft: T, the total number of draft tokens; batch: B; vocab: V; generator: the run's random source (on
    `device`); device: where the tensors live.
    """
    uniforms = torch.rand(num_draft, generator=generator, device=device)
    exponentials = torch.empty(batch, vocab, device=device).exponential_(generator=generator)
    race = 1.0 / exponentials.clamp_min(torch.finfo(torch.float32).tiny)
    return BatchRandoms(uniforms, race)


def draft_starts(cu_num_draft: torch.Tensor) -> torch.Tensor:
    """(B,) the first flat draft position of each sequence (the exclusive cumulative counts)."""
    return torch.cat([cu_num_draft.new_zeros(1), cu_num_draft[:-1]])


def check_layout(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_rows: torch.Tensor,
                 draft_probs: torch.Tensor | None = None, randoms: BatchRandoms | None = None) -> None:
    """Raise a clear ValueError if the tensors do not follow the flat layout (see the module docstring)."""
    if draft_tokens.ndim != 1 or cu_num_draft.ndim != 1 or target_rows.ndim != 2:
        raise ValueError("draft_tokens and cu_num_draft must be 1-D and the target rows 2-D (rows, vocab); got shapes "
                         f"{tuple(draft_tokens.shape)}, {tuple(cu_num_draft.shape)}, {tuple(target_rows.shape)}")
    if draft_tokens.is_floating_point() or cu_num_draft.is_floating_point():
        raise ValueError("draft_tokens and cu_num_draft must be integer tensors")
    total, batch, vocab = len(draft_tokens), len(cu_num_draft), target_rows.shape[1]
    if batch == 0:
        raise ValueError("the batch is empty: cu_num_draft needs one entry per sequence")
    counts = cu_num_draft - draft_starts(cu_num_draft)
    if bool((counts < 0).any()) or int(cu_num_draft[-1]) != total:
        raise ValueError(f"cu_num_draft must be non-decreasing and end at len(draft_tokens) = {total}; "
                         f"got {cu_num_draft.tolist()[:8]}")
    if target_rows.shape[0] != total + batch:
        raise ValueError(f"expected {total} + {batch} target rows (one per draft token plus one per sequence), "
                         f"got {target_rows.shape[0]}")
    if total and not (0 <= int(draft_tokens.min()) and int(draft_tokens.max()) < vocab):
        raise ValueError(f"draft token ids must lie in [0, {vocab})")
    if draft_probs is not None and tuple(draft_probs.shape) != (total, vocab):
        raise ValueError(f"draft_probs must have shape ({total}, {vocab}), got {tuple(draft_probs.shape)}")
    if randoms is not None and (tuple(randoms.uniforms.shape) != (total,)
                                or tuple(randoms.race.shape) != (batch, vocab)):
        raise ValueError(f"randoms must hold uniforms of shape ({total},) and race weights of shape ({batch}, "
                         f"{vocab}); got {tuple(randoms.uniforms.shape)} and {tuple(randoms.race.shape)}")
