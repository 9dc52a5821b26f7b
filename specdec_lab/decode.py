"""The one decode loop that every method shares: draft, verify in one target forward, roll back, repeat.

    repeat until max_new_tokens, EOS or the context limit:
        draft    = drafter.propose(state)                  # k candidate tokens (+ their q)
        logits   = target(uncached tokens + draft)         # ONE forward scores all k + 1 positions
        verdict  = verify(draft, logits)                    # greedy or lossless rejection
        emit the accepted tokens and the target's own next token
        roll the target cache back to the accepted prefix; drafter.commit(...)

With `drafter=None` (or an empty draft) a step is plain autoregressive decoding with the KV cache.
Invariant: the target cache holds a prefix of `state.tokens`; a step feeds the rest (the last emitted token)
and the draft. The first step therefore is the prefill: it feeds the whole prompt, and, for drafters that
can draft from the prompt alone (`Drafter.drafts_from_prompt`, e.g. a draft model), the first draft rides
along, as in transformers' assisted generation. Drafters that need the target's view of the prompt first
(Medusa and EAGLE read its hidden states) get a separate prefill forward that emits the first token.

A drafter may return a tree instead of a chain (`Draft.parents`, see `specdec_lab.tree`): the forward then
runs over [last token] + every node with the tree attention mask and position ids, verification walks the
tree, and the cache keeps only the accepted path's entries, in order (`tree_step`).

Every forward goes through `specdec_lab.forward.forward`, over the caches the run's `CachePlan` asks for:
growing caches and eager forwards by default; `cache="static"` preallocates them; `compile=True` also
compiles the forwards (static shapes, lengths bucketed), gpt-fast's lesson.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.cache import CachePlan, cache_length, cache_plan, keep_positions, new_cache, truncate
from specdec_lab.drafters.base import DecodeState, Draft, Drafter, LayerRows
from specdec_lab.drafters.draft_model import DraftModelDrafter
from specdec_lab.drafters.prompt_lookup import PromptLookupDrafter
from specdec_lab.forward import QUERY_BUCKETS, forward
from specdec_lab.profiles import apply_profile
from specdec_lab.sampling import SamplingConfig, draw, make_generator, process_logits
from specdec_lab.stats import DecodeStats
from specdec_lab.tree import DraftTree
from specdec_lab.verify import (
    TreeVerdict,
    Verdict,
    verify_block,
    verify_greedy,
    verify_rejection,
    verify_tree_greedy,
    verify_tree_rejection,
    verify_typical_lossy,
)


@dataclass
class GenerationOutput:
    """Result of `generate`: the new tokens only, the run's statistics, and why it stopped
    ("max_new_tokens", "eos" or "context")."""

    tokens: list[int]
    stats: DecodeStats
    stopped_by: str


@dataclass
class StepRecord:
    """One verification step, for step-through widgets (passed to `on_step`).

    draft: what was proposed; target_logits: the target's raw logits at the k + 1 positions; target_probs:
    the same after sampling processing; verdict: the decision; emitted: the tokens this step added.
    """

    draft: Draft
    target_logits: torch.Tensor
    target_probs: torch.Tensor
    verdict: Verdict
    emitted: list[int]


def prompt_to_list(input_ids: Sequence[int] | torch.Tensor, vocab_size: int) -> list[int]:
    """Validate a prompt (list of ids, 1-D tensor, or a (1, n) batch) and return it as a list of ints."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.ndim == 2 and input_ids.shape[0] == 1:
            input_ids = input_ids[0]
        if input_ids.ndim != 1:
            raise ValueError(f"input_ids must be 1-D (or shape (1, n)), got shape {tuple(input_ids.shape)}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got a tensor of dtype {input_ids.dtype}")
        input_ids = input_ids.tolist()
    tokens = []
    for t in input_ids:
        if isinstance(t, bool) or not hasattr(t, "__index__"):  # floats would be silently truncated by int()
            raise ValueError(f"input_ids must hold integer token ids (e.g. from the tokenizer), got {t!r} of type "
                             f"{type(t).__name__}")
        tokens.append(int(t))
    if not tokens:
        raise ValueError("the prompt is empty: give at least one token id (e.g. the tokenizer's BOS/EOS token)")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}); got {bad[:5]}")
    return tokens


