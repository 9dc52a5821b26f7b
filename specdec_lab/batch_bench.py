"""Batched throughput: tokens/s of plain and speculative decoding at several batch sizes, in one run.

    python -m specdec_lab.batch_bench --batches 1,2,4,8,16 --max-new-tokens 32 --repeats 3

For each batch size B it runs `generate_batch` on the first B held-out prompts (the bench's prompt set) once
plainly and once with the draft model, interleaved, `repeats` times after a warm-up, and reports the median
tokens/s of each, their ratio, and tau. Every sequence generates exactly `max_new_tokens` tokens (EOS is ignored)
so that all batch sizes do the same work per sequence. At temperature 0 it also counts the sequences whose
speculative output equals the plain one (fp32 gives all of them; half precision may differ after a near tie).

With `--vllm` the same prompts also go through vLLM (its own environment, `make production`), plain and with the
zoo draft model, at the same batch sizes: a second table beside ours, one run, with vLLM's speedup over its own
plain decoding and how many of its greedy outputs equal ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from specdec_lab.batch import generate_batch
from specdec_lab.drafters.draft_model import DraftModelDrafter
from specdec_lab.models import ModelPair, load_pair

NEVER = -1  # an EOS id no token has: every sequence runs to max_new_tokens


@dataclass
class BatchPoint:
    """Median figures at one batch size.

    batch: sequences decoded together; plain_tokens_per_second / speculative_tokens_per_second: all sequences'
    new tokens per second of wall time; speedup: their ratio; tau: tokens per target forward per sequence
    (speculative); same_as_plain: sequences whose speculative output equals plain decoding's.
    """

    batch: int
    plain_tokens_per_second: float
    speculative_tokens_per_second: float
    speedup: float
    tau: float
    same_as_plain: int


def bench_prompts(pair: ModelPair, count: int, max_tokens: int = 96) -> list[list[int]]:
    """`count` held-out prompts of at most `max_tokens` tokens (the bench's set, repeated if it is short)."""
    from specdec_lab.bench import corpus_prompts

    found = [p.ids for p in corpus_prompts("heldout", pair.tokenizer, min(count, 16), max_tokens)]
    return [found[i % len(found)] for i in range(count)]


def measure_batches(pair: ModelPair, batch_sizes: list[int], k: int = 4, max_new_tokens: int = 32,
                    repeats: int = 3, temperature: float = 0.0, prompts: list[list[int]] | None = None,
                    warmup: int = 1, plain_outputs: dict[int, list[list[int]]] | None = None) -> list[BatchPoint]:
    """Plain against speculative `generate_batch` at each batch size (see the module docstring).

    pair: target and draft; batch_sizes: the B to measure; k: tokens drafted per step; max_new_tokens: tokens per
    sequence; repeats: timed runs per method (medians reported); temperature: 0 = greedy; prompts: the prompts
    (default: the bench's held-out set); warmup: untimed runs per method before the timed ones; plain_outputs:
    a dict that receives, per batch size, the last plain run's tokens (to compare another engine's with).
    """
    if pair.draft is None:
        raise ValueError("measure_batches needs a pair with a draft model")
    prompts = prompts if prompts is not None else bench_prompts(pair, max(batch_sizes))
    points = []
    for batch in batch_sizes:
        chunk = prompts[:batch]
        runs: dict[str, list] = {"plain": [], "speculative": []}
        for repeat in range(warmup + repeats):
            for name in runs:
                drafter = DraftModelDrafter(pair.draft, k) if name == "speculative" else None
                out = generate_batch(pair.target, chunk, drafter=drafter, max_new_tokens=max_new_tokens,
                                     temperature=temperature, seed=repeat, eos_token_id=NEVER)
                if repeat >= warmup:
                    runs[name].append(out)
        plain = statistics.median(o.tokens_per_second for o in runs["plain"])
        speculative = statistics.median(o.tokens_per_second for o in runs["speculative"])
        last = runs["speculative"][-1]
        tau = sum(s.new_tokens for s in last.stats) / sum(s.target_forwards for s in last.stats)
        same = matching(runs["plain"][-1].tokens, last.tokens)
        if plain_outputs is not None:
            plain_outputs[batch] = runs["plain"][-1].tokens
        points.append(BatchPoint(batch, round(plain, 1), round(speculative, 1), round(speculative / plain, 2),
                                 round(tau, 2), same))
    return points


def matching(ours: list[list[int]], theirs: list[list[int]]) -> int:
    """How many sequences are equal token for token (the two lists in the same prompt order)."""
    return sum(a == b for a, b in zip(ours, theirs, strict=True))


@dataclass
class EnginePoint:
    """Another engine's median figures at one batch size, on the same prompts: plain and draft-model tokens/s,
    speedup over its own plain decoding, tau, and how many of its plain and its speculative outputs equal ours
    (plain, greedy; None when sampled)."""

    batch: int
    plain_tokens_per_second: float
    speculative_tokens_per_second: float
    speedup: float
    tau: float
    plain_same_as_ours: int | None
    speculative_same_as_ours: int | None


def vllm_points(prompts: list[list[int]], batch_sizes: list[int], ours: dict[int, list[list[int]]], k: int = 4,
                max_new_tokens: int = 32, repeats: int = 3, temperature: float = 0.0,
                threads: int = 2) -> list[EnginePoint]:
    """vLLM's plain and draft-model decoding of the same prompts at each batch size (one engine each, loaded
    once); ours: our plain outputs per batch size (measure_batches' plain_outputs), compared when greedy."""
    from specdec_lab import vllm

    plain, speculative = (vllm.run_batches(method, batch_sizes, max_new_tokens, k, threads, temperature, repeats,
                                           prompts)["points"] for method in ("plain", "draft"))
    points = []
    for mine, drafted in zip(plain, speculative, strict=True):
        batch, greedy = mine["batch"], temperature == 0
        points.append(EnginePoint(batch, mine["tokens_per_second"], drafted["tokens_per_second"],
                                  round(drafted["tokens_per_second"] / mine["tokens_per_second"], 2),
                                  round(drafted["tau"], 2), matching(ours[batch], mine["outputs"]) if greedy else None,
                                  matching(ours[batch], drafted["outputs"]) if greedy else None))
    return points


@torch.inference_mode()
def verify_cost(model: torch.nn.Module, batch: int, k: int, context: int = 64, repeats: int = 7) -> dict:
    """What verification costs at one batch size: median ms of one cached forward over 1 and over k + 1 new
    tokens per sequence, for `batch` sequences after a `context`-token prefix, and their ratio.

    At batch 1 on most hardware the ratio is near 1 (the forward is memory-bound: verification is almost free);
    it grows toward k + 1 as the batch makes the forward compute-bound.
    """
    from specdec_lab.cache import new_cache, truncate

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = new_cache(model)
    model(input_ids=torch.randint(0, vocab, (batch, context), generator=gen).to(device), cache=cache, use_cache=True)
    feeds = {n: torch.randint(0, vocab, (batch, n), generator=gen).to(device) for n in (1, k + 1)}
    times: dict[int, list[float]] = {1: [], k + 1: []}
    for _ in range(repeats):
        for n, feed in feeds.items():  # in turns, so a slow patch of a shared machine hits both
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=feed, cache=cache, use_cache=True, logits_to_keep=n)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[n].append(time.perf_counter() - start)
            truncate(cache, context)
    one, many = statistics.median(times[1]) * 1e3, statistics.median(times[k + 1]) * 1e3
    return {"batch": batch, "one_token_ms": round(one, 2), "k_plus_1_tokens_ms": round(many, 2),
            "ratio": round(many / one, 2)}


