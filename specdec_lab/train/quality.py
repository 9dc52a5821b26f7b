"""What the target's own text says about it: does it write Python, and does it loop?

A small language model can reach a fair validation loss and still write text that no course should show:
statements that never parse, or one token (or a short cycle of tokens) repeated until the budget runs out.
Such loops also inflate every speculative figure (a loop is trivially easy to draft). These measures are
taken on greedy completions of held-out prompts, during training (to pick the weights to ship) and for the
model card.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import torch

# A completion counts as degenerate when it holds a run of this many tokens or more that repeats one token,
# or one cycle of 2 to 4 tokens.
LOOP_MIN_TOKENS = 12
LOOP_MAX_PERIOD = 4
# It repeats itself when it writes one stretch of up to this many tokens (a line or two of code) three times
# in a row, over LOOP_MIN_TOKENS tokens or more: a loop of whole statements, which the short cycles above miss.
REPEAT_MAX_PERIOD = 32


def first_statement_parses(prompt: str, completion: str) -> bool:
    """Whether the completion's first complete statement or block, appended to the prompt, parses.

    The prompt (a signature and docstring) parses on its own; we add the completion one whole line at a
    time and accept as soon as prompt + lines parses with at least one non-blank line added.
    """
    lines = completion.split("\n")[:-1]  # the last piece may be a cut-off line
    added = []
    for line in lines:
        added.append(line)
        if not any(part.strip() for part in added):
            continue
        try:
            ast.parse(prompt + "\n".join(added) + "\n")
            return True
        except SyntaxError:
            continue
    return False


def longest_loop(tokens: Sequence[int], max_period: int = LOOP_MAX_PERIOD) -> int:
    """Length of the longest stretch of `tokens` that repeats one cycle of 1 to `max_period` tokens.

    A stretch with period p is a run where every token equals the one p places before it; its length counts
    the first cycle too. `[7, 7, 7]` gives 3; `[1, 2, 1, 2, 1]` gives 5; a sequence with no repeat gives 1.
    """
    best = min(len(tokens), 1)
    for period in range(1, max_period + 1):
        run = 0  # tokens so far that equal the one `period` places back
        for i in range(period, len(tokens)):
            run = run + 1 if tokens[i] == tokens[i - period] else 0
            if run:
                best = max(best, run + period)
    return best


def loop_positions(tokens: torch.Tensor, min_tokens: int, max_period: int = LOOP_MAX_PERIOD,
                   copies: int = 1) -> torch.Tensor:
    """Which tokens of each row continue a loop that is already `min_tokens` long, counting the token itself.

    tokens: (rows, length) ids; copies: how many whole cycles must come before the marked token (1: it repeats
    the cycle once; 2: it begins or continues a third copy). Returns a bool tensor of the same shape: True where
    the stretch of one repeated cycle of p <= `max_period` tokens ending at that token (as `longest_loop`
    measures it) holds at least `min_tokens` tokens and more than `copies` x p. A row is degenerate at
    `min_tokens` (`is_degenerate`) exactly when one of its tokens is marked with the defaults. The loop
    unlikelihood fine-tune (`train.unlikelihood`) penalises the marked tokens.
    """
    rows, length = tokens.shape
    marked = torch.zeros(rows, length, dtype=torch.bool, device=tokens.device)
    for period in range(1, max_period + 1):
        repeats = torch.zeros_like(marked)
        repeats[:, period:] = tokens[:, period:] == tokens[:, :-period]
        run = torch.zeros(rows, dtype=torch.long, device=tokens.device)  # tokens so far equal to `period` back
        for i in range(period, length):
            run = (run + 1) * repeats[:, i]
            marked[:, i] |= (run > (copies - 1) * period) & (run + period >= min_tokens)
    return marked


def is_degenerate(tokens: Sequence[int], min_tokens: int = LOOP_MIN_TOKENS) -> bool:
    """Whether `tokens` hold a loop (one token, or one 2- to 4-token cycle) of `min_tokens` tokens or more."""
    return longest_loop(tokens) >= min_tokens


def repeats_itself(tokens: Sequence[int]) -> bool:
    """Whether `tokens` write one stretch of up to REPEAT_MAX_PERIOD tokens three times in a row (over
    LOOP_MIN_TOKENS tokens or more): a statement or two written again and again."""
    if not tokens:
        return False
    row = torch.tensor([list(tokens)])
    return bool(loop_positions(row, LOOP_MIN_TOKENS, REPEAT_MAX_PERIOD, copies=2).any())


@torch.no_grad()
def text_quality(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = 64) -> dict:
    """Greedy-complete each prompt with `model` and measure the completions.

    Returns `first_statement_parses` (share whose first statement parses after the prompt),
    `degenerate_share` (share holding a loop, see `is_degenerate`), `repeat_share` (share that writes a
    statement or two three times in a row, see `repeats_itself`: reported, not selected by) and `clean_share`
    (share that parses and does not loop: what weights are selected by, since an early model parses by writing
    little, and a looping one can parse too), all over `len(prompts)` prompts.
    """
    import specdec_lab as sd

    counts = {"first_statement_parses": 0, "degenerate_share": 0, "repeat_share": 0, "clean_share": 0}
    for text in prompts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        tokens = sd.generate(model, ids, max_new_tokens=max_new_tokens).tokens
        parses, loops, repeats = (first_statement_parses(text, tokenizer.decode(tokens)), is_degenerate(tokens),
                                  repeats_itself(tokens))
        for key, hit in zip(counts, (parses, loops, repeats, parses and not loops), strict=True):
            counts[key] += hit
    return {key: round(count / len(prompts), 3) for key, count in counts.items()}
