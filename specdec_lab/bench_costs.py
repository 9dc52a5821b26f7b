"""What one forward costs on this machine, measured the way the benchmark and the lessons need it.

`forward_costs` gives the figures of Leviathan et al.'s closed form: the target on 1 and on k + 1 tokens after a
cached prefix, the draft on 1 token, c = draft / target and the verification ratio. The cases are timed in turns
(`interleaved_forward_seconds`), so a slow patch of a shared machine hits them alike and their ratios stay fair.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

from specdec_lab.cache import new_cache, truncate

if TYPE_CHECKING:
    from specdec_lab.models import ModelPair


def median_forward_seconds(model, prefix: list[int], new_tokens: int, trials: int) -> float:
    """Median wall time of one forward of `new_tokens` tokens after a cached `prefix` (cache cropped back)."""
    return interleaved_forward_seconds([(model, new_tokens)], prefix, trials)[0]


def interleaved_forward_seconds(cases: list[tuple[torch.nn.Module, int]], prefix: list[int],
                                trials: int) -> list[float]:
    """For each (model, tokens) case, the median wall time of one forward of that many tokens after a cached
    `prefix` (the cache is cropped back after every trial). The cases take turns trial by trial, so a slow
    patch of a shared machine hits them alike and their ratios stay fair."""
    caches, feeds = [], []
    with torch.inference_mode():
        for model, new_tokens in cases:
            device = next(model.parameters()).device
            cache = new_cache(model)
            model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True, logits_to_keep=1)
            caches.append(cache)
            feeds.append(torch.tensor([prefix[-new_tokens:]], device=device))
        times: list[list[float]] = [[] for _ in cases]
        for _ in range(trials):
            for (model, new_tokens), cache, feed, spent in zip(cases, caches, feeds, times, strict=True):
                started = time.perf_counter()
                model(input_ids=feed, cache=cache, use_cache=True, logits_to_keep=new_tokens)
                spent.append(time.perf_counter() - started)
                truncate(cache, len(prefix))
    return [statistics.median(spent) for spent in times]


def forward_costs(pair: ModelPair, prefix: list[int], k: int, trials: int = 30) -> dict:
    """What one forward costs in this run: target on 1 and on k + 1 tokens, draft on 1 token, and the ratios.

    c = draft / target (1 token each) is the cost ratio of Leviathan et al.; verify_ratio = target on k + 1
    tokens / target on 1 token is what the closed form assumes to be 1. The three are timed in turns.
    """
    cases = [(pair.target, 1), (pair.target, k + 1)] + ([(pair.draft, 1)] if pair.draft is not None else [])
    seconds = interleaved_forward_seconds(cases, prefix, trials)
    target_1, target_k1 = seconds[:2]
    costs = {"prefix_tokens": len(prefix), "target_1_ms": target_1 * 1e3, "target_k1_ms": target_k1 * 1e3,
             "verify_ratio": target_k1 / target_1, "draft_1_ms": None, "c": None}
    if pair.draft is not None:
        costs.update(draft_1_ms=seconds[2] * 1e3, c=seconds[2] / target_1)
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in costs.items()}
