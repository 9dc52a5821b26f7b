"""Verification rules: given the drafted tokens and the target's distributions, what do we keep?

Chain rules (one candidate per position):

- `verify_greedy`: keep the longest prefix that matches the target's argmax, then emit the target's argmax.
- `verify_rejection`: the lossless rule of Leviathan et al. / Chen et al. Accept draft token x_i with
  probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a sample from the residual
  norm(max(0, p_i - q_i)); if every token is accepted, emit a bonus token sampled from p_k.
  A deterministic draft (n-gram lookup) is the special case q_i = one-hot(x_i).

Every rule returns a `Verdict`: how many draft tokens survived and the one extra token the target adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec_lab.sampling import sample


@dataclass
class Verdict:
    """The outcome of verifying one draft.

    accepted: number of leading draft tokens kept; next_token: the token the target adds after them (the
    correction at the first rejection, or the bonus token when all were kept); resampled: True when
    next_token replaces a rejected draft token, False when it is a bonus token.
    """

    accepted: int
    next_token: int
    resampled: bool


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy chain verification.

    draft_tokens: the k proposed ids; target_logits: the target's logits at the k + 1 positions (position i
    scores draft token i; position k gives the token after the whole draft).
    """
    best = target_logits.argmax(-1)
    k = len(draft_tokens)
    mismatches = (draft_tokens != best[:k]).nonzero()
    accepted = int(mismatches[0]) if len(mismatches) else k
    return Verdict(accepted, int(best[accepted]), resampled=accepted < k)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where the target wants more mass than the draft gave.

    Falls back to p when p and q coincide (the residual is then empty, and rejection had probability 0).
    """
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def verify_rejection(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Lossless rejection verification of a chain of k draft tokens.

    draft_tokens: the k proposed ids; target_probs: processed target distributions p at the k + 1 positions;
    draft_probs: processed draft distributions q at the k positions the draft tokens were sampled from, or
    None for a deterministic draft (q = one-hot of the proposed token); generator: source of randomness.
    """
    k = len(draft_tokens)
    positions = torch.arange(k, device=target_probs.device)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_tokens, target_probs.shape[-1]).to(target_probs.dtype)
    p_x = target_probs[positions, draft_tokens]
    q_x = draft_probs[positions, draft_tokens]
    u = torch.rand(k, generator=generator, device=target_probs.device)
    # u < p/q, written without the division so that q(x) = 0 never produces a NaN.
    rejected = (u * q_x >= p_x).nonzero()
    if len(rejected) == 0:
        return Verdict(k, int(sample(target_probs[k], generator)), resampled=False)
    n = int(rejected[0])
    residual = residual_distribution(target_probs[n], draft_probs[n])
    return Verdict(n, int(sample(residual, generator)), resampled=True)
