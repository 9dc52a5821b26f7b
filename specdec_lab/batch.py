"""Batched speculative decoding: many prompts of different lengths, one target forward per step for all.

    repeat until every sequence has finished (EOS or its max_new_tokens):
        drafts  = draft model, k tokens for every live sequence (one batched draft forward per token)
        logits  = target(each row's uncached tokens + its draft)       # ONE forward for the whole batch
        verdict = verify_batch(drafts, logits)                        # per sequence: accepted length + next token
        each sequence emits its accepted tokens and its next token; each rolls its own KV rows back
        finished sequences leave the batch

The rows advance by different amounts each step, so the caches are `RaggedCache`s: left padding and rejected
drafts are masked slots, positions are counted per row, and a row rolls back by masking its rejected slots.
Verification is `specdec_lab.kernels.verify_batch` (Triton on CUDA, torch elsewhere). Every sequence keeps the
single-sequence contract: at temperature 0 it emits exactly `generate`'s tokens, and when sampling its output is
distributed as target-only sampling. `drafter=None` is plain batched decoding, the baseline.

Why batching shrinks the gain: at batch 1 a decode step reads every weight to compute one token per sequence, so
scoring k + 1 tokens costs about as much as scoring one (the forward is memory-bound). With B sequences the same
weights serve B (k + 1) tokens; once that is enough arithmetic to keep the device busy, the forward becomes
compute-bound and verifying k draft tokens costs about k + 1 times one token: the rejected drafts are no longer
free, and speculation's advantage fades.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec_lab.batch_cache import COMPACT_SHARE, COMPACT_SLACK, RaggedCache
from specdec_lab.cache import CachePlan, cache_plan
from specdec_lab.decode import context_limit, model_device, prompt_to_list, resolve_eos
from specdec_lab.drafters.draft_model import DraftModelDrafter
from specdec_lab.kernels import verify_batch
from specdec_lab.sampling import SamplingConfig, make_generator, process_logits
from specdec_lab.stats import DecodeStats

PAD = 0  # the id written into padding slots; padding is masked, so any valid id would do


@dataclass
class BatchGenerationOutput:
    """Result of `generate_batch`, in the order of the prompts.

    tokens: each sequence's new tokens; stopped_by: why each stopped ("max_new_tokens" or "eos"); stats: each
    sequence's `DecodeStats` (its own acceptance; target_forwards counts the batched forwards it took part in);
    forwards: batched target forwards; seconds: wall time of the whole batch.
    """

    tokens: list[list[int]]
    stopped_by: list[str]
    stats: list[DecodeStats]
    forwards: int
    seconds: float

    @property
    def new_tokens(self) -> int:
        """Tokens emitted by all sequences together."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Throughput of the batch: all sequences' new tokens per second of wall time."""
        return self.new_tokens / self.seconds if self.seconds else 0.0


def check_prompts(target, prompts, max_new_tokens) -> tuple[list[list[int]], list[int]]:
    """Validate a batch of prompts and budgets (clear errors); return them as lists of ints."""
    if isinstance(prompts, torch.Tensor):
        if prompts.ndim != 2:
            raise ValueError(f"a tensor of prompts must be 2-D (batch, length), got shape {tuple(prompts.shape)}")
        prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of prompts (each a list of token ids or a 1-D tensor)")
    if isinstance(prompts[0], int):
        raise ValueError("prompts must be a list of prompts, got a single list of ids: wrap it, [ids]")
    lists = []
    for i, prompt in enumerate(prompts):
        try:
            lists.append(prompt_to_list(prompt, target.config.vocab_size))
        except ValueError as error:
            raise ValueError(f"prompt {i}: {error}") from None
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, Sequence) else [max_new_tokens] * len(lists)
    if len(budgets) != len(lists):
        raise ValueError(f"max_new_tokens has {len(budgets)} entries for {len(lists)} prompts")
    limit = context_limit(target)
    for i, (prompt, budget) in enumerate(zip(lists, budgets, strict=True)):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer (or one per prompt), got {budget!r}")
        if len(prompt) + budget > limit:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens; with max_new_tokens={budget} the sequence would "
                             f"exceed the model's context of {limit} tokens: shorten it or lower max_new_tokens")
    return lists, budgets


def left_pad(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, longest) ids padded on the left with PAD, and the (B, longest) mask of real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows], device=device)
    real = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows], device=device)
    return ids, real


