"""Probes of lab 4 (EAGLE drafting). Each returns one plain answer per case; nothing here judges.

Heads are built with the lab's own `EagleHead(seed, feature_share)`, so the checker can build the same head.
The loop probes follow the greedy output the checker sent and record the student's draft at every step; the
checker re-verifies those drafts itself."""

from __future__ import annotations

import torch
from specdec_probe import call, get, tensor


def eagle_training_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_training_pairs")
    return [call(f, tensor(c["features"]), tensor(c["tokens"], torch.long)) for c in inputs["cases"]]


def lab_head(ns: dict, case: dict):
    """The lab's head, or a seeded one of the lab's own construction when the case names a seed."""
    if "head_seed" not in case:
        return get(ns, "head")
    return get(ns, "EagleHead")(seed=case["head_seed"], feature_share=case["feature_share"])


def head_forward(ns: dict, inputs: dict) -> list:
    """Each case feeds its chunks one after the other into one new head cache: the outputs of every chunk."""
    f = get(ns, "head_forward")

    def one(case: dict) -> list:
        head = lab_head(ns, case)
        cache = head.new_cache()
        return [f(head, tensor(chunk["features"]), tensor(chunk["tokens"], torch.long),
                  tensor(chunk["positions"], torch.long), cache) for chunk in case["chunks"]]

    with torch.no_grad():
        return [call(one, case) for case in inputs["cases"]]


def eagle_chain(ns: dict, inputs: dict) -> list:
    f, features = get(ns, "eagle_chain"), get(ns, "target_features")
    with torch.no_grad():
        return [call(lambda c: f(lab_head(ns, c), features(c["tokens"][:-1]), list(c["tokens"]), c["k"]), case)
                for case in inputs["cases"]]


def select_nodes(ns: dict, inputs: dict) -> list:
    f = get(ns, "select_nodes")
    return [call(f, list(c["parents"]), list(c["scores"]), c["budget"]) for c in inputs["cases"]]


def dynamic_tree(ns: dict, inputs: dict) -> list:
    f, features = get(ns, "dynamic_tree"), get(ns, "target_features")
    with torch.no_grad():
        return [call(lambda c: f(lab_head(ns, c), features(c["tokens"][:-1]), list(c["tokens"]), depth=c["depth"],
                                 top_k=c["top_k"], budget=c["budget"]), case) for case in inputs["cases"]]


def accepted_in(draft, parents, wanted: list[int]) -> int:
    """How many of `wanted` the draft (a chain, or a tree with `parents`) matches from its root: greedy rules."""
    node, count = -1, 0
    while count < len(wanted):
        node = next((i for i in range(len(draft)) if parents[i] == node and int(draft[i]) == wanted[count]), None)
        if node is None:
            break
        count += 1
    return count


def loop(ns: dict, inputs: dict, propose) -> dict:
    """The drafts proposed along the greedy output `inputs["greedy"]`, keyed by how many tokens were emitted."""
    features, prompt, wanted = get(ns, "target_features"), list(inputs["prompt"]), list(inputs["greedy"])
    emitted, steps = 0, []
    while emitted < len(wanted):
        context = prompt + wanted[:emitted]
        draft = propose(features(context[:-1]), context)
        tokens, parents = draft if isinstance(draft, tuple) else (draft, list(range(-1, len(draft) - 1)))
        tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
        steps.append({"at": emitted, "tokens": tokens, "parents": parents})
        emitted += accepted_in(tokens, parents, wanted[emitted:]) + 1
    return {"steps": steps}


def chain_loop(ns: dict, inputs: dict) -> dict:
    f, head = get(ns, "eagle_chain"), get(ns, "head")
    with torch.no_grad():
        return call(loop, ns, inputs, lambda feats, context: list(f(head, feats, context, inputs["k"])))


def tree_loop(ns: dict, inputs: dict) -> dict:
    f, head = get(ns, "dynamic_tree"), get(ns, "head")

    def propose(feats, context):
        tokens, parents = f(head, feats, context, inputs["depth"], inputs["top_k"], inputs["budget"])
        return list(tokens), list(parents)

    with torch.no_grad():
        return call(loop, ns, inputs, propose)

