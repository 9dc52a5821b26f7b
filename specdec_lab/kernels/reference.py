"""Batched verification in plain torch: the reference the Triton kernels must match, and the CPU path.

Same rules as `specdec_lab.verify` (greedy matching; the lossless rejection rule with its residual
norm(max(0, p - q)) and bonus token), vectorised over a flat batch of ragged drafts (layout and random stream:
`specdec_lab.kernels.layout`).
"""

from __future__ import annotations

import torch

from specdec_lab.kernels.layout import BatchVerdict, draft_starts


def _accepted_lengths(keep: torch.Tensor, cu_num_draft: torch.Tensor) -> torch.Tensor:
    """(B,) per sequence, the number of leading draft positions whose `keep` (T,) is True."""
    starts = draft_starts(cu_num_draft)
    counts = cu_num_draft - starts
    sequence = torch.repeat_interleave(torch.arange(len(counts), device=keep.device), counts)
    position = torch.arange(len(keep), device=keep.device) - starts[sequence]
    first_miss = counts.clone()  # no miss: the whole draft is kept
    return first_miss.scatter_reduce(0, sequence[~keep], position[~keep], reduce="amin")


def _target_rows_of_drafts(cu_num_draft: torch.Tensor, total: int) -> torch.Tensor:
    """(T,) the target row of each flat draft position (row = position + its sequence index)."""
    counts = cu_num_draft - draft_starts(cu_num_draft)
    return torch.arange(total, device=cu_num_draft.device) + torch.repeat_interleave(
        torch.arange(len(counts), device=cu_num_draft.device), counts)


def greedy_verify(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_logits: torch.Tensor) -> BatchVerdict:
    """Greedy verification of a flat batch: keep each draft's longest prefix that matches the target's argmax.

    draft_tokens: (T,) ids; cu_num_draft: (B,) inclusive cumulative draft counts; target_logits: (T + B, V).
    """
    best = target_logits.argmax(-1)
    rows = _target_rows_of_drafts(cu_num_draft, len(draft_tokens))
    accepted = _accepted_lengths(draft_tokens == best[rows], cu_num_draft)
    next_rows = draft_starts(cu_num_draft) + torch.arange(len(cu_num_draft), device=best.device) + accepted
    return BatchVerdict(accepted, best[next_rows])


def rejection_verify(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None, uniforms: torch.Tensor, race: torch.Tensor) -> BatchVerdict:
    """Lossless rejection verification of a flat batch (Leviathan et al.; Chen et al.).

    draft_tokens: (T,) ids; cu_num_draft: (B,) inclusive cumulative draft counts; target_probs: (T + B, V)
    processed p; draft_probs: (T, V) processed q, or None for deterministic drafts (q = one-hot); uniforms: (T,)
    accept-test uniforms; race: (B, V) exponential-race weights. Draft token x at a position is kept when
    u * q(x) < p(x); after the first rejection the correction is drawn from norm(max(0, p - q)) (from p when that
    is empty), and a fully kept draft earns a bonus token drawn from p at the row after it.
    """
    total, batch = len(draft_tokens), len(cu_num_draft)
    positions = torch.arange(total, device=draft_tokens.device)
    p_x = target_probs[_target_rows_of_drafts(cu_num_draft, total), draft_tokens]
    q_x = draft_probs[positions, draft_tokens] if draft_probs is not None else torch.ones_like(p_x)
    accepted = _accepted_lengths(uniforms * q_x < p_x, cu_num_draft)

    starts = draft_starts(cu_num_draft)
    p = target_probs[starts + torch.arange(batch, device=starts.device) + accepted]
    rejected = accepted < cu_num_draft - starts
    q_rows = (starts + accepted).clamp(max=max(total - 1, 0))
    if draft_probs is not None and total:
        q = draft_probs[q_rows]
    elif total:
        q = torch.nn.functional.one_hot(draft_tokens[q_rows], p.shape[-1]).to(p.dtype)
    else:
        q = torch.zeros_like(p)
    q = torch.where(rejected[:, None], q, torch.zeros_like(q))  # bonus token: nothing to subtract
    residual = (p - q).clamp(min=0)
    has_residual = residual.amax(-1) > 0
    distribution = torch.where(has_residual[:, None], residual, p)
    return BatchVerdict(accepted, (distribution * race).argmax(-1))
