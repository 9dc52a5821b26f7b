"""Sweep lookahead decoding's (W, N, G) on one target: compression ratio and tokens/s against plain decoding.

    python -m specdec_lab.experiments.lookahead_sweep --prompts 10 --max-new-tokens 64 --repeats 3

Greedy, on held-out prompts (signature + docstring from the corpus's validation files). Every repeat runs
every prompt through every method in turn (plain decoding, Jacobi decoding, each lookahead setting), so a
slow patch of a shared machine hurts all of them alike; a method's speed is the median over repeats of
(tokens emitted / wall seconds). On a shared machine wall time also counts the waits for a core, so the
sweep also reports tokens per CPU-second of this process (one torch thread): what the method costs the CPU.
Compression ratio = tokens emitted / target forwards (prefill included;
plain decoding = 1.00). Every method's tokens are checked against plain decoding's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec_lab.decode import GenerationOutput, generate
from specdec_lab.drafters.jacobi import jacobi_decode
from specdec_lab.drafters.lookahead import LookaheadDrafter
from specdec_lab.models import load_model, zoo_path


@dataclass
class MethodTotals:
    """What one method did over one pass of the prompts (or, for `forwards`/`tokens`, over all passes)."""

    label: str
    run: Callable[[list[int]], GenerationOutput]
    rows: int = 1
    tokens: int = 0
    forwards: int = 0
    speeds: list[float] = field(default_factory=list)
    cpu_speeds: list[float] = field(default_factory=list)
    mismatches: int = 0


def parse_setting(text: str) -> tuple[int, int, int]:
    """'W,N,G' -> (W, N, G)."""
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"a setting is W,N,G (three integers), got {text!r}")
    return tuple(int(p) for p in parts)


def build_methods(target, settings, jacobi_windows, max_new_tokens: int) -> list[MethodTotals]:
    """Plain decoding first (the baseline), then Jacobi windows, then the lookahead settings."""
    methods = [MethodTotals("plain", lambda ids: generate(target, ids, max_new_tokens=max_new_tokens))]
    for window in jacobi_windows:
        methods.append(MethodTotals(f"jacobi window={window}",
                                    lambda ids, w=window: jacobi_decode(target, ids, w, max_new_tokens),
                                    rows=window + 1))
    for w, n, g in settings:
        def run(ids, w=w, n=n, g=g):
            return generate(target, ids, drafter=LookaheadDrafter(w, n, g), max_new_tokens=max_new_tokens)
        methods.append(MethodTotals(f"lookahead W={w} N={n} G={g}", run, rows=1 + (n - 1) * (w + g)))
    return methods


def sweep(args) -> list[MethodTotals]:
    """Run the sweep and return every method's totals (see the module docstring for the protocol)."""
    from specdec_lab.bench import corpus_prompts

    torch.set_num_threads(args.threads)
    target, tokenizer = load_model(args.target, device="cpu")
    prompts = [p.ids for p in corpus_prompts("heldout", tokenizer, args.prompts, 1024 - args.max_new_tokens)]
    methods = build_methods(target, args.settings, args.jacobi, args.max_new_tokens)
    for method in methods:  # warm-up
        method.run(prompts[0])
    for _ in range(args.repeats):
        tokens = {m.label: 0 for m in methods}
        seconds = {m.label: 0.0 for m in methods}
        cpu_seconds = {m.label: 0.0 for m in methods}
        for ids in prompts:
            reference = None
            for method in methods:
                cpu_started = time.process_time()
                out = method.run(ids)
                cpu_seconds[method.label] += time.process_time() - cpu_started
                reference = out.tokens if reference is None else reference
                method.mismatches += out.tokens != reference
                method.tokens += out.stats.new_tokens
                method.forwards += out.stats.target_forwards
                tokens[method.label] += out.stats.new_tokens
                seconds[method.label] += out.stats.total_seconds
        for method in methods:
            method.speeds.append(tokens[method.label] / seconds[method.label])
            method.cpu_speeds.append(tokens[method.label] / cpu_seconds[method.label])
    return methods


def report(methods: list[MethodTotals]) -> list[dict]:
    """One row per method: most rows per forward, compression ratio, median tokens per wall second and per
    CPU-second, and both as speedups over plain decoding."""
    base, cpu_base = statistics.median(methods[0].speeds), statistics.median(methods[0].cpu_speeds)
    rows = []
    for m in methods:
        speed, cpu_speed = statistics.median(m.speeds), statistics.median(m.cpu_speeds)
        rows.append({"method": m.label, "max_rows_per_forward": m.rows,
                     "compression": round(m.tokens / m.forwards, 3), "tokens_per_s": round(speed, 1),
                     "speedup": round(speed / base, 3), "tokens_per_cpu_s": round(cpu_speed, 1),
                     "cpu_speedup": round(cpu_speed / cpu_base, 3), "mismatches": m.mismatches})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(zoo_path() / "target"), help="model folder (default: zoo target)")
    parser.add_argument("--prompts", type=int, default=10, help="held-out prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--jacobi", type=int, nargs="*", default=[4], help="Jacobi windows to include")
    parser.add_argument("--settings", type=parse_setting, nargs="+",
                        default=[(2, 3, 2), (3, 3, 3), (4, 3, 4), (5, 4, 5), (3, 4, 6), (7, 4, 7), (5, 5, 5)],
                        help="lookahead settings as W,N,G")
    parser.add_argument("--json", help="also write the table to this file")
    args = parser.parse_args(argv)
    rows = report(sweep(args))
    print(f"{'method':28} {'rows':>5} {'tokens/fwd':>10} {'tokens/s':>9} {'speedup':>8} {'tok/cpu-s':>9} "
          f"{'cpu-speedup':>11} {'mismatch':>8}")
    for r in rows:
        print(f"{r['method']:28} {r['max_rows_per_forward']:5d} {r['compression']:10.3f} {r['tokens_per_s']:9.1f} "
              f"{r['speedup']:8.3f} {r['tokens_per_cpu_s']:9.1f} {r['cpu_speedup']:11.3f} {r['mismatches']:8d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
