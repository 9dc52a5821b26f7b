"""Kernel against torch reference: batched verification timed for several batch sizes and draft lengths.

    python -m specdec_lab.kernels.bench --batches 1,8,64 --ks 4,8 --vocab 4096 --device cuda

For each (batch, k) and each rule (greedy, rejection sampling) it builds one random flat batch (drafts that copy
the target's argmax 70% of the time), checks that both backends return the same verdict given the same randoms,
and reports the median time of each backend and their ratio, measured in the same run. Exits with status 1 if
any verdict differs. On CPU the Triton side runs in the interpreter (TRITON_INTERPRET=1), so its times there only
prove the plumbing, not the kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from specdec_lab.kernels import draw_randoms, reference
from specdec_lab.kernels.layout import BatchVerdict


def median_seconds(call: Callable[[], BatchVerdict], device: torch.device, repeats: int) -> float:
    """Median wall time of `call` over `repeats` runs (CUDA synchronised around each)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_batch(batch: int, k: int, vocab: int, device: torch.device, seed: int):
    """(drafts (T,), cu (B,), target logits (T + B, V), p, q (T, V), randoms) for B sequences of k drafts."""
    gen = torch.Generator().manual_seed(seed)
    cu = torch.full((batch,), k).cumsum(0)
    total = batch * k
    logits = torch.randn(total + batch, vocab, generator=gen) * 3
    rows = torch.arange(total) + torch.arange(batch).repeat_interleave(k)
    copy = torch.rand(total, generator=gen) < 0.7
    drafts = torch.where(copy, logits[rows].argmax(-1), torch.randint(0, vocab, (total,), generator=gen))
    q = torch.softmax(torch.randn(total, vocab, generator=gen) * 3, -1)
    randoms = draw_randoms(total, batch, vocab, gen)
    moved = [t.to(device) for t in (drafts, cu, logits, torch.softmax(logits, -1), q)]
    return (*moved, type(randoms)(randoms.uniforms.to(device), randoms.race.to(device)))


def calls_for(batch: int, k: int, vocab: int, device: torch.device) -> dict[str, Callable]:
    """Per rule, a function of a backend module that verifies one random (batch, k) flat batch with it."""
    drafts, cu, logits, p, q, randoms = random_batch(batch, k, vocab, device, seed=batch * 100 + k)
    return {
        "greedy": lambda m: m.greedy_verify(drafts, cu, logits),
        "rejection": lambda m: m.rejection_verify(drafts, cu, p, q, randoms.uniforms, randoms.race),
    }


def compare(batches: list[int], ks: list[int], vocab: int, device: torch.device, repeats: int) -> list[dict]:
    """One row per (batch, k, rule): torch and Triton medians (microseconds), ratio, and whether they agree."""
    from specdec_lab.kernels import triton_verify

    rows = []
    for batch in batches:
        for k in ks:
            for rule, call in calls_for(batch, k, vocab, device).items():
                expected, got = call(reference), call(triton_verify)  # the first Triton call compiles
                agree = torch.equal(expected.accepted, got.accepted) and torch.equal(expected.next_tokens,
                                                                                     got.next_tokens)
                torch_s = median_seconds(lambda c=call: c(reference), device, repeats)
                triton_s = median_seconds(lambda c=call: c(triton_verify), device, repeats)
                rows.append({"batch": batch, "k": k, "rule": rule, "torch_us": torch_s * 1e6,
                             "triton_us": triton_s * 1e6, "speedup": torch_s / triton_s, "agree": agree})
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    lines = ["| batch | k | rule | torch (us) | triton (us) | torch / triton | same tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['k']} | {r['rule']} | {r['torch_us']:.1f} | {r['triton_us']:.1f} | "
                     f"{r['speedup']:.2f}x | {'yes' if r['agree'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes (default: 1,8,64)")
    parser.add_argument("--ks", default="4,8", help="comma-separated draft lengths (default: 4,8)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default: 4096, the zoo's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per backend; medians are reported")
    args = parser.parse_args(argv)
    rows = compare([int(b) for b in args.batches.split(",")], [int(k) for k in args.ks.split(",")], args.vocab,
                   torch.device(args.device), args.repeats)
    print(f"verify_batch on {args.device}, vocabulary {args.vocab}, median of {args.repeats} calls")
    print(format_table(rows))
    if not all(r["agree"] for r in rows):
        print("FAILED: the Triton kernels and the torch reference disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