def model_device(model: torch.nn.Module) -> torch.device:
    """The device that holds `model`'s weights."""
    return next(model.parameters()).device


def context_limit(model: torch.nn.Module) -> int:
    """Longest sequence (prompt + output) the model supports."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def default_eos(model: torch.nn.Module) -> int | None:
    """The model's own end-of-sequence id (generation config first, then model config)."""
    for config in (getattr(model, "generation_config", None), model.config):
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is not None:
            return int(eos)
    return None


NEVER_STOP = -1  # an eos_token_id that no token has: the run goes on to max_new_tokens


def resolve_eos(model: torch.nn.Module, eos_token_id) -> int | None:
    """The id that ends a run: `eos_token_id` checked against the model's vocabulary (clear errors for anything
    else), the model's own EOS when it is None, or NEVER_STOP (-1), which no token matches.

    model: the target; eos_token_id: an integer token id, None or -1, as `generate` takes it.
    """
    if eos_token_id is None:
        return default_eos(model)
    if isinstance(eos_token_id, bool) or not hasattr(eos_token_id, "__index__"):
        raise ValueError(f"eos_token_id must be one integer token id (e.g. tokenizer.eos_token_id), None for the "
                         f"model's own, or {NEVER_STOP} to never stop early; got {eos_token_id!r} of type "
                         f"{type(eos_token_id).__name__}")
    eos = int(eos_token_id)
    vocab_size = model.config.vocab_size
    if eos != NEVER_STOP and not 0 <= eos < vocab_size:
        raise ValueError(f"eos_token_id {eos} is outside the model's vocabulary [0, {vocab_size}), so no token "
                         f"could ever end the run; pass an id of its tokenizer (e.g. tokenizer.eos_token_id), None "
                         f"for the model's own EOS ({default_eos(model)}), or {NEVER_STOP} to run to max_new_tokens")
    return eos


@dataclass
class RunSetup:
    """The validated settings of one generation: what every decoding loop checks before its first forward.

    sampling: processors for p and q; prompt: the prompt as a list of ids; eos: the id that ends generation;
    budget: how many tokens may be emitted (max_new_tokens, capped by the context); max_new_tokens: as asked;
    device: where the target lives.
    """

    sampling: SamplingConfig
    prompt: list[int]
    eos: int | None
    budget: int
    max_new_tokens: int
    device: torch.device

    @classmethod
    def check(cls, target, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id) -> RunSetup:
        """Validate a `generate`-style call (clear errors for bad input) and derive the run's settings."""
        sampling = SamplingConfig(temperature, top_k, top_p)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        prompt = prompt_to_list(input_ids, target.config.vocab_size)
        limit = context_limit(target)
        if len(prompt) >= limit:
            raise ValueError(f"the prompt has {len(prompt)} tokens but the model's context is {limit} tokens; "
                             "shorten the prompt")
        eos = resolve_eos(target, eos_token_id)
        budget = min(max_new_tokens, limit - len(prompt))
        return cls(sampling, prompt, eos, budget, max_new_tokens, model_device(target))

    def nothing_to_do(self) -> str:
        """Why a run with a zero budget stops before its first forward."""
        return "max_new_tokens" if self.max_new_tokens == 0 else "context"


class Clock:
    """Accumulates wall time into a stats field (synchronising CUDA so GPU work is counted where it runs)."""

    def __init__(self, stats: DecodeStats, device: torch.device):
        self.stats = stats
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add(self, field_name: str, since: float) -> float:
        now = self.now()
        setattr(self.stats, field_name, getattr(self.stats, field_name) + now - since)
        return now


@contextmanager
def timed(clock: Clock | None, field_name: str):
    """Add the wall time of the `with` block to the clock's `field_name` (nothing when there is no clock)."""
    if clock is None:
        yield
        return
    started = clock.now()
    yield
    clock.add(field_name, started)


