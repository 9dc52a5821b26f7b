"""Helpers shared by the hidden checks, bound to the original torch functions at import time."""

from __future__ import annotations

import torch

_allclose = torch.allclose
_isfinite = torch.isfinite


def require(condition: bool, message: str) -> None:
    """Fail the check with `message` unless `condition` holds (an explicit raise: `assert` can be optimised away)."""
    if not condition:
        raise AssertionError(message)


def close(actual, expected: torch.Tensor, atol: float = 1e-5) -> bool:
    """True when `actual` is a tensor of `expected`'s shape, finite, and equal to it within `atol`."""
    if not isinstance(actual, torch.Tensor) or tuple(actual.shape) != tuple(expected.shape):
        return False
    actual = actual.detach().float()
    return bool(_isfinite(actual).all()) and _allclose(actual, expected.float(), atol=atol, rtol=0)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation distance between two distributions over the same support."""
    return float((a.float() - b.float()).abs().sum() / 2)


def distributions(rows: int, vocab: int, seed: int, sharpness: float = 2.0) -> torch.Tensor:
    """Seeded random probability vectors (rows, vocab)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(rows, vocab, generator=gen), dim=-1)
