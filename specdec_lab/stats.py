"""Counters of one decoding run, and the figures derived from them.

Conventions follow Spec-Bench / vLLM: tau (mean accepted tokens) counts the token the target adds itself
(correction or bonus), so plain autoregressive decoding has tau = 1.00.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """What happened during one `generate` call.

    target_forwards: target model calls (prefill included); drafted / accepted: draft tokens proposed and
    kept; new_tokens: tokens emitted; accepted_per_step: draft tokens kept at each verification step;
    drafted_at / reached_at / accepted_at: per draft position (0 = first drafted token), how often it was
    proposed, reached (proposed with every earlier position kept) and kept; draft_seconds / verify_seconds /
    total_seconds: wall time in the drafter, in target forwards plus verification, and overall;
    prefill_seconds: the part of verify_seconds spent on the target forward that fed the prompt: its own
    forward before the first draft, or the first step when the prompt rides along with the first verification
    (plain decoding, a draft model); prompt_steps: verification steps that fed the prompt (1 in that second
    case, else 0), so per-step figures can leave them out; forward_seconds: the part of verify_seconds inside
    the target's forward calls (the prompt's included), so that verify_seconds - forward_seconds is the loop's
    own cost around the target (the verification rule, cache moves, Python).
    """

    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_at: Counter = field(default_factory=Counter)
    reached_at: Counter = field(default_factory=Counter)
    accepted_at: Counter = field(default_factory=Counter)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    forward_seconds: float = 0.0
    prompt_steps: int = 0
    total_seconds: float = 0.0

    def record_step(self, drafted: int, accepted: int) -> None:
        """Count one verification step that checked a draft path of `drafted` tokens and kept `accepted`."""
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_per_step.append(accepted)
        for position in range(drafted):
            self.drafted_at[position] += 1
            if position <= accepted:
                self.reached_at[position] += 1
            if position < accepted:
                self.accepted_at[position] += 1

    @property
    def mean_accepted_tokens(self) -> float:
        """tau: tokens emitted per target forward (bonus/correction token included; AR decoding = 1.00)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens that the target kept (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Survival: for each draft position i (0-based), the share of steps that drafted it and kept it.

        Position i is kept only if positions 0 .. i - 1 were kept too, so this counts from the start of the
        draft and falls like alpha^(i+1) under the i.i.d. model (see `conditional_acceptance` for the other
        reading).
        """
        return [self.accepted_at[i] / self.drafted_at[i] for i in range(len(self.drafted_at))]

    @property
    def conditional_acceptance(self) -> list[float]:
        """For each draft position i, the share of the steps that reached it (every earlier position kept) that
        kept it too: the target's verdict on position i alone, flat at alpha under the i.i.d. model. A position
        that no step reached has no such share: NaN."""
        return [self.accepted_at[i] / self.reached_at[i] if self.reached_at[i] else math.nan
                for i in range(len(self.drafted_at))]

    @property
    def accepted_histogram(self) -> dict[int, int]:
        """How many verification steps kept 0, 1, 2, ... draft tokens."""
        return dict(sorted(Counter(self.accepted_per_step).items()))

    @property
    def tokens_per_second(self) -> float:
        """Emitted tokens per second of wall time (prefill included)."""
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def other_seconds(self) -> float:
        """Wall time spent outside the drafter and the target: the loop's own bookkeeping."""
        return max(0.0, self.total_seconds - self.draft_seconds - self.verify_seconds)

    def summary(self) -> dict:
        """The headline figures as a plain dict (for printing, JSON and reports)."""
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "tau": round(self.mean_accepted_tokens, 3),
            "acceptance_rate": round(self.acceptance_rate, 3),
            "per_position_acceptance": [round(a, 3) for a in self.per_position_acceptance],
            "conditional_acceptance": rounded(self.conditional_acceptance),
            "accepted_histogram": self.accepted_histogram,
            "tokens_per_second": round(self.tokens_per_second, 1),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "forward_seconds": round(self.forward_seconds, 4),
            "other_seconds": round(self.other_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
        }


def rounded(values: list[float], digits: int = 3) -> list[float | None]:
    """`values` rounded to `digits`, with NaN (undefined) as None so that the list is valid JSON."""
    return [None if math.isnan(v) else round(v, digits) for v in values]
