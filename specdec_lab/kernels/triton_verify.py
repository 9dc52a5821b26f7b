"""Triton kernels for batched verification: one program per sequence, the vocabulary scanned in blocks.

Same signatures and the same results as `specdec_lab.kernels.reference` (layout and random stream:
`specdec_lab.kernels.layout`). On a CUDA device they compile to GPU code; with `TRITON_INTERPRET=1` set before
this module is imported they run on CPU tensors through Triton's interpreter (how the test suite checks them).

Each program walks its own draft: the accept test is a scalar loop (drafts are short), written without
branches: `alive` stays 1 while every earlier token was kept. It then scans the one target row (and draft row)
that decides the extra token, keeping a running argmax of d(v) * race[v] over the vocabulary blocks for two
candidates d at once: the residual max(0, p - q) and p itself (used when the residual is empty, and as the
bonus distribution, where q is taken as 0). Ties go to the lowest index, as torch's argmax does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec_lab.kernels.layout import BatchVerdict

BLOCK_V = 1024  # vocabulary entries per block


@triton.jit
def _draft_span(cu_num_draft, b):
    """(first flat draft position, draft length) of sequence b."""
    start = tl.load(cu_num_draft + b - 1, mask=b > 0, other=0)
    end = tl.load(cu_num_draft + b)
    return start, end - start


@triton.jit
def residual_of(p, q):
    """max(0, p - q): where the target wants more mass than the draft gave."""
    return tl.maximum(p - q, 0.0)


@triton.jit
def _running_argmax(values, offsets, best, best_index):
    """Fold one block of scores into a running (max, first index of the max)."""
    block_best = tl.max(values, 0)
    block_index = tl.argmax(values, 0, tie_break_left=True) + offsets
    better = block_best > best
    return tl.where(better, block_best, best), tl.where(better, block_index, best_index)


@triton.jit
def greedy_verify_kernel(accepted_out, next_out, draft_tokens, cu_num_draft, target_logits, vocab,
                         BLOCK: tl.constexpr):
    b = tl.program_id(0)
    start, count = _draft_span(cu_num_draft, b)
    accepted = 0
    alive = 1
    next_token = 0
    for j in range(0, count + 1):
        row = target_logits + (start + b + j).to(tl.int64) * vocab
        best = -float("inf")
        best_index = 0
        for offset in range(0, vocab, BLOCK):
            index = offset + tl.arange(0, BLOCK)
            logits = tl.load(row + index, mask=index < vocab, other=-float("inf")).to(tl.float32)
            best, best_index = _running_argmax(logits, offset, best, best_index)
        # The first row not covered by an accepted token gives the target's next token.
        next_token = tl.where(alive == 1, best_index, next_token)
        is_draft = j < count
        drafted = tl.load(draft_tokens + start + j, mask=is_draft, other=-1)
        match = (is_draft & (drafted == best_index)).to(tl.int32)
        accepted += alive * match
        alive = alive * match
    tl.store(accepted_out + b, accepted)
    tl.store(next_out + b, next_token)


@triton.jit
def rejection_verify_kernel(accepted_out, next_out, draft_tokens, cu_num_draft, target_probs, draft_probs,
                            uniforms, race, vocab, HAS_DRAFT_PROBS: tl.constexpr, BLOCK: tl.constexpr,
                            RESIDUAL: tl.constexpr):
    b = tl.program_id(0)
    start, count = _draft_span(cu_num_draft, b)
    accepted = 0
    alive = 1
    for j in range(0, count):
        token = tl.load(draft_tokens + start + j)
        p_x = tl.load(target_probs + (start + b + j).to(tl.int64) * vocab + token)
        if HAS_DRAFT_PROBS:
            q_x = tl.load(draft_probs + (start + j).to(tl.int64) * vocab + token)
        else:
            q_x = 1.0
        u = tl.load(uniforms + start + j)
        keep = (u * q_x < p_x).to(tl.int32)
        accepted += alive * keep
        alive = alive * keep

    rejected = accepted < count
    p_row = target_probs + (start + b + accepted).to(tl.int64) * vocab
    q_row = draft_probs + (start + accepted).to(tl.int64) * vocab
    rejected_token = tl.load(draft_tokens + start + accepted, mask=rejected, other=-1)
    q_limit = tl.where(rejected, vocab, 0)  # the bonus row has no draft row: read no q there
    race_row = race + b.to(tl.int64) * vocab
    best_residual = -1.0
    residual_index = 0
    best_p = -1.0
    p_index = 0
    for offset in range(0, vocab, BLOCK):
        index = offset + tl.arange(0, BLOCK)
        inside = index < vocab
        p = tl.load(p_row + index, mask=inside, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(q_row + index, mask=index < q_limit, other=0.0)
        else:
            q = (index == rejected_token).to(tl.float32)  # one-hot; all zero for the bonus row
        weight = tl.load(race_row + index, mask=inside, other=0.0)
        residual_score = tl.where(inside, RESIDUAL(p, q) * weight, -1.0)
        p_score = tl.where(inside, p * weight, -1.0)
        best_residual, residual_index = _running_argmax(residual_score, offset, best_residual, residual_index)
        best_p, p_index = _running_argmax(p_score, offset, best_p, p_index)
    # The residual is empty only when p <= q everywhere (then a rejection had probability 0): fall back to p.
    tl.store(accepted_out + b, accepted)
    tl.store(next_out + b, tl.where(best_residual > 0.0, residual_index, p_index))


def _outputs(cu_num_draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch = len(cu_num_draft)
    return (torch.empty(batch, dtype=torch.int64, device=cu_num_draft.device),
            torch.empty(batch, dtype=torch.int64, device=cu_num_draft.device))


def greedy_verify(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_logits: torch.Tensor) -> BatchVerdict:
    """Greedy verification of a flat batch (same contract as `reference.greedy_verify`)."""
    accepted, next_tokens = _outputs(cu_num_draft)
    vocab = target_logits.shape[-1]
    greedy_verify_kernel[(len(cu_num_draft),)](
        accepted, next_tokens, draft_tokens.contiguous(), cu_num_draft.contiguous(), target_logits.contiguous(),
        vocab, BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)))
    return BatchVerdict(accepted, next_tokens)


def rejection_verify(draft_tokens: torch.Tensor, cu_num_draft: torch.Tensor, target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None, uniforms: torch.Tensor, race: torch.Tensor,
                     residual=residual_of) -> BatchVerdict:
    """Lossless rejection verification of a flat batch (same contract as `reference.rejection_verify`).

    residual: the `@triton.jit` function that turns (p, q) blocks into residual mass; only tests change it, to
    show that the statistical test catches a wrong residual.
    """
    accepted, next_tokens = _outputs(cu_num_draft)
    vocab = target_probs.shape[-1]
    has_q = draft_probs is not None
    rejection_verify_kernel[(len(cu_num_draft),)](
        accepted, next_tokens, draft_tokens.contiguous(), cu_num_draft.contiguous(), target_probs.contiguous(),
        draft_probs.contiguous() if has_q else target_probs, uniforms.contiguous(), race.contiguous(), vocab,
        HAS_DRAFT_PROBS=has_q, BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)), RESIDUAL=residual)
    return BatchVerdict(accepted, next_tokens)
