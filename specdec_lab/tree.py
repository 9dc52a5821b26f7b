"""Draft trees: many candidate continuations verified by ONE target forward.

A chain drafter proposes one continuation; a tree drafter proposes several that share prefixes, e.g.

    root ── def ── __init__ ── (
        │       └─ main
        └─ class ── Foo

The root is the last committed token (it is not in the target's KV cache yet, so the target forward starts
with it); every other node is a candidate token whose parent is the token before it. The target sees the
nodes flattened into one sequence ("slots": slot 0 = the root, slot i + 1 = node i) with

- an attention mask that lets each slot attend to the whole cached prefix and to its own ancestors (itself
  included) and to nothing else, so siblings and cousins never see each other;
- position ids `past_length + depth`, so each node gets the rotary position it would have in a chain.

Then the logits of slot i + 1 are exactly the logits plain decoding would compute after the root-to-node
path of node i (tests/test_tree.py checks this), and one forward scores every path in the tree.

`sparse_tree` builds the Medusa paper's tree shape from measured per-head accuracies.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """Candidate tokens arranged as a tree hanging below the root (the last committed token).

    tokens: (n,) the candidate ids; parents: (n,) the index of each node's parent node, -1 for a child of
    the root, always smaller than the node's own index (parents come first); depths: (n,) 1 for children
    of the root, parent's depth + 1 otherwise (the node's offset from the root's position).
    Build one with `DraftTree.from_parents` or `DraftTree.chain`, which check and fill in the depths.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor

    @classmethod
    def from_parents(cls, tokens: torch.Tensor, parents: torch.Tensor | Sequence[int]) -> DraftTree:
        """A tree from its tokens and parent indices (see the class docstring for the conventions)."""
        parent_list = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
        if len(parent_list) != len(tokens):
            raise ValueError(f"a draft tree needs one parent per token: {len(tokens)} tokens, "
                             f"{len(parent_list)} parents")
        depths: list[int] = []
        for i, parent in enumerate(parent_list):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must be -1 (the root) or an earlier "
                                 "node index, so that parents come before their children")
            depths.append(1 if parent < 0 else depths[parent] + 1)
        device = tokens.device
        return cls(tokens, torch.tensor(parent_list, dtype=torch.long, device=device),
                   torch.tensor(depths, dtype=torch.long, device=device))

    @classmethod
    def chain(cls, tokens: torch.Tensor) -> DraftTree:
        """The tree of a plain chain draft: node i's parent is node i - 1."""
        return cls.from_parents(tokens, list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        """Length of the longest root-to-leaf path (0 for an empty tree)."""
        return int(self.depths.max()) if len(self) else 0

    def children(self) -> list[list[int]]:
        """Children of every slot, in node order: entry 0 lists the root's children, entry i + 1 node i's."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for node, parent in enumerate(self.parents.tolist()):
            kids[parent + 1].append(node)
        return kids

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (inclusive); empty for the root (-1)."""
        parents = self.parents.tolist()
        path = []
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path, as lists of node indices (leaves in node order)."""
        kids = self.children()
        return [self.path_to(node) for node in range(len(self)) if not kids[node + 1]]

    def visibility(self) -> torch.Tensor:
        """(n + 1, n + 1) bool over slots: entry [i, j] says slot i may attend to slot j (j is i or its ancestor).

        The tensor is cached per tree shape and shared: copy it before modifying it.
        """
        return slot_visibility(tuple(self.parents.tolist())).to(self.tokens.device)

    def position_ids(self, past_length: int) -> torch.Tensor:
        """(1, n + 1) position ids of the slots: the root sits at `past_length`, a node at past_length + depth."""
        offsets = torch.cat([self.depths.new_zeros(1), self.depths])
        return (past_length + offsets)[None]

    def attention_mask(self, past_length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(1, 1, n + 1, past_length + n + 1) additive mask: 0 where a slot may attend, dtype-min elsewhere.

        past_length: tokens already in the target's KV cache (all of them are visible to every slot);
        dtype: the target's compute dtype (the mask is added to its attention scores).
        """
        return additive_mask(self.visibility(), past_length, dtype)


@functools.lru_cache(maxsize=256)
def slot_visibility(parents: tuple[int, ...]) -> torch.Tensor:
    """The (n + 1, n + 1) bool visibility of a tree given by its parent indices (see `DraftTree.visibility`).

    Cached, because a drafter with a fixed tree shape (Medusa) asks for the same one at every step; the
    returned tensor is shared, so callers must not modify it in place.
    """
    seen = [[0]]  # the slots each slot may see: its parent's, plus itself
    for node, parent in enumerate(parents):
        seen.append(seen[parent + 1] + [node + 1])
    rows = [slot for slot, visible_slots in enumerate(seen) for _ in visible_slots]
    cols = [visible_slot for visible_slots in seen for visible_slot in visible_slots]
    visible = torch.zeros(len(seen), len(seen), dtype=torch.bool)
    visible[rows, cols] = True
    return visible


def additive_mask(visible: torch.Tensor, past_length: int, dtype: torch.dtype) -> torch.Tensor:
    """Turn a (q, k) bool visibility over the new tokens into the 4D additive mask a Llama forward takes.

    visible: which new tokens each new token may see; past_length: cached tokens, visible to every row;
    dtype: the mask's dtype (the model's). Returns shape (1, 1, q, past_length + k), 0 or dtype-min.
    """
    rows = visible.shape[0]
    allowed = torch.cat([visible.new_ones(rows, past_length), visible], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


# --- The Medusa paper's sparse tree -------------------------------------------------------------------------
# A node of a Medusa tree is named by its "choices" (r_1, ..., r_d): the r_1-th best token of head 1, then
# the r_2-th best of head 2, and so on. If a_k(r) is the measured probability that head k's r-th choice is
# the right token, the node is reached (accepted) with probability about a_1(r_1) * ... * a_d(r_d), and the
# expected number of accepted tokens is the sum of that product over the nodes. Adding nodes greedily by that
# product, best first, gives the best tree of a given size (the product never grows along a path, so a node's
# parent is always added before it).


def sparse_tree(accuracies: Sequence[Sequence[float]], budget: int) -> list[tuple[int, ...]]:
    """The Medusa sparse tree: the `budget` choice-tuples with the highest products of head accuracies.

    accuracies: accuracies[k][r] = measured probability that head k's r-th most likely token (r = 0 is the
    top-1) is the correct one (from validation data); budget: number of nodes (root excluded).
    Returns the choice-tuples in breadth-first order (parents before children).
    """
    if budget < 0:
        raise ValueError(f"the tree budget (number of nodes) must be >= 0, got {budget}")
    acc = [list(map(float, head)) for head in accuracies]
    if any(not 0 <= a <= 1 for head in acc for a in head):
        raise ValueError("head accuracies must be probabilities in [0, 1]")
    frontier = [(-a, (r,)) for r, a in enumerate(acc[0])] if acc else []
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < budget:
        negative_value, node = heapq.heappop(frontier)
        chosen.append(node)
        if len(node) < len(acc):
            for r, a in enumerate(acc[len(node)]):
                heapq.heappush(frontier, (negative_value * a, node + (r,)))
    return sorted(chosen, key=lambda node: (len(node), node))


def sampled_tree_shape(nodes: int, depth: int, branching: int, alpha: float) -> list[tuple[int, ...]]:
    """The shape of a sampled draft tree, as choice-tuples: (r_1, ..., r_d) = the r_d-th child drawn (without
    replacement) below the node (r_1, ..., r_{d-1}).

    A node's children are drawn from the drafter's q, so ranks say in which order they were drawn, not how
    likely they are. The shape uses the simplest model of that: every drawn child is accepted with the same
    probability `alpha` when it is tried, so the r-th child is the accepted one with probability
    alpha * (1 - alpha)^r; `sparse_tree` then keeps the `nodes` most valuable positions. A high alpha buys
    depth, a low one breadth. Because the shape is fixed before anything is drawn, every node's number of
    children is known before its children are drawn, which losslessness needs (see `EagleDrafter`).

    nodes: the tree's budget (nodes below the root); depth: the longest path; branching: most children per
    node; alpha: the assumed acceptance of one tried child, in (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha (the assumed acceptance of one drawn child) must lie in (0, 1), got {alpha!r}")
    if depth < 1 or branching < 1:
        raise ValueError(f"depth and branching must be >= 1, got depth={depth}, branching={branching}")
    return sparse_tree([[alpha * (1 - alpha) ** r for r in range(branching)]] * depth, nodes)


def expected_accepted(choices: Sequence[tuple[int, ...]], accuracies: Sequence[Sequence[float]]) -> float:
    """Expected tokens per step of a Medusa tree under the independence model: 1 + sum of node products."""
    return 1.0 + sum(math.prod(accuracies[k][r] for k, r in enumerate(node)) for node in choices)


def choices_to_parents(choices: Sequence[tuple[int, ...]]) -> list[int]:
    """Parent node indices of a breadth-first list of choice-tuples (-1 for the root's children).

    choices: as returned by `sparse_tree`; every prefix of a tuple must appear earlier in the list.
    """
    index = {node: i for i, node in enumerate(choices)}
    parents = []
    for i, node in enumerate(choices):
        parent = index.get(node[:-1], -1) if len(node) > 1 else -1
        if len(node) > 1 and not 0 <= parent < i:
            raise ValueError(f"choice {node} appears before (or without) its parent {node[:-1]}")
        parents.append(parent)
    return parents