def plan_for(run: RunSetup, drafter: Drafter | None, cache: str | None, compile: bool) -> CachePlan:
    """The cache plan of one run: the kind of cache (None: static when compiling, else `$SPECDEC_CACHE` or
    dynamic), sized to the prompt, the budget and the room one step's draft may take (a bucketed chain for
    plain decoding and the chain drafters, twice that for drafters that may propose trees with extra rows).
    `SPECDEC_CACHE=static` runs a whole test suite over static caches."""
    kind = cache if cache is not None else ("static" if compile else os.environ.get("SPECDEC_CACHE", "dynamic"))
    chain_only = drafter is None or isinstance(drafter, DraftModelDrafter | PromptLookupDrafter)
    room = QUERY_BUCKETS[-1] * (1 if chain_only else 2)
    mode = "reduce-overhead" if compile and run.device.type == "cuda" else None
    return CachePlan(kind, len(run.prompt) + run.budget + room, compile, mode)


def target_forward(target, tokens: torch.Tensor, cache, want_hidden: bool, keep: int, clock: Clock | None = None):
    """Run the target on `tokens` after its cache; return (logits of the last `keep` positions, the forward's
    per-layer hidden states (1, >= q, H) or None: rows past the fed tokens are padding). clock: where the
    forward's own time is added up (`forward_seconds`), so that a step's time outside the forward can be told
    apart; None: not timed."""
    with timed(clock, "forward_seconds"):
        out = forward(target, cache, tokens, keep=keep, hidden=want_hidden)
    return out.logits[0].float(), out.hidden_states


def prefill(target, state: DecodeState, cache, want_hidden: bool, clock: Clock | None = None) -> None:
    """One forward over the prompt alone: append the target's first token and keep its hidden states."""
    prompt = torch.tensor(state.tokens, device=state.device)
    logits, hidden = target_forward(target, prompt, cache, want_hidden, keep=1, clock=clock)
    state.hidden_states = LayerRows(hidden, slice(0, len(prompt))) if want_hidden else None
    state.tokens.append(choose_next(logits[-1], state.sampling, state.generator))


def chain_step(target, draft: Draft, state: DecodeState, cache, want_hidden: bool, clock: Clock | None = None):
    """Score a chain draft in ONE target forward after the uncached tokens, verify it, roll the cache back.

    Returns (logits at the k + 1 verified positions, verdict, emitted tokens, per-layer hidden rows of the
    last uncached token and the accepted drafts, or None). clock: times the forward (`target_forward`).
    """
    pending = len(state.tokens) - cache_length(cache)  # 1, or the whole prompt at a merged prefill
    feed = torch.cat([torch.tensor(state.tokens[-pending:], device=state.device), draft.tokens])
    logits, hidden = target_forward(target, feed, cache, want_hidden, keep=len(draft) + 1, clock=clock)
    verdict = verify_chain(draft, logits, state.sampling, state.generator)
    truncate(cache, len(state.tokens) + verdict.accepted)
    emitted = draft.tokens[: verdict.accepted].tolist() + [verdict.next_token]
    if want_hidden:
        hidden = LayerRows(hidden, slice(pending - 1, pending + verdict.accepted))
    return logits, verdict, emitted, hidden


