"""Jacobi decoding: guess a window of future tokens and refine all of them at once until they stop changing.

Greedy decoding solves a system of equations. With x the committed text and y_1..y_n the next n tokens,

    y_i = argmax p( . | x, y_1, ..., y_{i-1})        for i = 1..n.

Plain decoding solves them one at a time, one forward each. Jacobi iteration (Santilli et al. 2023) updates
every unknown from the previous iteration's guesses, in ONE forward that scores all n positions:

    y'_i = argmax p( . | x, y_1, ..., y_{i-1})        for i = 1..n, all in parallel.

y'_1 is always final (its context is all committed), and y'_{i+1} is final whenever y_1..y_i were already
right, i.e. whenever each of them reproduced itself. So after every iteration the longest self-reproducing
prefix of the guesses, plus the one token after it, is committed: at worst one token per forward (plain
decoding), more where the model's predictions do not depend on the still-wrong tokens further left.
The guesses to the right of the first wrong one are kept as the next iteration's starting point.

This is exactly greedy verification of a chain draft whose "drafter" is the previous forward, so the
commit rule is `verify_greedy` (and, under sampling, the lossless `verify_rejection` with one-hot q: the
guesses are fixed before the forward that checks them). The output equals plain decoding token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec_lab.cache import new_cache, truncate
from specdec_lab.decode import (
    Clock,
    GenerationOutput,
    RunSetup,
    choose_next,
    target_forward,
    verify_chain,
)
from specdec_lab.drafters.base import Draft
from specdec_lab.sampling import make_generator
from specdec_lab.stats import DecodeStats


@dataclass
class JacobiIteration:
    """One Jacobi iteration, for plots and step-through widgets.

    guesses: the tokens fed after the last committed token; refined: the target's argmax at every fed
    position (refined[i] is the new guess for the slot after guesses[i - 1]; refined[0] follows the committed
    text); accepted: how many guesses reproduced themselves; emitted: the tokens committed by this iteration.
    """

    guesses: list[int]
    refined: list[int]
    accepted: int
    emitted: list[int]


def next_guesses(refined: list[int], accepted: int, window: int, fallback: int) -> list[int]:
    """The guesses for the next iteration: the refined tokens beyond the committed ones, padded to `window`.

    refined: the argmax at each of the window + 1 scored positions; accepted: guesses that reproduced
    themselves (so refined[: accepted + 1] were committed); fallback: the token to pad with when nothing
    is left (the last committed one). Padding repeats the last kept guess, a cheap deterministic choice.
    """
    kept = refined[accepted + 1 :]
    pad = kept[-1] if kept else fallback
    return (kept + [pad] * window)[:window]


@torch.inference_mode()
def jacobi_decode(
    target: torch.nn.Module,
    input_ids: Sequence[int] | torch.Tensor,
    window: int = 8,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    eos_token_id: int | None = None,
    on_iteration: Callable[[JacobiIteration], None] | None = None,
) -> GenerationOutput:
    """Generate with Jacobi iteration: each target forward refines a window of guesses and commits its fixed part.

    target: a Hugging Face causal LM; input_ids: the prompt's ids; window: guessed tokens fed after the last
    committed token (a forward scores window + 1 positions and commits 1 to window + 1 tokens);
    max_new_tokens: most tokens to emit; temperature / top_k / top_p: sampling settings (temperature 0 =
    greedy, where the output equals plain greedy decoding; otherwise the committed tokens follow the
    target's distribution exactly); seed: seeds the run's generator; eos_token_id: stop after this id
    (None = the model's own); on_iteration: called with a `JacobiIteration` after every iteration.
    `stats.mean_accepted_tokens` is the compression ratio: tokens emitted per target forward.
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window (guessed tokens per iteration) must be a positive integer, got {window!r}")
    run = RunSetup.check(target, input_ids, max_new_tokens, temperature, top_k, top_p, eos_token_id)
    sampling, prompt, eos, budget, device = run.sampling, run.prompt, run.eos, run.budget, run.device
    stats = DecodeStats()
    clock = Clock(stats, device)
    started = clock.now()
    if budget == 0:
        return GenerationOutput([], stats, run.nothing_to_do())

    generator = make_generator(seed, device)
    cache = new_cache(target)
    logits, _ = target_forward(target, torch.tensor(prompt, device=device), cache, False, keep=1)
    stats.target_forwards += 1
    tokens = prompt + [choose_next(logits[-1], sampling, generator)]
    stopped = "eos" if tokens[-1] == eos else None
    guesses = [tokens[-1]] * window  # nothing is known yet: start from copies of the last token

    while not stopped and len(tokens) - len(prompt) < budget:
        remaining = budget - (len(tokens) - len(prompt))
        fed = guesses[: remaining - 1]  # never commit past the budget
        context_length = len(tokens)  # the cache holds context_length - 1 of them
        logits, _ = target_forward(target, torch.tensor(tokens[-1:] + fed, device=device), cache, False,
                                   keep=len(fed) + 1)
        stats.target_forwards += 1
        draft = Draft(torch.tensor(fed, dtype=torch.long, device=device))
        verdict = verify_chain(draft, logits, sampling, generator)
        emitted = fed[: verdict.accepted] + [verdict.next_token]
        truncate(cache, context_length + verdict.accepted)
        stats.record_step(len(fed), verdict.accepted)
        if eos in emitted:
            emitted = emitted[: emitted.index(eos) + 1]
            stopped = "eos"
        tokens.extend(emitted)
        refined = logits.argmax(-1).tolist()
        guesses = next_guesses(refined, verdict.accepted, window, tokens[-1])
        if on_iteration is not None:
            on_iteration(JacobiIteration(fed, refined, verdict.accepted, emitted))

    new_tokens = tokens[len(prompt) :]
    stats.new_tokens = len(new_tokens)
    stats.total_seconds = clock.now() - started
    stats.verify_seconds = stats.total_seconds  # every second here is spent in the target or its verification
    if stopped is None:
        stopped = "max_new_tokens" if len(new_tokens) >= max_new_tokens else "context"
    return GenerationOutput(new_tokens, stats, stopped)
