"""Suffix decoding: model-free drafts from a suffix structure over the prompt and the tokens generated so far.

Prompt lookup (`prompt_lookup.py`) is its ancestor: it copies what followed the *most recent* earlier
occurrence of the latest n-gram, always k tokens. Suffix decoding (Oliaro et al. 2024, vLLM's `suffix`
method; TensorRT-LLM drafts from a suffix automaton the same way) keeps an index of every substring of the
context with how often it occurred, and drafts

    match    = the longest suffix of the context that occurred before with a token after it    (length L)
    budget   = min(k, ceil(factor * L))             # a longer match is a more reliable one: draft further
    repeat while len(draft) < budget:
        x    = the continuation that followed the current string most often (the most recent on ties)
        prob = prob * count(string + x) / count(string followed by anything)   # its empirical probability
        stop if prob < min_probability              # an uncertain continuation ends the draft
        draft.append(x); string = string + x        # (re-matched from a shorter suffix at the depth limit)

The index is a suffix trie cut at `max_depth` (the suffix tree's paths up to that length, uncompressed):
node s counts the occurrences of the token string s. Appending a token touches the nodes of the context's
suffixes up to max_depth - 1 long, so keeping the index current costs O(max_depth) per token; the drafter
feeds it each new token once. The draft is deterministic (q is one-hot), so any chain rule verifies it
losslessly, and greedy output equals target-only greedy decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specdec_lab.drafters.base import DecodeState, Draft, Drafter


@dataclass(eq=False)
class SuffixNode:
    """One token string s in the index: depth = len(s); count: how often s occurred in the context; last: the
    end position of its most recent occurrence; children: the strings s + x that occurred, by token x."""

    depth: int
    count: int = 0
    last: int = -1
    children: dict[int, SuffixNode] = field(default_factory=dict)

    def followers(self) -> int:
        """How many occurrences of s had a token after them (the sum of the children's counts)."""
        return sum(child.count for child in self.children.values())

    def best_child(self) -> tuple[int, SuffixNode]:
        """The most frequent continuation (token, node), the most recent one on ties."""
        return max(self.children.items(), key=lambda item: (item[1].count, item[1].last))


class SuffixIndex:
    """A suffix trie of depth `max_depth` over a growing token sequence, with occurrence counts.

    max_depth: the longest string indexed (matches are at most max_depth - 1 long, leaving room to continue).
    """

    def __init__(self, max_depth: int = 32):
        if not isinstance(max_depth, int) or max_depth < 2:
            raise ValueError(f"max_depth must be an integer >= 2, got {max_depth!r}")
        self.max_depth = max_depth
        self.root = SuffixNode(0)
        self.tokens: list[int] = []
        self.active = [self.root]  # the nodes of the context's suffixes, lengths 0 .. max_depth - 1

    def extend(self, tokens: list[int]) -> None:
        """Append `tokens` to the indexed sequence."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token: every suffix s of the context (up to max_depth - 1 long) gains the occurrence s + token."""
        position = len(self.tokens)
        self.tokens.append(token)
        active = [self.root]
        for node in self.active:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = SuffixNode(node.depth + 1)
            child.count += 1
            child.last = position
            if child.depth < self.max_depth:
                active.append(child)
        self.active = active

    def node(self, string: list[int]) -> SuffixNode | None:
        """The node of a token string (at most max_depth long), or None if it never occurred."""
        node = self.root
        for token in string:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def match(self) -> SuffixNode | None:
        """The longest suffix of the indexed sequence that occurred before with a token after it (its depth is
        the match length), or None when no suffix of at least one token did."""
        return next((node for node in reversed(self.active[1:]) if node.children), None)

    def match_after(self, extra: list[int]) -> SuffixNode | None:
        """Like `match`, for the indexed sequence followed by `extra` (tokens not in the index, e.g. a draft)."""
        tail = (self.tokens + extra)[-(self.max_depth - 1):]
        for start in range(len(tail)):
            node = self.node(tail[start:])
            if node is not None and node.children:
                return node
        return None


class SuffixDrafter(Drafter):
    """Drafts from a suffix index of the prompt and the output so far (see the module docstring).

    k: most tokens per draft; factor: the draft may be at most ceil(factor * match length) long;
    min_probability: stop before the token at which the draft's empirical probability (the product of its
    continuations' frequencies) would fall below this; max_depth: longest indexed string; min_match: shortest
    match worth drafting from.
    """

    drafts_from_prompt = True

    def __init__(self, k: int = 16, factor: float = 2.0, min_probability: float = 0.1, max_depth: int = 32,
                 min_match: int = 1):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (most tokens drafted per step) must be a positive integer, got {k!r}")
        if not factor > 0:
            raise ValueError(f"factor (draft length per matched token) must be positive, got {factor!r}")
        if not 0 <= min_probability < 1:
            raise ValueError(f"min_probability must lie in [0, 1), got {min_probability!r}")
        if not isinstance(max_depth, int) or max_depth < 2:
            raise ValueError(f"max_depth must be an integer >= 2, got {max_depth!r}")
        if not (isinstance(min_match, int) and 1 <= min_match < max_depth):
            raise ValueError(f"min_match must be an integer in [1, max_depth), got {min_match!r}")
        self.k, self.factor, self.min_probability = k, factor, min_probability
        self.max_depth, self.min_match = max_depth, min_match
        self.index = SuffixIndex(max_depth)

    def start(self, state: DecodeState) -> None:
        self.index = SuffixIndex(self.max_depth)

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        self.index.extend(state.tokens[len(self.index.tokens):])
        tokens = self.draft(max_tokens)
        return Draft(torch.tensor(tokens, dtype=torch.long, device=state.device), probs=None)

    def draft(self, max_tokens: int) -> list[int]:
        """The draft after the indexed sequence: at most `max_tokens` ids (see the module docstring)."""
        node = self.index.match()
        if node is None or node.depth < self.min_match:
            return []
        budget = min(self.k, max_tokens, math.ceil(self.factor * node.depth))
        draft: list[int] = []
        probability = 1.0
        while len(draft) < budget:
            if not node.children:  # the depth limit, or the string's only occurrence is the context's end
                node = self.index.match_after(draft)
                if node is None:
                    break
            token, child = node.best_child()
            probability *= child.count / node.followers()
            if probability < self.min_probability:
                break
            draft.append(token)
            node = child
        return draft
