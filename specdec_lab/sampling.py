"""Turning logits into the probability vectors that speculative decoding compares.

The same processing (temperature, then top-k, then top-p, in Hugging Face's order) must be applied to the
target's logits p and the drafter's logits q: the losslessness proof is about the *processed* distributions.
Temperature 0 means greedy: the distribution is one-hot at the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How to turn logits into a distribution.

    temperature: 0 for greedy, otherwise logits are divided by it; top_k: keep only the k most likely
    tokens (None = all); top_p: keep the smallest set of most likely tokens whose mass reaches top_p
    (None = all).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 and finite (0 means greedy), got {self.temperature!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float))
                                       or not 0 < self.top_p <= 1):  # also catches NaN
            raise ValueError(f"top_p must lie in (0, 1] or be None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: always take the most likely token."""
        return self.temperature == 0


def process_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Probability vectors (same shape as `logits`, last dim = vocabulary) under `config`.

    logits: raw model scores, any leading shape; config: the sampling settings shared by target and draft.
    """
    logits = logits.float()
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth_best = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # Drop a token once the more likely tokens already reach top_p; the top token always stays.
        drop_sorted = mass_before >= config.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token id per row of `probs` (shape (..., V)) using `generator` for reproducibility."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def draw(logits: torch.Tensor, config: SamplingConfig,
         generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token from one position's `logits`, as a drafter draws it: (token, q).

    Greedy: the argmax, and q is None (verification compares argmaxes and needs no q). Sampling: a draw from
    the processed distribution q, returned with q so the target can run the lossless rejection rule.
    """
    if config.greedy:
        return logits.argmax(), None
    q = process_logits(logits, config)
    return sample(q, generator), q


def confidence(logits: torch.Tensor, config: SamplingConfig) -> float:
    """A drafter's confidence in its next token: the largest probability of its distribution at one position.

    logits: the drafter's raw scores (V,); config: the run's sampling settings. When sampling, the processed
    q (what the token will be drawn from); when greedy, softmax(logits), since the processed q is one-hot
    there. Used to stop drafting early (adaptive draft length): the value depends on q alone, never on the
    target, so a stopping rule built on it leaves verification lossless.
    """
    probs = torch.softmax(logits.float(), -1) if config.greedy else process_logits(logits, config)
    return float(probs.max())


def sample_without_replacement(q: torch.Tensor, count: int,
                               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to `count` distinct tokens from `q` in order, each from q with the earlier ones removed.

    Gumbel-top-k: adding independent Gumbel(0, 1) noise to log q and taking the `count` largest entries
    gives the same ordered sample as drawing one token from q, removing it, renormalising and repeating
    (Kool et al. 2019; Vieira's "Gumbel-max trick"). The noise comes from `generator`, so runs are seeded.

    q: (V,) a processed distribution; count: how many tokens are wanted (capped at the number of tokens
    with q > 0: top-k / top-p may leave fewer); generator: the run's random source. Returns (tokens (m,),
    conditionals (m, V)): conditionals[r] is q with tokens[:r] removed and renormalised, the distribution
    token r was drawn from given its earlier siblings, which `verify.verify_tree_rejection` needs.
    """
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    count = min(count, int((q > 0).sum()))
    if count == 0:
        return torch.empty(0, dtype=torch.long, device=q.device), q.new_empty(0, q.shape[-1])
    uniform = torch.rand(q.shape, generator=generator, device=q.device, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-300)))  # clamp: u = 0 would give an infinite key
    keys = torch.where(q > 0, q.double().log() + gumbel, float("-inf"))
    tokens = keys.topk(count).indices
    removed = torch.zeros(count, q.shape[-1], device=q.device, dtype=q.dtype)
    removed[torch.arange(1, count, device=q.device), tokens[:-1]] = 1
    conditional = q * (1 - removed.cumsum(0))
    return tokens, conditional / conditional.sum(-1, keepdim=True)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A `torch.Generator` on `device` seeded with `seed`: every random draw in the engine goes through one."""
    return torch.Generator(device=device).manual_seed(seed)