class BatchDraftModel:
    """A draft model drafting k tokens for every sequence of a batch, with its own `RaggedCache`.

    model: the draft LM (the target's vocabulary); batch: the number of rows.
    """

    def __init__(self, model: torch.nn.Module, batch: int):
        self.model = model
        self.cache = RaggedCache(model, batch)
        self.cached = [0] * batch  # how many of each row's tokens the draft cache holds

    def propose(self, rows: list[list[int]], k: int, sampling: SamplingConfig,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, k) draft tokens following each row, and the (B, k, V) processed q they were drawn from (None when
        greedy). The cache then holds each row plus its first k - 1 draft tokens."""
        device = self.cache.valid.device
        ids, real = left_pad([row[c:] for row, c in zip(rows, self.cached, strict=True)], device)
        tokens, probs = [], []
        for _ in range(k):
            logits = self.cache.forward(ids, real, keep=1)[:, -1]
            if sampling.greedy:
                token = logits.argmax(-1)
            else:
                q = process_logits(logits, sampling)
                token = torch.multinomial(q, 1, generator=generator)[:, 0]
                probs.append(q)
            tokens.append(token)
            ids, real = token[:, None], torch.ones_like(real[:, :1])
        self.cached = [len(row) + k - 1 for row in rows]
        return torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None

    def commit(self, context_lengths: list[int], accepted: torch.Tensor, k: int) -> None:
        """Keep each row's context and the draft tokens the target accepted (at most the k - 1 that were fed)."""
        self.cached = [n + min(int(a), k - 1) for n, a in zip(context_lengths, accepted.tolist(), strict=True)]
        self.cache.first(torch.tensor(self.cached, device=self.cache.valid.device))

    def select_rows(self, rows: list[int]) -> None:
        """Keep only the listed rows (sequences that finished leave the batch)."""
        self.cache.select_rows(torch.tensor(rows, device=self.cache.valid.device))
        self.cached = [self.cached[r] for r in rows]


@torch.inference_mode()
def generate_batch(
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int] | torch.Tensor] | torch.Tensor,
    drafter: DraftModelDrafter | None = None,
    max_new_tokens: int | Sequence[int] = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    backend: str = "auto",
    cache: str | None = None,
    compile: bool = False,
) -> BatchGenerationOutput:
    """Generate for a batch of prompts at once, speculatively when given a draft model.

    target: a Hugging Face causal LM; prompts: a list of prompts of any lengths (lists of ids or 1-D tensors);
    drafter: `DraftModelDrafter(draft, k)` for draft-model speculation (token-wise verification only: a drafter
    with verification="block" is refused with a ValueError), None for plain batched decoding;
    max_new_tokens: one budget for all, or one per prompt; temperature / top_k / top_p: sampling settings applied
    to target and draft alike (temperature 0 = greedy); seed: seeds the batch's one random generator;
    eos_token_id: a sequence stops after emitting it (None = the model's own EOS); backend: verification backend
    for `verify_batch` ("auto": Triton on CUDA, torch elsewhere); cache: "dynamic" (growing caches, the default
    without compile) or "static" (preallocated, the default with compile); compile: torch.compile the target's
    and the draft's forwards (one graph per batch size and width fed; off by default).
    """
    with cache_plan(batch_plan(target, prompts, drafter, max_new_tokens, cache, compile)):
        return decode_batch(target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                            backend)


def batch_plan(target, prompts, drafter, max_new_tokens, cache: str | None, compile: bool) -> CachePlan:
    """The cache plan of a batch: static caches sized for the longest row plus its budget, its drafts and the
    holes that compaction tolerates (COMPACT_SHARE of the width, COMPACT_SLACK slots)."""
    kind = cache if cache is not None else ("static" if compile else os.environ.get("SPECDEC_CACHE", "dynamic"))
    if kind == "dynamic" and not compile:
        return CachePlan(kind)
    rows, budgets = check_prompts(target, prompts, max_new_tokens)
    step = 2 * (drafter.k + 1) if isinstance(drafter, DraftModelDrafter) else 2
    length = int((max(map(len, rows)) + max(budgets) + step) / (1 - COMPACT_SHARE)) + COMPACT_SLACK + step
    mode = "reduce-overhead" if compile and model_device(target).type == "cuda" else None
    return CachePlan(kind, length, compile, mode)


