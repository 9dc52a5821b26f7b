"""Hidden checks of lab 1 (speculative sampling): each targets one classic mistake."""

from __future__ import annotations

import torch
from checks._common import close, distributions, require, total_variation


def reference_process(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scaled = logits / temperature
    if top_k is not None:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def process_logits_hidden(process_logits) -> None:
    """Temperature scaling, top-k masking and renormalisation, greedy rows, batched input."""
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    for temperature, top_k in [(0.5, None), (2.0, None), (1.0, 2), (0.7, 3), (0.0, None)]:
        expected = reference_process(logits, temperature, top_k)
        got = process_logits(logits.clone(), temperature, top_k)
        require(close(got, expected), f"process_logits(logits of shape (3, 7), temperature={temperature}, "
                                      f"top_k={top_k}) gives the wrong probabilities")


def reference_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    excess = (p - q).clamp(min=0)
    return excess / excess.sum() if excess.sum() > 0 else p


def residual_hidden(residual) -> None:
    """Clipped at zero, normalised, p - q (not q - p), and p itself when p == q."""
    p, q = distributions(2, 9, seed=11)
    got = residual(p.clone(), q.clone())
    require(isinstance(got, torch.Tensor) and bool((got >= 0).all()), "the residual has negative entries")
    require(abs(float(got.sum()) - 1) < 1e-5, f"the residual sums to {float(got.sum()):.4f}, not 1")
    require(close(got, reference_residual(p, q)), "the residual is not norm(max(0, p - q))")
    require(close(residual(p.clone(), p.clone()), p), "residual(p, p) should be p (the residual is empty)")


def accepted_count_hidden(accepted_count) -> None:
    """Accept with probability min(1, p/q) (not q/p), and stop at the first rejection."""
    p = torch.tensor([[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2], [0.1, 0.9], [0.5, 0.5]])
    # token 0 at row 0: p/q = 0.25 -> rejected by u = 0.5 (q/p = 4 would accept it)
    require(accepted_count(torch.tensor([0, 0, 0]), p, q, torch.tensor([0.5, 0.5, 0.5])) == 0,
            "a token with p(x)/q(x) = 0.25 was accepted with u = 0.5")
    # rows: p/q = 4 (always accepted), then p/q = 1/9 rejected by u = 0.5, then an acceptable one
    require(accepted_count(torch.tensor([1, 1, 0]), p, q, torch.tensor([0.9, 0.5, 0.1])) == 1,
            "wrong count when the second token is rejected (counting must stop at the first rejection)")
    require(accepted_count(torch.tensor([1, 0, 1]), p, q, torch.tensor([0.99, 0.99, 0.99])) == 3,
            "tokens with p(x) >= q(x) must always be accepted")


def verify_bonus_hidden(verify) -> None:
    """All drafted tokens accepted: exactly one bonus token, drawn from p[k] (not p[k - 1])."""
    vocab = 8
    for k in range(1, 5):
        draft = torch.arange(k) % vocab + 2
        rows = torch.nn.functional.one_hot(draft, vocab).float()
        p = torch.cat([rows, torch.nn.functional.one_hot(torch.tensor([7]), vocab).float()])
        out = verify(draft, p, rows.clone(), torch.Generator().manual_seed(k))
        require(list(out)[:k] == draft.tolist(), f"k={k}: a draft that matches p exactly was not fully accepted")
        require(len(out) == k + 1, f"k={k}: every draft token was accepted but {len(out)} tokens were emitted "
                                   f"(expected {k + 1})")
        require(int(out[k]) == 7, f"k={k}: the bonus token did not come from the target's distribution after "
                                  "the last drafted token")


def verify_rejection_hidden(verify) -> None:
    """After a rejection: one token from the residual at that position; the first token is distributed as p."""
    p = torch.tensor([[0.4, 0.3, 0.3, 0.0], [0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0]])
    q = torch.tensor([[0.4, 0.3, 0.3, 0.0], [0.5, 0.0, 0.5, 0.0]])
    # Row 0 always accepts; token 0 at row 1 has p = 0 and is always rejected; residual = one-hot(1).
    for seed in range(40):
        out = verify(torch.tensor([2, 0]), p, q, torch.Generator().manual_seed(seed))
        require(list(out) == [2, 1], f"after the rejection at position 1 the emitted tokens were {list(out)}, "
                                      "but the correction must be sampled from norm(max(0, p - q)) there")
    p0, q0 = distributions(2, 5, seed=5, sharpness=1.5)
    p_rows, q_rows = torch.stack([p0, p0]), q0[None]
    gen = torch.Generator().manual_seed(123)
    counts = torch.zeros(5)
    n = 3000
    for _ in range(n):
        x = torch.multinomial(q0, 1, generator=gen)
        counts[int(verify(x, p_rows, q_rows, gen)[0])] += 1
    distance = total_variation(counts / n, p0)
    require(distance < 0.05, f"the first emitted token is not distributed as p (total variation {distance:.3f})")


def histogram_hidden(first_token_histogram) -> None:
    """The student's own histogram converges to p."""
    p, q = distributions(2, 6, seed=21, sharpness=2.0)
    n = 4000
    counts = first_token_histogram(p.clone(), q.clone(), n, torch.Generator().manual_seed(7))
    require(isinstance(counts, torch.Tensor) and counts.shape == (6,) and int(counts.sum()) == n,
            "the histogram must count n draws over the vocabulary")
    distance = total_variation(counts.float() / n, p)
    require(distance < 0.05, f"your histogram does not match p (total variation {distance:.3f} over {n} draws)")
