"""Hidden checks of lab 3 (draft trees): ancestors in the mask, depth positions, tree walk, Medusa trees."""

from __future__ import annotations

import torch
from checks._common import require

#        root
#      /   |   \
#     0    1    2
#    / \        |
#   3   4       5
#   |   |
#   6   7
PARENTS = [-1, -1, -1, 0, 0, 2, 3, 4]


def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i != -1:
        seen.add(i)
        i = parents[i]
    return seen


def mask_hidden(tree_attention_mask) -> None:
    """Every ancestor (not only the parent), the node itself, and nothing across branches."""
    mask = tree_attention_mask(list(PARENTS))
    require(isinstance(mask, torch.Tensor) and tuple(mask.shape) == (8, 8), "the mask must have shape (n, n)")
    for i in range(8):
        expected = ancestors_or_self(PARENTS, i)
        got = {j for j in range(8) if bool(mask[i, j])}
        require(got == expected, f"node {i} should see exactly the nodes {sorted(expected)}, it sees {sorted(got)}")


def positions_hidden(tree_position_ids) -> None:
    """Depth plus start (siblings share a position), not the node index."""
    got = tree_position_ids(list(PARENTS), 7)
    require(isinstance(got, torch.Tensor) and got.tolist() == [7, 7, 7, 8, 8, 8, 9, 9],
            "positions must be start + depth, the same for siblings")


def verify_tree_hidden(verify_tree) -> None:
    """The walk follows the matching child (not simply the first), across several levels."""
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    # The target wants 10, then 14 (node 4, the second child of node 0), then 17 (node 7): path 0 -> 4 -> 7.
    predictions = [14, 0, 0, 0, 17, 0, 0, 21]
    path, bonus = verify_tree(tokens, list(PARENTS), predictions, 10)
    require(list(path) == [0, 4, 7], f"the accepted path should be [0, 4, 7], got {list(path)}")
    path, bonus = verify_tree(tokens, list(PARENTS), predictions, 99)
    require(list(path) == [], "no child of the root matches the target: nothing may be accepted")
    require(bonus == 99, "with nothing accepted, the next token is the target's prediction at the root")


def verify_tree_bonus_hidden(verify_tree) -> None:
    """The bonus token is the prediction at the deepest accepted node."""
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    predictions = [13, 0, 15, 16, 0, 42, 33, 0]
    path, bonus = verify_tree(tokens, list(PARENTS), predictions, 12)
    require(list(path) == [2, 5] and bonus == 42,
            "after accepting nodes 2 and 5, the next token must be the target's prediction after node 5")


def medusa_hidden(medusa_tree) -> None:
    """Each depth reads its own head, and deep nodes find their parents."""
    head_top = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    choices = [(0,), (1,), (2,), (0, 0), (0, 2), (1, 1), (0, 2, 1)]
    tokens, parents = medusa_tree(head_top, choices)
    require(list(tokens) == [1, 2, 3, 4, 6, 5, 8], "node tokens must come from the head of their depth")
    require(list(parents) == [-1, -1, -1, 0, 0, 1, 4], "each node's parent is the node of its choice prefix")