def decode_batch(target, prompts, drafter, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                 backend) -> BatchGenerationOutput:
    """The loop of `generate_batch` (inside the batch's cache plan)."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    rows, budgets = check_prompts(target, prompts, max_new_tokens)
    if drafter is not None and not isinstance(drafter, DraftModelDrafter):
        raise ValueError(f"generate_batch drafts with a DraftModelDrafter or none (plain decoding), got "
                         f"{type(drafter).__name__}")
    if drafter is not None and drafter.verification != "token":
        raise ValueError(f"generate_batch verifies token by token (kernels.verify_batch) and has no block "
                         f"verification: got a DraftModelDrafter with verification={drafter.verification!r}; use "
                         "verification='token' here, or generate() one prompt at a time for block verification")
    if drafter is not None and drafter.model.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft and target have different vocabularies ({drafter.model.config.vocab_size} vs "
                         f"{target.config.vocab_size} tokens); speculative decoding needs a draft model that uses "
                         "the target's tokenizer")
    eos = resolve_eos(target, eos_token_id)
    device = model_device(target)
    started = time.perf_counter()
    generator = make_generator(seed, device)
    batch = len(rows)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    stopped = ["max_new_tokens"] * batch
    stats = [DecodeStats() for _ in range(batch)]
    live = [i for i in range(batch) if budgets[i] > 0]  # prompt index of each batch row
    tokens = [list(rows[i]) for i in live]  # each live row: prompt + emitted tokens
    target_cache = RaggedCache(target, len(live))
    cached = [0] * len(live)  # how many of each row's tokens the target cache holds
    draft = BatchDraftModel(drafter.model, len(live)) if drafter is not None else None
    forwards = 0

    while live:
        remaining = [budgets[i] - len(outputs[i]) for i in live]
        k = min(drafter.k, max(remaining) - 1) if drafter is not None else 0
        if k > 0:
            drafts, draft_probs = draft.propose(tokens, k, sampling, generator)
        else:
            drafts, draft_probs = torch.empty(len(live), 0, dtype=torch.long, device=device), None
        ids, real = left_pad([row[c:] for row, c in zip(tokens, cached, strict=True)], device)
        feed = torch.cat([ids, drafts], 1)
        logits = target_cache.forward(feed, torch.cat([real, torch.ones_like(drafts, dtype=torch.bool)], 1), k + 1)
        forwards += 1
        counts = torch.full((len(live),), k, device=device)
        verdict = verify_batch(drafts.reshape(-1), counts.cumsum(0), logits.reshape(-1, logits.shape[-1]), sampling,
                               draft_probs.reshape(-1, logits.shape[-1]) if draft_probs is not None else None,
                               generator=generator, backend=backend)
        # Roll back: of the k draft slots at the end of the cache, each row keeps its accepted ones.
        width = target_cache.valid.shape[1]
        slot = torch.arange(width, device=device)[None, :]
        target_cache.keep(slot < width - k + verdict.accepted[:, None])
        context_lengths = [len(row) for row in tokens]
        if draft is not None and k > 0:
            draft.commit(context_lengths, verdict.accepted, k)

        finished = []
        for row, (accepted, emitted) in enumerate(zip(verdict.accepted.tolist(),
                                                      verdict.emitted(drafts.reshape(-1), counts.cumsum(0)),
                                                      strict=True)):
            i = live[row]
            stats[i].record_step(k, accepted)
            stats[i].target_forwards += 1
            emitted = emitted[: remaining[row]]
            if eos in emitted:
                emitted = emitted[: emitted.index(eos) + 1]
                stopped[i] = "eos"
            outputs[i] += emitted
            tokens[row] += emitted
            cached[row] = context_lengths[row] + accepted
            if stopped[i] == "eos" or len(outputs[i]) >= budgets[i]:
                finished.append(row)
        if finished:
            keep = [row for row in range(len(live)) if row not in finished]
            live, tokens, cached = [live[r] for r in keep], [tokens[r] for r in keep], [cached[r] for r in keep]
            if keep:
                target_cache.select_rows(torch.tensor(keep, device=device))
                if draft is not None:
                    draft.select_rows(keep)

    for output, stat in zip(outputs, stats, strict=True):
        stat.new_tokens = len(output)
    return BatchGenerationOutput(outputs, stopped, stats, forwards, time.perf_counter() - started)
