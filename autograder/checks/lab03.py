"""Checks of lab 3 (draft trees): every ancestor in the mask (not only the parent), depth positions (not the
node index), the walk that follows the matching child, the bonus after the deepest accepted node, and Medusa
trees that read each depth's own head. Hidden cases are random trees drawn for every run."""

from __future__ import annotations

import torch

from autograder.checks._common import Check, as_int, as_ints, as_tensor, decode, fixed, require, show

#        root
#      /   |   \
#     0    1    2
#    / \        |
#   3   4       5
#   |   |
#   6   7
PARENTS = [-1, -1, -1, 0, 0, 2, 3, 4]


def random_parents(n: int, generator: torch.Generator) -> list[int]:
    """A random tree of `n` nodes, parents before children (-1: a child of the root)."""
    return [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]


def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i != -1:
        seen.add(i)
        i = parents[i]
    return seen


def judge_mask(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        parents = case["parents"]
        n = len(parents)
        mask = as_tensor(answer, (n, n))
        require(mask.dtype == torch.bool or set(mask.unique().tolist()) <= {0, 1},
                f"tree_attention_mask({parents}) should hold booleans, got {show(mask)}")
        for i in range(n):
            expected, got = ancestors_or_self(parents, i), {j for j in range(n) if bool(mask[i, j])}
            require(got == expected, f"tree_attention_mask({parents}): node {i} should see exactly the nodes "
                                     f"{sorted(expected)}, it sees {sorted(got)}")


def mask_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"parents": PARENTS}] + [{"parents": random_parents(n, generator)} for n in (6, 9, 12)]}


def judge_positions(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["tree_position_ids"](case["parents"], case["start"]).tolist()
        got = as_ints(answer)
        require(got == expected, f"tree_position_ids({case['parents']}, start={case['start']}): expected "
                                 f"{expected}, got {got}")


def position_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"parents": PARENTS, "start": 7}] + [
        {"parents": random_parents(n, generator), "start": int(torch.randint(0, 50, (1,), generator=generator))}
        for n in (7, 11)]}


def judge_walk(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected_path, expected_bonus = ref["verify_tree"](case["tokens"], case["parents"], case["predictions"],
                                                           case["root_prediction"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"verify_tree should return (path, token), got {show(got)}")
        path, token = as_ints(got[0]), as_int(got[1])
        require(path == expected_path, f"verify_tree(tokens={case['tokens']}, parents={case['parents']}, "
                                       f"predictions={case['predictions']}, root_prediction="
                                       f"{case['root_prediction']}): expected the path {expected_path}, got {path}")
        require(token == expected_bonus, f"verify_tree(tokens={case['tokens']}, parents={case['parents']}, "
                                         f"predictions={case['predictions']}, root_prediction="
                                         f"{case['root_prediction']}): after the path {path} the next token is "
                                         f"{expected_bonus}, got {token}")


def walk_cases(generator: torch.Generator, ref: dict, bonus: bool) -> dict:
    tokens = [10, 11, 12, 13, 14, 15, 16, 17]
    if bonus:
        cases = [{"tokens": tokens, "parents": PARENTS, "predictions": [13, 0, 15, 16, 0, 42, 33, 0],
                  "root_prediction": 12}]
    else:  # the target wants 10, then 14 (the SECOND child of node 0), then 17; and a root nothing matches
        cases = [{"tokens": tokens, "parents": PARENTS, "predictions": [14, 0, 0, 0, 17, 0, 0, 21],
                  "root_prediction": r} for r in (10, 99)]
    for n in (9, 14):
        parents = random_parents(n, generator)
        node_tokens = (torch.randperm(50, generator=generator)[:n] + 100).tolist()
        predictions = torch.randint(100, 150, (n,), generator=generator).tolist()
        leaf = int(torch.randint(0, n, (1,), generator=generator))
        path = sorted(ancestors_or_self(parents, leaf))
        for parent, child in zip(path, path[1:], strict=False):
            predictions[parent] = node_tokens[child]  # the target agrees along a random root-to-leaf path
        cases.append({"tokens": node_tokens, "parents": parents, "predictions": predictions,
                      "root_prediction": node_tokens[path[0]]})
    return {"cases": cases}


def judge_medusa(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        choices = [tuple(c) for c in case["choices"]]
        expected = ref["medusa_tree"](case["head_top"], choices)
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"medusa_tree should return (tokens, parents), got "
                                                         f"{show(got)}")
        tokens, parents = as_ints(got[0]), as_ints(got[1])
        require(tokens == expected[0], f"medusa_tree(head_top={case['head_top']}, choices={case['choices']}): "
                                       f"expected the tokens {expected[0]}, got {tokens}")
        require(parents == expected[1], f"medusa_tree(head_top={case['head_top']}, choices={case['choices']}): "
                                        f"expected the parents {expected[1]}, got {parents}")


def medusa_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"head_top": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
              "choices": [[0], [1], [2], [0, 0], [0, 2], [1, 1], [0, 2, 1]]}]
    head_top = torch.randperm(40, generator=generator)[:12].reshape(3, 4).tolist()
    choices = [[0], [1], [3], [0, 1], [0, 3], [1, 0], [0, 1, 2], [0, 3, 0]]
    cases.append({"head_top": head_top, "choices": choices})
    return {"cases": cases}


CHECKS = {
    "test_mask": Check("tree_attention_mask", fixed({"cases": [{"parents": [-1, 0]}]}), judge_mask,
                       "tree_attention_mask on the visible two-node chain"),
    "test_mask_hidden": Check("tree_attention_mask", mask_cases, judge_mask,
                              "tree_attention_mask on an 8-node tree and random trees"),
    "test_positions": Check("tree_position_ids", fixed({"cases": [{"parents": [-1, 0], "start": 10}]}),
                            judge_positions, "tree_position_ids on the visible case"),
    "test_positions_hidden": Check("tree_position_ids", position_cases, judge_positions,
                                   "tree_position_ids on an 8-node tree and random trees"),
    "test_verify_tree": Check(
        "verify_tree", fixed({"cases": [{"tokens": [7, 8], "parents": [-1, 0], "predictions": [8, 9],
                                         "root_prediction": 7}]}), judge_walk, "verify_tree on the visible case"),
    "test_verify_tree_hidden": Check("verify_tree", lambda g, ref: walk_cases(g, ref, bonus=False), judge_walk,
                                     "verify_tree's walk on an 8-node tree and random trees"),
    "test_verify_tree_bonus_hidden": Check("verify_tree", lambda g, ref: walk_cases(g, ref, bonus=True), judge_walk,
                                           "the token after the deepest accepted node"),
    "test_medusa": Check("medusa_tree", fixed({"cases": [{"head_top": [[4, 5], [6, 7]],
                                                          "choices": [[0], [1], [0, 0]]}]}),
                         judge_medusa, "medusa_tree on the visible case"),
    "test_medusa_hidden": Check("medusa_tree", medusa_cases, judge_medusa,
                                "medusa_tree with three heads and a random four-guess tree"),
}
