"""Lookahead decoding (Fu et al. 2024): Jacobi trajectories feed an n-gram pool that drafts for free.

Jacobi decoding (drafters/jacobi.py) rarely converges fast on real text, but its trajectories are full of
good n-grams: a token refined after a guess is the model's prediction *right after that guess*. Lookahead
decoding keeps those n-grams and verifies the promising ones, both in ONE target forward with two branches:

Lookahead branch: a window of W columns and N - 1 levels of past Jacobi guesses. Level 0 is the oldest.
    level 0     a_0  a_1  a_2  ...  a_{W-1}        a causal row: a_i sees a_0..a_i
    level 1     b_0  b_1  b_2  ...                 b_i was predicted right after a_i
    ...
    level N-2   c_0  c_1  c_2  ...                 c_i was predicted right after the level N-3 token of column i
  The token at level l, column i sits at position root + 1 + i + l and sees the cached prefix, the root
  (the last committed token), level 0 up to column i, and its own column at levels 1..l; read in position
  order, that is one guessed continuation of the text ending in the column's own trajectory. The top level's
  outputs are the columns' next guesses, so one forward advances every column by one Jacobi step.
  When all N - 1 levels are full, each column yields an N-gram (a_i, b_i, ..., c_i, new_i); it goes into
  the pool under its first token, the oldest level is dropped and the new guesses become the top level.
  (During the first N - 2 steps the levels only fill up.)

Verification branch: the pool's n-grams keyed by the root token (at most G of them, most recent first) are
  candidate continuations of the committed text. They are merged into a prefix tree (`DraftTree`) and each
  candidate token sees the prefix, the root and its own ancestors, like any draft tree.

The two branches never see each other. The decode loop verifies the tree (greedy: the longest candidate
that matches the target's argmax; sampling: the lossless multi-candidate rule with one-hot q, since the
candidates were fixed before the forward), keeps only the accepted path in the KV cache and hands the
lookahead rows' logits back here. Output is exactly plain decoding's; the pool only decides how much of it
comes per forward. The window's new guesses are the target's argmax even when sampling: they only steer
what gets proposed, never what gets emitted. The pool can also be seeded with the prompt's own n-grams
(repetitive input helps).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec_lab.drafters.base import DecodeState, Draft, Drafter
from specdec_lab.tree import DraftTree


@dataclass
class NgramPool:
    """Candidate continuations keyed by the token they follow, at most `size` per key, most recent first.

    ngram: N, the n-gram length (key token + N - 1 continuation tokens); size: G, the most continuations
    kept per key (the least recently seen one is dropped first).
    """

    ngram: int
    size: int
    table: dict[int, OrderedDict[tuple[int, ...], None]] = field(default_factory=dict)

    def add(self, ngram: Sequence[int]) -> None:
        """Remember one n-gram (its first token is the key); seeing it again makes it the most recent."""
        if len(ngram) != self.ngram:
            raise ValueError(f"the pool holds {self.ngram}-grams, got {len(ngram)} tokens")
        key, continuation = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        entries = self.table.setdefault(key, OrderedDict())
        entries[continuation] = None
        entries.move_to_end(continuation, last=False)
        while len(entries) > self.size:
            entries.popitem(last=True)

    def add_text(self, tokens: Sequence[int]) -> None:
        """Remember every n-gram of a token sequence (e.g. the prompt), later ones counting as more recent."""
        for start in range(len(tokens) - self.ngram + 1):
            self.add(tokens[start : start + self.ngram])

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The continuations remembered after `key`, most recent first (empty if none)."""
        return list(self.table.get(int(key), ()))

    def __len__(self) -> int:
        return sum(len(entries) for entries in self.table.values())


def candidate_tree(candidates: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> DraftTree:
    """Merge candidate continuations of the root into a prefix tree: shared prefixes are scored once.

    candidates: token sequences that each continue the root; nodes follow the candidates' order, so earlier
    (more recent) candidates come first among siblings.
    """
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, ...], int] = {}  # prefix of a candidate -> its node
    for candidate in candidates:
        for depth in range(1, len(candidate) + 1):
            prefix = tuple(int(t) for t in candidate[:depth])
            if prefix not in index:
                index[prefix] = len(tokens)
                tokens.append(prefix[-1])
                parents.append(index[prefix[:-1]] if depth > 1 else -1)
    return DraftTree.from_parents(torch.tensor(tokens, dtype=torch.long, device=device), parents)


@dataclass
class LookaheadWindow:
    """The 2D window of the lookahead branch: `levels[l][i]` is the level-l guess of column i (level 0 oldest).

    width: W, the columns; ngram: N, so a full window holds N - 1 levels.
    """

    width: int
    ngram: int
    levels: list[list[int]]

    @property
    def full(self) -> bool:
        """Whether all N - 1 levels are filled (only then does a step complete n-grams)."""
        return len(self.levels) == self.ngram - 1

    def tokens(self) -> list[int]:
        """The window's tokens as lookahead rows, level by level (row l * W + i is level l, column i)."""
        return [token for level in self.levels for token in level]

    def offsets(self) -> list[int]:
        """Each row's position relative to the root: level l, column i sits at root + 1 + i + l."""
        return [1 + column + level for level in range(len(self.levels)) for column in range(self.width)]

    def visibility(self) -> torch.Tensor:
        """(rows, rows) bool: row r may attend to row s. (Every row also sees the cached prefix and the root.)

        Level l, column i sees level 0 columns 0..i and levels 1..l of column i: the sequence the level-l
        guess of column i was predicted after, in position order.
        """
        return window_visibility(self.width, len(self.levels))

    def advance(self, new_guesses: Sequence[int]) -> list[list[int]]:
        """One Jacobi step: the top level's outputs become a new level; returns the n-grams it completed.

        new_guesses: for each column, the target's guess after the column's top-level token. With a full
        window, column i completes the n-gram (levels[0][i], ..., levels[N-2][i], new_guesses[i]) and the
        oldest level is dropped; otherwise the window just grows by one level.
        """
        if len(new_guesses) != self.width:
            raise ValueError(f"need one new guess per column ({self.width}), got {len(new_guesses)}")
        new_level = [int(t) for t in new_guesses]
        completed = []
        if self.full:
            completed = [[level[i] for level in self.levels] + [new_level[i]] for i in range(self.width)]
            self.levels = self.levels[1:]
        self.levels = self.levels + [new_level]
        return completed


