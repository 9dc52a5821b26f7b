"""Checks of lab 4 (EAGLE drafting): the feature/token shift, rolling the head on its own features, ranking by
cumulative score with renumbered parents, and the EAGLE-2 dynamic tree (frontier pruned to top_k, nodes ranked
by path probability). Hidden cases use random features and settings drawn for every run."""

from __future__ import annotations

import torch

from autograder.checks._common import Check, as_ints, as_tensor, decode, fixed, require, require_close, show

D = 16  # the lab's feature size


def judge_pairs(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        features, tokens = torch.tensor(case["features"]), torch.tensor(case["tokens"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, "eagle_training_pairs should return three tensors, got "
                                                         f"{show(got)}")
        n = len(tokens)
        require_close(got[0], features[:-1], f"the input features for {n} positions (those of positions 0 .. n - 2)")
        got_tokens = as_tensor(got[1], (n - 1,))
        require(got_tokens.tolist() == tokens[1:].tolist(), f"tokens {tokens.tolist()}: the token paired with the "
                                                            f"feature at position i is the token at i + 1, expected "
                                                            f"{tokens[1:].tolist()}, got {got_tokens.tolist()}")
        require_close(got[2], features[1:], f"the target features for {n} positions (those of positions 1 .. n - 1)")


def pairs_cases(generator: torch.Generator, ref: dict) -> dict:
    n = int(torch.randint(5, 9, (1,), generator=generator))
    return {"cases": [{"features": torch.arange(12.0).reshape(6, 2).tolist(), "tokens": [10, 11, 12, 13, 14, 15]},
                      {"features": torch.randn(n, D, generator=generator).tolist(),
                       "tokens": torch.randperm(32, generator=generator)[:n].tolist()}]}


def judge_chain(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        with torch.no_grad():
            expected = ref["eagle_chain"](torch.tensor(case["feature"]), case["token"], case["k"])
        got = as_ints(answer)
        require(got == expected, f"eagle_chain(feature, token={case['token']}, k={case['k']}): expected {expected}, "
                                 f"got {got}")


def chain_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"feature": torch.randn(D, generator=generator).tolist(),
                       "token": int(torch.randint(0, 32, (1,), generator=generator)), "k": 5} for _ in range(3)]}


def judge_select(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        expected = ref["select_nodes"](case["parents"], case["scores"], case["budget"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"select_nodes should return (kept, parents), got "
                                                         f"{show(got)}")
        kept, parents = as_ints(got[0]), as_ints(got[1])
        label = f"select_nodes(parents={case['parents']}, scores={show(case['scores'])}, budget={case['budget']})"
        require(kept == expected[0], f"{label}: expected the nodes {expected[0]}, got {kept}")
        require(parents == expected[1], f"{label}: expected the renumbered parents {expected[1]}, got {parents}")


def select_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = [{"parents": [-1, -1, 0, 0, 1, 2, 3], "scores": [-0.2, -1.0, -0.5, -0.9, -1.5, -0.7, -2.0],
              "budget": 4}]
    for n in (8, 12):
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, n)]
        scores: list[float] = []
        for parent in parents:  # cumulative: a child never beats its parent
            step = -float(torch.rand(1, generator=generator)) * 2
            scores.append(round(step + (scores[parent] if parent != -1 else 0.0), 4))
        cases.append({"parents": parents, "scores": scores, "budget": n // 2})
    return {"cases": cases}


def judge_tree(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        with torch.no_grad():
            expected = ref["dynamic_tree"](torch.tensor(case["feature"]), case["token"], depth=case["depth"],
                                           top_k=case["top_k"], budget=case["budget"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2, f"dynamic_tree should return (tokens, parents), got "
                                                         f"{show(got)}")
        tokens, parents = as_ints(got[0]), as_ints(got[1])
        label = f"dynamic_tree(depth={case['depth']}, top_k={case['top_k']}, budget={case['budget']})"
        require((tokens, parents) == (list(expected[0]), list(expected[1])),
                f"{label}: expected tokens {list(expected[0])} with parents {list(expected[1])}, got tokens "
                f"{tokens} with parents {parents}")


def tree_visible_case() -> dict:
    return {"cases": [{"feature": [0.0] * D, "token": 3, "depth": 3, "top_k": 2, "budget": 5}]}


def judge_tree_visible(inputs: dict, answers: list, ref: dict) -> None:
    got = decode(answers[0])
    require(isinstance(got, list) and len(got) == 2, f"dynamic_tree should return (tokens, parents), got {show(got)}")
    tokens, parents = as_ints(got[0]), as_ints(got[1])
    require(len(tokens) == 5 and len(parents) == 5 and parents[0] == -1,
            f"a tree of budget 5 should have 5 tokens and 5 parents, the first a child of the root; got tokens "
            f"{tokens} and parents {parents}")


def tree_cases(generator: torch.Generator, ref: dict) -> dict:
    # deep trees with a budget larger than top_k: only a frontier pruned to top_k gives EAGLE-2's tree
    settings = [(4, 3, 8), (3, 2, 6), (5, 2, 9), (4, 3, 12)]
    return {"cases": [{"feature": torch.randn(D, generator=generator).tolist(),
                       "token": int(torch.randint(0, 32, (1,), generator=generator)),
                       "depth": depth, "top_k": top_k, "budget": budget} for depth, top_k, budget in settings]}


CHECKS = {
    "test_pairs": Check(
        "eagle_training_pairs", lambda g, ref: {"cases": [{"features": torch.randn(5, D, generator=g).tolist(),
                                                          "tokens": list(range(5))}]},
        lambda inputs, answers, ref: require(
            isinstance(got := decode(answers[0]), list) and len(got) == 3
            and [tuple(as_tensor(t).shape) for t in got] == [(4, D), (4,), (4, D)],
            f"eagle_training_pairs on 5 positions should return shapes (4, {D}), (4,), (4, {D}), got {show(got)}"),
        "eagle_training_pairs' shapes on the visible case"),
    "test_pairs_hidden": Check("eagle_training_pairs", pairs_cases, judge_pairs,
                               "eagle_training_pairs on numbered and random features"),
    "test_chain": Check(
        "eagle_chain", fixed({"cases": [{"feature": [0.0] * D, "token": 3, "k": 4}]}),
        lambda inputs, answers, ref: require(len(got := as_ints(answers[0])) == 4 and all(0 <= t < 32 for t in got),
                                             f"eagle_chain(k=4) should return 4 token ids, got {got}"),
        "eagle_chain's length on the visible case"),
    "test_chain_hidden": Check("eagle_chain", chain_cases, judge_chain, "eagle_chain from random features"),
    "test_select": Check("select_nodes", fixed({"cases": [{"parents": [-1, -1, 0], "scores": [-0.1, -3.0, -0.5],
                                                           "budget": 2}]}),
                         judge_select, "select_nodes on the visible case"),
    "test_select_hidden": Check("select_nodes", select_cases, judge_select,
                                "select_nodes on a hand-made and random scored trees"),
    "test_dynamic_tree": Check("dynamic_tree", fixed(tree_visible_case()), judge_tree_visible,
                               "dynamic_tree's size on the visible case"),
    "test_dynamic_tree_hidden": Check("dynamic_tree", tree_cases, judge_tree,
                                      "dynamic_tree from random features, deep trees with pruned frontiers"),
}
