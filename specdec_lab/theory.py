"""The closed-form model of speculative decoding speed (Leviathan et al. 2023, section 3).

Assume every drafted token is accepted independently with the same probability alpha (the acceptance rate),
the drafter proposes gamma tokens per step, and one drafter step costs c times one target forward. Then:

- tokens per target forward (tau, the bonus token included)  E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)
- walltime speedup over target-only decoding                 S = E[tokens] / (gamma * c + 1)
- arithmetic operations per emitted token, over plain decoding (Theorem 3.11)
                                                              (gamma c_hat + gamma + 1) / E[tokens]

alpha (the per-token acceptance probability) is the expected overlap of the two distributions:
alpha = E_context[sum_x min(p(x), q(x))] = 1 - E[total variation distance(p, q)]. It is not the share of drafted
tokens that were accepted (accepted / drafted), which also counts the tokens drafted after a rejection.

Decoding one token reads every weight once, so a step's time has a floor set by memory bandwidth
(`weight_streaming_seconds`); that floor is what carries these formulas from the course's CPU to a large server.
These functions are the yardstick that lessons, widgets and the benchmark hold measured figures against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _check_alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or math.isnan(alpha) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (the per-token acceptance probability) must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_gamma(gamma: int) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
        raise ValueError(f"gamma (tokens drafted per step) must be a non-negative integer, got {gamma!r}")
    return gamma


def _check_cost(c: float) -> float:
    if not isinstance(c, (int, float)) or math.isnan(c) or c < 0:
        raise ValueError(f"c (cost of one draft step relative to one target forward) must be >= 0, got {c!r}")
    return float(c)


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per target forward, bonus/correction token included (tau).

    alpha: probability that a drafted token is accepted (independent per position), in [0, 1];
    gamma: tokens drafted per step (0 = plain autoregressive decoding, which gives exactly 1).
    Equals 1 + alpha + alpha^2 + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at alpha = 1.
    """
    alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_accepted_draft_tokens(alpha: float, gamma: int) -> float:
    """Expected number of *drafted* tokens kept per step (tau without the bonus token): E[tokens] - 1.

    alpha, gamma: as for `expected_tokens_per_step`.
    """
    return expected_tokens_per_step(alpha, gamma) - 1.0


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime speedup over target-only decoding (Leviathan et al., Theorem 3.8).

    alpha: acceptance rate in [0, 1]; gamma: tokens drafted per step; c: time of one draft step divided by
    the time of one target forward (0 = free drafts, e.g. n-gram lookup). One step costs gamma * c + 1 target
    forwards of time (verifying gamma + 1 positions is assumed to cost one forward: decoding is memory-bound)
    and emits `expected_tokens_per_step(alpha, gamma)` tokens.
    """
    c = _check_cost(c)
    return expected_tokens_per_step(alpha, gamma) / (gamma * c + 1.0)


def costed_speedup(alpha: float, gamma: int, c: float, verify_ratio: float) -> float:
    """`expected_speedup` without its free-verification assumption: one step costs gamma * c + r target
    forwards of time, where r = verify_ratio is the measured time of a forward over gamma + 1 tokens divided by
    one over a single token (1 on a device with idle compute; above 1 on a CPU, or once a compiled forward has
    shed the fixed cost that extra tokens used to share).
    """
    c = _check_cost(c)
    if not verify_ratio >= 1.0:
        raise ValueError(f"verify_ratio (a forward over gamma + 1 tokens / one over 1 token) must be >= 1, got "
                         f"{verify_ratio!r}")
    return expected_tokens_per_step(alpha, gamma) / (gamma * c + verify_ratio)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32) -> int:
    """The draft length in 0..max_gamma with the highest `expected_speedup` (0 means: do not speculate).

    alpha: acceptance rate; c: draft-to-target cost ratio; max_gamma: the largest draft length considered.
    """
    _check_gamma(max_gamma)
    return max(range(max_gamma + 1), key=lambda gamma: expected_speedup(alpha, gamma, c))


def alpha_from_tau(tau: float, gamma: int, tolerance: float = 1e-9) -> float:
    """The acceptance rate that makes `expected_tokens_per_step(alpha, gamma)` equal a measured tau.

    tau: measured mean tokens per target forward (bonus included), in [1, gamma + 1]; gamma: draft length
    used; tolerance: bisection precision. E[tokens] grows monotonically in alpha, so bisection finds it.
    """
    gamma = _check_gamma(gamma)
    if gamma == 0 or not 1.0 <= tau <= gamma + 1:
        raise ValueError(f"tau must lie in [1, gamma + 1] = [1, {gamma + 1}] with gamma >= 1, "
                         f"got tau={tau!r}, gamma={gamma!r}")
    low, high = 0.0, 1.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if expected_tokens_per_step(middle, gamma) < tau:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def acceptance_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Probability that rejection sampling accepts a token drawn from q when the target is p: sum_x min(p, q).

    p, q: probability vectors over the vocabulary (last dimension), any matching leading shape; the result
    has the leading shape. It equals 1 - total variation distance(p, q), so alpha is the average of it.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)


def speedup_grid(alphas: Sequence[float], gammas: Sequence[int], c: float) -> list[list[float]]:
    """`expected_speedup` on a grid: one row per gamma, one column per alpha (the layout of a heatmap/surface).

    alphas: acceptance rates; gammas: draft lengths; c: draft-to-target cost ratio.
    """
    return [[expected_speedup(alpha, gamma, c) for alpha in alphas] for gamma in gammas]


def _check_positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def speculative_step_seconds(gamma: int, draft_seconds: float, target_seconds: float) -> float:
    """Wall time of one speculative step: gamma draft forwards, then one target forward that verifies them all.

    gamma: tokens drafted per step; draft_seconds: one draft forward; target_seconds: one target forward
    (verifying gamma + 1 positions is taken to cost one forward, as in `expected_speedup`). The step emits up to
    gamma + 1 tokens; plain decoding needs gamma + 1 target forwards for as many.
    """
    gamma = _check_gamma(gamma)
    return gamma * _check_cost(draft_seconds) + _check_positive(target_seconds, "target_seconds")


def weight_streaming_seconds(parameters: float, bytes_per_parameter: float, bandwidth: float,
                             devices: int = 1) -> float:
    """The shortest time one plain decode step can take: every weight read once from memory.

    parameters: the model's weights (70e9 for a 70B model); bytes_per_parameter: 2 for fp16/bf16, 1 for fp8 or
    int8, 4 for fp32; bandwidth: one device's memory bandwidth in bytes/s; devices: devices the weights are split
    over (tensor parallelism: each reads its share, all at once). Ignores the KV cache, which adds its own bytes
    per sequence, and the time devices spend exchanging activations.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a positive integer, got {devices!r}")
    weight_bytes = _check_positive(parameters, "parameters") * _check_positive(bytes_per_parameter,
                                                                               "bytes_per_parameter")
    return weight_bytes / (_check_positive(bandwidth, "bandwidth") * devices)


def arithmetic_operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected arithmetic operations per emitted token, as a multiple of plain decoding's (Leviathan et al.,
    Theorem 3.11): (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).

    alpha: per-token acceptance probability; gamma: tokens drafted per step; c_hat: arithmetic operations of one
    draft token divided by those of one target token. Each step runs the target over gamma + 1 positions and the
    draft over gamma, and emits `expected_tokens_per_step(alpha, gamma)` tokens. Above 1: speculation buys time
    with extra arithmetic, which is free while the hardware waits on memory and costs time once it is busy.
    """
    c_hat = _check_cost(c_hat)
    return (gamma * c_hat + gamma + 1.0) / expected_tokens_per_step(alpha, gamma)
