"""From timed runs to the benchmark's figures: one row per method (speed, speedup over the baseline, tau,
acceptance, equality with the baseline's tokens, efficiency against the closed form) and one block per prompt set,
plus the settings and models as recorded in the output.

The efficiency figure holds each draft-model chain method against the closed-form model of Leviathan et al.
(`specdec_lab.theory`): from the measured tau (hence alpha) and the measured cost ratio c of one draft
forward to one target forward, it predicts the speedup over the same framework's own autoregressive loop;
measured / predicted shows what the loop's overhead costs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from specdec_lab.bench_prompts import Prompt
from specdec_lab.bench_runner import BASELINE, BenchConfig, Method, RunResult
from specdec_lab.stats import DecodeStats, rounded
from specdec_lab.theory import alpha_from_tau, costed_speedup, expected_speedup

# Each family's own autoregressive loop: the reference of its measured-vs-predicted efficiency figures.
OWN_AUTOREGRESSIVE = {"hf": BASELINE, "ours": "plain", "llama.cpp": "llamacpp", "vllm": "vllm"}


@dataclass
class MethodRecord:
    """Everything measured for one method on one prompt set."""

    method: Method
    results: list[RunResult | None]
    seconds: list[list[float]] = field(default_factory=list)  # [repeat][prompt]
    warmup_seconds: float = 0.0  # the untimed passes before the timed ones: where a compiled row compiles


def summarise(record: MethodRecord, baseline: MethodRecord, reference: MethodRecord | None, config: BenchConfig,
              costs: dict) -> dict:
    """The figures of one method: speed, speedup, tau, acceptance, equality with the baseline, efficiency."""
    stats = merged_stats([r.stats for r in record.results])
    new_tokens = sum(len(r.tokens) for r in record.results)
    speeds = [new_tokens / sum(seconds) for seconds in record.seconds]
    speed = statistics.median(speeds)
    baseline_speed = statistics.median(new_tokens_of(baseline) / sum(s) for s in baseline.seconds)
    equal = sum(r.tokens == b.tokens for r, b in zip(record.results, baseline.results, strict=True))
    greedy = config.temperature == 0
    row = {
        "label": record.method.label,
        "family": record.method.family,
        "kind": record.method.kind,
        "lossless": record.method.lossless,
        "new_tokens": new_tokens,
        "tokens_per_second": round(speed, 2),
        "tokens_per_second_repeats": [round(s, 2) for s in speeds],
        "speedup": round(speed / baseline_speed, 3),
        "tau": round(stats.mean_accepted_tokens, 3),
        "acceptance_rate": round(stats.acceptance_rate, 3) if stats.drafted else None,
        "per_position_acceptance": [round(a, 3) for a in stats.per_position_acceptance],
        "conditional_acceptance": rounded(stats.conditional_acceptance),
        "target_forwards": stats.target_forwards,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "outputs_equal_to_baseline": equal if greedy else None,
        "equal_to_baseline": (equal == len(record.results)) if greedy else None,
        "draft_share": round(stats.draft_seconds / stats.total_seconds, 3)
        if record.method.family == "ours" and stats.total_seconds else None,
    }
    row.update(efficiency(record, row, reference, config, costs))
    row["times_floor"] = times_floor(row, costs)
    return row


def times_floor(row: dict, costs: dict) -> float | None:
    """For a plain (autoregressive) row, its time per token over the bandwidth floor (weights / bandwidth, see
    `bench_costs.decode_floor`): 1.0 is a loop that only streams weights; None for speculative rows."""
    floor = costs.get("floor")
    if row["kind"] != "autoregressive" or not floor or not row["tokens_per_second"]:
        return None
    return round(1e3 / row["tokens_per_second"] / floor["floor_ms_per_token"], 2)


def new_tokens_of(record: MethodRecord) -> int:
    return sum(len(r.tokens) for r in record.results)


def merged_stats(runs: list[DecodeStats]) -> DecodeStats:
    """The statistics of several runs added up, as if they were one run."""
    total = DecodeStats()
    for s in runs:
        for name in ("target_forwards", "drafted", "accepted", "new_tokens", "draft_seconds", "verify_seconds",
                     "total_seconds"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.accepted_per_step.extend(s.accepted_per_step)
        total.drafted_at.update(s.drafted_at)
        total.reached_at.update(s.reached_at)
        total.accepted_at.update(s.accepted_at)
    return total


def efficiency(record: MethodRecord, row: dict, reference: MethodRecord | None, config: BenchConfig,
               costs: dict) -> dict:
    """Measured / predicted speedup for the draft-model chain methods (None elsewhere).

    alpha is the acceptance probability that makes the closed-form tau equal the measured tau; the predicted
    speedup over the same framework's autoregressive loop is `theory.expected_speedup(alpha, k, c)`.
    "costed" also charges the measured extra cost of verifying k + 1 tokens instead of 1 (a CPU is not
    memory-bound enough to verify for free), so its ratio isolates the loop's own overhead.
    """
    empty = {"alpha": None, "measured_speedup_vs_own_ar": None, "predicted_speedup": None, "efficiency": None,
             "predicted_speedup_costed": None, "efficiency_costed": None}
    if not record.method.draft_model or reference is None or costs.get("c") is None:
        return empty
    if config.tuned is not None and record.method.family == "ours":
        return empty  # its k came from the profile, not config.k, which the measured costs were timed at
    k, c = config.k, costs["c"]
    tau = min(max(row["tau"], 1.0), k + 1.0)
    alpha = alpha_from_tau(tau, k)
    own_ar_speed = statistics.median(new_tokens_of(reference) / sum(s) for s in reference.seconds)
    measured = row["tokens_per_second"] / own_ar_speed
    predicted = expected_speedup(alpha, k, c)
    costed = costed_speedup(alpha, k, c, max(costs["verify_ratio"], 1.0))
    return {"alpha": round(alpha, 3), "measured_speedup_vs_own_ar": round(measured, 3),
            "predicted_speedup": round(predicted, 3), "efficiency": round(measured / predicted, 3),
            "predicted_speedup_costed": round(costed, 3), "efficiency_costed": round(measured / costed, 3)}


def summarise_set(records: dict[str, MethodRecord], prompts: list[Prompt], config: BenchConfig, costs: dict,
                  baseline: str = BASELINE) -> dict:
    """One prompt set's figures: where its prompts came from, and one row per method.

    baseline: the method every speedup and output comparison is relative to.
    """
    rows = {}
    for name, record in records.items():
        reference = records.get(OWN_AUTOREGRESSIVE.get(record.method.family, "plain"))
        rows[name] = summarise(record, records[baseline], reference, config, costs)
    return {"prompts": len(prompts), "prompt_sources": [p.source for p in prompts],
            "mean_prompt_tokens": round(statistics.mean(len(p.ids) for p in prompts), 1), "methods": rows,
            "warmup_seconds": {name: round(record.warmup_seconds, 1) for name, record in records.items()}}


def settings_dict(config: BenchConfig) -> dict:
    """The settings as recorded in the output (the progress flag is not a setting of the measurement)."""
    keys = ("k", "lookup_k", "lookup_ngram", "tree_tokens", "adaptive_k", "min_confidence", "temperature", "top_k",
            "top_p", "tuned", "prompts",
            "max_new_tokens", "repeats", "warmup", "threads", "seed", "compile")
    return {key: getattr(config, key) for key in keys} | {"baseline": BASELINE}


def model_card(model, path: str) -> dict | None:
    """Where a model came from and its size."""
    if model is None:
        return None
    return {"path": path, "parameters": model.num_parameters(), "layers": model.config.num_hidden_layers,
            "hidden_size": model.config.hidden_size}