def choose_next(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """The target's own next token from one position's logits (argmax when greedy)."""
    return int(draw(logits, sampling, generator)[0])


def verify_chain(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig,
                 generator: torch.Generator) -> Verdict:
    """Apply the chain rule that fits the sampling settings: greedy matching, or lossless rejection, token by
    token or, when the draft asks for it (`Draft.verification == "block"`), jointly (block verification)."""
    if sampling.greedy:
        return verify_greedy(draft.tokens, logits)
    if draft.verification == "block":
        return verify_block(draft.tokens, process_logits(logits, sampling), draft.probs, generator)
    return verify_rejection(draft.tokens, process_logits(logits, sampling), draft.probs, generator)


def verify_tree(tree: DraftTree, draft: Draft, logits: torch.Tensor, sampling: SamplingConfig,
                generator: torch.Generator) -> TreeVerdict:
    """Apply the tree rule that fits: greedy, lossless multi-candidate rejection, or (only when the draft
    asks for it) Medusa's LOSSY typical acceptance."""
    if sampling.greedy:
        return verify_tree_greedy(tree, logits)
    probs = process_logits(logits, sampling)
    if draft.lossy_typical is not None:
        epsilon, delta = draft.lossy_typical
        return verify_typical_lossy(tree, probs, generator, epsilon, delta)
    return verify_tree_rejection(tree, probs, draft.probs, generator)


def tree_inputs(tree: DraftTree, draft: Draft, root: int, past: int) -> tuple[torch.Tensor, ...]:
    """Token ids, position ids (1, q) and bool visibility (q, q) of [root] + tree nodes + the draft's extra rows."""
    feed = torch.cat([tree.tokens.new_tensor([root]), tree.tokens])
    positions = tree.position_ids(past)
    visible = tree.visibility()
    if draft.extra_tokens is None:
        return feed, positions, visible
    slots, extra = len(feed), len(draft.extra_tokens)
    if draft.extra_mask is None or draft.extra_positions is None \
            or tuple(draft.extra_mask.shape) != (extra, slots + extra):
        raise ValueError(f"a draft with {extra} extra tokens needs extra_positions and an extra_mask of shape "
                         f"({extra}, {slots + extra}) over [root, {slots - 1} nodes, extras]")
    full = visible.new_zeros(slots + extra, slots + extra)
    full[:slots, :slots] = visible
    full[slots:] = draft.extra_mask.to(full.device)
    feed = torch.cat([feed, draft.extra_tokens.to(feed.device)])
    positions = torch.cat([positions, past + draft.extra_positions.to(positions.device)[None]], dim=1)
    return feed, positions, full


def tree_step(target, draft: Draft, state: DecodeState, cache, want_hidden: bool, max_depth: int,
              clock: Clock | None = None):
    """Score a tree draft in ONE target forward, verify it, and keep only the accepted path in the cache.

    max_depth: the most draft tokens this step may emit (the drafter's `max_tokens`); clock: times the
    forward (see `target_forward`). Returns (slot logits
    (n + 1, V), verdict, emitted tokens, per-layer hidden rows of [root] + accepted path or None, tree depth).
    Sets `state.extra_logits` (logits of the draft's extra rows, or None) and `state.accepted_path`.
    """
    tree = DraftTree.from_parents(draft.tokens, draft.parents)
    if tree.max_depth > max_depth:
        raise ValueError(f"the drafter proposed a tree of depth {tree.max_depth} but at most {max_depth} "
                         "tokens were allowed (propose's max_tokens bounds the depth)")
    past = cache_length(cache)
    if past != len(state.tokens) - 1:
        raise ValueError("a tree draft needs the target prefilled on the prompt first: a drafter that proposes "
                         "trees must not set drafts_from_prompt")
    feed, positions, visible = tree_inputs(tree, draft, state.tokens[-1], past)
    with timed(clock, "forward_seconds"):
        out = forward(target, cache, feed, visible, positions, hidden=want_hidden)
    slots = len(tree) + 1
    logits = out.logits[0, :slots].float()
    state.extra_logits = out.logits[0, slots:].float() if draft.extra_tokens is not None else None
    verdict = verify_tree(tree, draft, logits, state.sampling, state.generator)
    kept = [0] + [node + 1 for node in verdict.path]
    if kept[-1] == len(kept) - 1:  # the accepted slots are already contiguous: a plain crop suffices
        truncate(cache, past + len(kept))
        rows = slice(0, len(kept))
    else:
        rows = torch.tensor(kept, device=feed.device)
        keep_positions(cache, past, rows)
    emitted = tree.tokens[verdict.path].tolist() + [verdict.next_token]
    state.accepted_path = verdict.path
    hidden = LayerRows(out.hidden_states, rows) if want_hidden else None
    return logits, verdict, emitted, hidden, tree.max_depth


@torch.inference_mode()
def generate(
    target: torch.nn.Module,
    input_ids: Sequence[int] | torch.Tensor,
    drafter: Drafter | None = None,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    tuned: str | Path | dict | None = None,
    cache: str | None = None,
    compile: bool = False,
) -> GenerationOutput:
    """Generate up to `max_new_tokens` tokens after `input_ids` with `target`, speculatively if given a drafter.

    target: a Hugging Face causal LM; input_ids: the prompt's token ids; drafter: the proposer (None = plain
    autoregressive decoding); temperature / top_k / top_p: sampling settings applied to target and draft
    alike (temperature 0 = greedy); seed: seeds the run's only random generator; eos_token_id: stop after
    emitting this id (None = the model's own EOS; -1 = never, run to max_new_tokens; any other id outside the
    vocabulary is refused); on_step: called with a `StepRecord` after every
    verification step (for visualisations); tuned: a profile written by `specdec tune` (path or dict): the
    drafter's draft length or tree budget is set from it for this run's temperature (a draft-model or EAGLE
    drafter; the drafter is changed in place); cache: "dynamic" (growing caches, the default without
    compile) or "static" (preallocated to the run, the default with compile); compile: compile the target's
    and the drafter's forwards with torch.compile (off by default: the first call of each shape compiles,
    seconds to a minute; later processes reuse inductor's on-disk cache). The output is distributed exactly as
    target-only sampling, unless the drafter explicitly asks for a LOSSY rule (Medusa's typical acceptance,
    `MedusaDrafter(acceptance="typical")`), whose output is not.
    """
    run = RunSetup.check(target, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id)
    if tuned is not None:
        if drafter is None:
            raise ValueError("a tuned profile sets a drafter's settings: pass a drafter with it")
        apply_profile(drafter, tuned, temperature)
    with cache_plan(plan_for(run, drafter, cache, compile)):
        return decode_run(target, run, drafter, seed, on_step)


def decode_run(target: torch.nn.Module, run: RunSetup, drafter: Drafter | None, seed: int,
               on_step: Callable[[StepRecord], None] | None) -> GenerationOutput:
    """The loop of `generate` for validated settings `run` (inside the run's cache plan)."""
    sampling, prompt, eos, budget, device = run.sampling, run.prompt, run.eos, run.budget, run.device
    stats = DecodeStats()
    clock = Clock(stats, device)
    started = clock.now()
    if budget == 0:
        return GenerationOutput([], stats, run.nothing_to_do())

    want_hidden = drafter is not None and drafter.needs_hidden_states
    state = DecodeState(list(prompt), len(prompt), sampling, make_generator(seed, device), device, target)
    cache = new_cache(target)
    stopped = None
    tick = started
    if drafter is not None:
        if not drafter.drafts_from_prompt:
            prefill(target, state, cache, want_hidden, clock)
            stats.target_forwards += 1
            stopped = "eos" if state.tokens[-1] == eos else None
            tick = clock.add("verify_seconds", tick)
            stats.prefill_seconds = stats.verify_seconds  # the only verify time so far
        if not stopped:
            drafter.start(state)
            tick = clock.add("draft_seconds", tick)

    while not stopped and len(state.tokens) - len(prompt) < budget:
        remaining = budget - (len(state.tokens) - len(prompt))
        if drafter is not None and remaining > 1:
            draft = drafter.propose(state, remaining - 1)
        else:
            draft = Draft(torch.empty(0, dtype=torch.long, device=device))
        tick = clock.add("draft_seconds", tick)
        step_started, feeds_prompt = tick, cache_length(cache) == 0  # the prompt rides along with this step

        if draft.parents is None:
            logits, verdict, emitted, hidden = chain_step(target, draft, state, cache, want_hidden, clock)
            stats.record_step(len(draft), verdict.accepted)
        else:
            logits, verdict, emitted, hidden, depth = tree_step(target, draft, state, cache, want_hidden,
                                                                remaining - 1, clock)
            # A tree counts as a draft as long as its deepest path: per-position acceptance is per depth.
            stats.record_step(depth, verdict.accepted)
        stats.target_forwards += 1
        if eos in emitted:
            emitted = emitted[: emitted.index(eos) + 1]
            stopped = "eos"
        state.tokens.extend(emitted)
        if want_hidden:
            state.hidden_states = hidden
        tick = clock.add("verify_seconds", tick)
        if feeds_prompt:
            stats.prefill_seconds += tick - step_started
            stats.prompt_steps += 1
        if on_step is not None:
            on_step(StepRecord(draft, logits, process_logits(logits, sampling), verdict, emitted))
        if drafter is not None and not stopped:
            drafter.commit(state, verdict.accepted)
            tick = clock.add("draft_seconds", tick)

    new_tokens = state.tokens[len(prompt) :]
    stats.new_tokens = len(new_tokens)
    stats.total_seconds = clock.now() - started
    if stopped is None:
        stopped = "max_new_tokens" if len(new_tokens) >= run.max_new_tokens else "context"
    return GenerationOutput(new_tokens, stats, stopped)