@functools.cache
def window_visibility(width: int, levels: int) -> torch.Tensor:
    """The lookahead branch's (rows, rows) visibility for a window of `width` columns and `levels` levels.

    It depends only on the window's shape, so it is built once per shape (see `LookaheadWindow.visibility`).
    Callers must not modify the returned tensor.
    """
    visible = torch.zeros(levels * width, levels * width, dtype=torch.bool)
    for level in range(levels):
        for column in range(width):
            row = level * width + column
            visible[row, : column + 1] = True  # level 0, columns 0..i
            visible[row, [lower * width + column for lower in range(1, level + 1)]] = True
    return visible


def step_visibility(window: LookaheadWindow, tree: DraftTree) -> torch.Tensor:
    """(slots, slots) bool over one lookahead step's rows: [root, tree nodes..., lookahead rows...].

    The root sees itself; a tree node sees the root and its ancestors (itself included); a lookahead row
    sees the root and the window rows `LookaheadWindow.visibility` names. Branches never see each other.
    """
    nodes, rows = len(tree), len(window.levels) * window.width
    visible = torch.zeros(1 + nodes + rows, 1 + nodes + rows, dtype=torch.bool)
    visible[: 1 + nodes, : 1 + nodes] = tree.visibility().cpu()
    visible[1 + nodes :, 0] = True
    visible[1 + nodes :, 1 + nodes :] = window.visibility()
    return visible


def step_offsets(window: LookaheadWindow, tree: DraftTree) -> torch.Tensor:
    """Positions of one step's rows relative to the root (root 0, node = its depth, window rows as placed)."""
    return torch.tensor([0] + tree.depths.tolist() + window.offsets(), dtype=torch.long)


class LookaheadDrafter(Drafter):
    """Lookahead decoding as a drafter: the n-gram pool proposes a candidate tree, the Jacobi window rides along.

    window: W, columns of the lookahead branch (Jacobi guesses advanced per forward); ngram: N, the n-gram
    length (the window keeps N - 1 levels; candidates are N - 1 tokens long); pool_size: G, the most
    candidate n-grams kept, and verified, per key token; prompt_ngrams: also seed the pool with the prompt's
    n-grams; seed: seeds the random initial guesses (tokens drawn from the prompt).
    Each step costs one target forward over 1 + (at most G * (N - 1)) + W * (N - 1) rows.
    """

    def __init__(self, window: int = 5, ngram: int = 4, pool_size: int = 5, prompt_ngrams: bool = True,
                 seed: int = 0):
        for name, value, least in (("window", window, 1), ("ngram", ngram, 2), ("pool_size", pool_size, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        self.width = window
        self.ngram = ngram
        self.pool_size = pool_size
        self.prompt_ngrams = prompt_ngrams
        self.seed = seed
        self.pool = NgramPool(ngram, pool_size)
        self.window = LookaheadWindow(window, ngram, [])
        self.awaiting_logits = False

    def start(self, state: DecodeState) -> None:
        self.pool = NgramPool(self.ngram, self.pool_size)
        if self.prompt_ngrams:
            self.pool.add_text(state.tokens)
        generator = torch.Generator().manual_seed(self.seed)
        picks = torch.randint(0, state.prompt_length, (self.width,), generator=generator).tolist()
        self.window = LookaheadWindow(self.width, self.ngram, [[state.tokens[i] for i in picks]])
        self.awaiting_logits = False

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        candidates = [c[:max_tokens] for c in self.pool.candidates(state.tokens[-1])]
        tree = candidate_tree(candidates, state.device)
        visible = step_visibility(self.window, tree)
        offsets = step_offsets(self.window, tree)
        slots = len(tree) + 1
        self.awaiting_logits = True
        return Draft(
            tree.tokens, parents=tree.parents,
            extra_tokens=torch.tensor(self.window.tokens(), dtype=torch.long, device=state.device),
            extra_positions=offsets[slots:].to(state.device), extra_mask=visible[slots:].to(state.device),
            info={"candidates": candidates, "levels": [list(level) for level in self.window.levels]},
        )

    def commit(self, state: DecodeState, accepted: int) -> None:
        # Only a forward that carried the window advances it (the loop's last step may skip the drafter).
        if not self.awaiting_logits or state.extra_logits is None:
            return
        self.awaiting_logits = False
        top_level = state.extra_logits[-self.width :]
        for ngram in self.window.advance(top_level.argmax(-1).tolist()):
            self.pool.add(ngram)
