"""What one forward costs on this machine, measured the way the benchmark and the lessons need it.

`forward_costs` gives the figures of Leviathan et al.'s closed form: the target on 1 and on k + 1 tokens after a
cached prefix, the draft on 1 token, c = draft / target and the verification ratio. The cases are timed in turns
(`interleaved_forward_seconds`), so a slow patch of a shared machine hits them alike and their ratios stay fair.

`memory_bandwidth` and `decode_floor` give the other yardstick: a plain decode step reads every weight once, so
weights / bandwidth is the fastest it can be (gpt-fast's point: a loop far above that floor is paying for
overhead, not arithmetic).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch

from specdec_lab.cache import new_cache, truncate
from specdec_lab.half_weights import half_weight_bytes
from specdec_lab.theory import weight_streaming_seconds

if TYPE_CHECKING:
    from specdec_lab.models import ModelPair


BANDWIDTH_MEGABYTES = 256  # far larger than any CPU cache, so the figure is main memory's, not the caches'


def memory_bandwidth(megabytes: int = BANDWIDTH_MEGABYTES, trials: int = 5, device: str | torch.device = "cpu") -> dict:
    """This machine's memory bandwidth, STREAM-style: the best of `trials` of a copy (one read and one write of
    every byte) and of a sum (one read), of a `megabytes` fp32 tensor, in GB/s (1e9 bytes/s).

    The sum is the figure for decoding (weights are only read); the best trial, because a busy machine only ever
    makes a trial slower, never faster.
    """
    source = torch.ones(megabytes * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    nbytes = source.numel() * source.element_size()

    def best_seconds(operation) -> float:
        operation()  # first touch: page faults and lazy allocation are not bandwidth
        times = []
        for _ in range(trials):
            if source.is_cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            operation()
            if source.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        return min(times)

    copy_seconds = best_seconds(lambda: target.copy_(source))
    sum_seconds = best_seconds(lambda: source.sum())
    return {"megabytes": megabytes, "trials": trials, "copy_gb_s": round(2 * nbytes / copy_seconds / 1e9, 2),
            "read_gb_s": round(nbytes / sum_seconds / 1e9, 2)}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights (a tied embedding and output matrix counted once: it is read once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def decode_floor(model: torch.nn.Module, bandwidth: dict) -> dict:
    """The bandwidth floor of one plain decode step of `model`: its weight bytes over the measured read
    bandwidth (`memory_bandwidth`), in ms, and the tokens/s that floor allows. A model that fits in the CPU's
    last-level cache can beat it (its weights need not come from main memory every step). Where compiled
    forwards read float16 copies of the weights (`specdec_lab.half_weights`), the floor of those bytes too."""
    floor = {**streaming_floor(weight_bytes(model), bandwidth), **bandwidth}
    half = half_weight_bytes(model)
    if half is not None:
        floor["half"] = streaming_floor(half, bandwidth)
    return floor


def streaming_floor(nbytes: int, bandwidth: dict) -> dict:
    """Reading `nbytes` of weights at the measured read bandwidth: MB, ms per step and the tokens/s it allows."""
    floor_ms = 1e3 * weight_streaming_seconds(nbytes, 1, bandwidth["read_gb_s"] * 1e9)
    return {"weight_megabytes": round(nbytes / 1e6, 2), "floor_ms_per_token": round(floor_ms, 3),
            "floor_tokens_per_second": round(1e3 / floor_ms, 1)}


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