def format_table(points: list[BatchPoint]) -> str:
    """The points as a markdown table."""
    lines = ["| batch | plain tokens/s | speculative tokens/s | speedup | tau | = plain |", "|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.batch} | {p.plain_tokens_per_second} | {p.speculative_tokens_per_second} | "
                     f"{p.speedup:.2f}x | {p.tau:.2f} | {p.same_as_plain}/{p.batch} |")
    return "\n".join(lines)


def format_engine_table(name: str, points: list[EnginePoint]) -> str:
    """Another engine's points as a markdown table (its speedup is over its own plain decoding)."""
    def shown(same: int | None, batch: int) -> str:
        return "-" if same is None else f"{same}/{batch}"

    lines = [f"| batch | {name} plain tokens/s | {name} draft tokens/s | speedup | tau | plain = ours | draft = ours |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.batch} | {p.plain_tokens_per_second} | {p.speculative_tokens_per_second} | "
                     f"{p.speedup:.2f}x | {p.tau:.2f} | {shown(p.plain_same_as_ours, p.batch)} | "
                     f"{shown(p.speculative_same_as_ours, p.batch)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default: 1,8,32)")
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per step (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per sequence (default: 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (default: 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per method first (default: 1)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--device", default=None, help="default: cuda if present, else cpu")
    parser.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default: fp16 on cuda, fp32 on cpu)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--vllm", action="store_true", help="also run vLLM on the same prompts (make production)")
    args = parser.parse_args(argv)
    if args.vllm:
        from specdec_lab import vllm

        if reason := vllm.missing():
            parser.error(f"--vllm: {reason}")
    torch.set_num_threads(args.threads)
    pair = load_pair(device=args.device, dtype=args.dtype)
    device = next(pair.target.parameters()).device
    batch_sizes = [int(b) for b in args.batches.split(",")]
    prompts, ours = bench_prompts(pair, max(batch_sizes)), {}
    points = measure_batches(pair, batch_sizes, args.k, args.max_new_tokens, args.repeats, args.temperature,
                             prompts, warmup=args.warmup, plain_outputs=ours)
    print(f"generate_batch, zoo pair on {device} ({next(pair.target.parameters()).dtype}), k = {args.k}, "
          f"{args.max_new_tokens} new tokens per sequence, temperature {args.temperature}, median of {args.repeats}")
    print(format_table(points))
    engine_points = []
    if args.vllm:
        engine_points = vllm_points(prompts, batch_sizes, ours, args.k, args.max_new_tokens, args.repeats,
                                    args.temperature, args.threads)
        print(f"\nvLLM on the same prompts ({args.threads} threads, fp32; speedup over its own plain decoding):")
        print(format_engine_table("vLLM", engine_points))
    costs = [verify_cost(pair.target, batch, args.k) for batch in sorted({points[0].batch, points[-1].batch})]
    for cost in costs:
        print(f"batch {cost['batch']}: one target forward over 1 token per sequence {cost['one_token_ms']} ms, over "
              f"k + 1 = {args.k + 1} tokens {cost['k_plus_1_tokens_ms']} ms ({cost['ratio']}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"points": [asdict(p) for p in points], "verify_cost": costs,
                       "vllm": [asdict(p) for p in engine_points]}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
