"""What the production engines the course runs beside ours (llama.cpp, vLLM) have in common.

Each engine is built or installed once into a cache outside the repository (`cache_root()`), runs on the zoo
pair, is compared with our decoding on the same token ids, and reports its speculation as drafted and accepted
tokens. This module holds those shared pieces: where the caches live, the "not built here" error, the course's
tau and acceptance from an engine's counters, the bench's guard for rows that need the zoo pair, the
tokenisation check and the token-by-token agreement of two greedy outputs.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path


class EngineUnavailable(RuntimeError):
    """An external engine is not built or installed here; the message says why and what to run."""


def cache_root() -> Path:
    """The cache shared by every checkout: `$SPECDEC_CACHE`, by default `~/.cache/specdec-lab`."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec-lab"))


def engine_forwards(new_tokens: int, accepted: int, drafts: int = 0, sequences: int = 1) -> int:
    """Target forwards behind an engine's counters, summed over its sequences.

    Each sequence's prefill emits one token and each verification step its accepted drafts plus one token of the
    target's own, so the target ran new_tokens - accepted times; it also ran once per draft (a verification)
    and once per sequence (its prefill). Either count alone can fall short: an engine that drafts k tokens at a
    sequence's last step counts the drafts accepted past the token limit (vLLM does: its output stops at
    max_tokens, its accepted counter does not), and a step that had no draft (an n-gram miss) is no draft. Both
    are lower bounds, so the larger is the closer (exact where only one of the two happens). drafts: 0 when the
    engine does not count them.
    """
    return max(1, new_tokens - accepted, drafts + sequences if drafts else 0)


def course_tau(new_tokens: int, accepted: int, drafts: int = 0, sequences: int = 1) -> float:
    """tau, tokens per target forward, from an engine's counters (see `engine_forwards`). Autoregressive
    decoding gives 1.0."""
    return new_tokens / engine_forwards(new_tokens, accepted, drafts, sequences)


def acceptance(drafted: int, accepted: int) -> float:
    """Share of drafted tokens the target kept (0 when nothing was drafted)."""
    return accepted / drafted if drafted else 0.0


def engine_stats(new_tokens: int, drafted: int = 0, accepted: int = 0, steps: int = 0,
                 accepted_per_position: Sequence[int] = (), fixed_length: int | None = None, sequences: int = 1):
    """An engine's counters as our `DecodeStats` (tau and acceptance as the course defines them).

    new_tokens: tokens emitted; drafted / accepted: draft tokens proposed and kept; steps: verification steps
    that had a draft; accepted_per_position: how often draft position i (0 = the first drafted token) was kept;
    fixed_length: the draft length when every step drafts exactly that many tokens (then each position was
    proposed `steps` times; None leaves the per-position proposal counts unknown); sequences: how many
    sequences the counters sum over (each had a prefill).
    """
    from specdec_lab.stats import DecodeStats

    stats = DecodeStats(target_forwards=engine_forwards(new_tokens, accepted, steps, sequences), drafted=drafted,
                        accepted=accepted, new_tokens=new_tokens)
    stats.accepted_at = Counter({i: int(n) for i, n in enumerate(accepted_per_position)})
    if fixed_length is not None and steps:
        stats.drafted_at = Counter({i: steps for i in range(fixed_length)})
        # Position i is reached when every earlier one was kept: position 0 always, i + 1 when i was kept.
        stats.reached_at = Counter({0: steps, **{i + 1: int(n) for i, n in enumerate(accepted_per_position)
                                                 if i + 1 < fixed_length}})
    return stats


def require_zoo_pair(context, engine: str, greedy_only: bool = False) -> None:
    """Raise the bench's MethodUnavailable unless `context` runs the zoo pair (and greedy, if asked)."""
    from specdec_lab.bench_runner import MethodUnavailable
    from specdec_lab.models import zoo_path

    if greedy_only and context.config.temperature != 0:
        raise MethodUnavailable(f"the {engine} rows run greedy (temperature 0) only")
    if Path(context.pair.target.name_or_path).resolve() != (zoo_path() / "target").resolve():
        raise MethodUnavailable(f"the {engine} rows run on the zoo pair only (its converted files)")


def tokenisation_differences(theirs: Callable[[str], list[int]], tokenizer, texts: Sequence[str]) -> list[int]:
    """Indices of the texts an engine tokenises differently from our tokenizer (no special tokens added).

    theirs: the engine's tokenisation of one text; tokenizer: ours (a Hugging Face tokenizer).
    """
    return [i for i, text in enumerate(texts)
            if list(theirs(text)) != tokenizer(text, add_special_tokens=False)["input_ids"]]


def agreement(ours: list[int], theirs: list[int]) -> tuple[float, int | None]:
    """Share of positions where two greedy outputs agree, and the first position where they differ (None if
    they never do). Positions after the first difference rarely agree: the texts have gone separate ways."""
    length = max(len(ours), len(theirs), 1)
    same = sum(a == b for a, b in zip(ours, theirs, strict=False))
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    return same / length, first
