"""Probes of lab 4 (EAGLE drafting). Each returns one plain answer per case; nothing here judges.

A case's head is the lab's own trained `head` from the setup (restored before every call) when the case names no
seed, else an untrained head built with the lab's own `EagleHead(seed)`; the checker holds the same heads (it
runs the lab's setup, training included, itself). The drafting probes also return every feature the target's
output layer scored during the student's call (`scored`): the checker turns them into the draft's
probabilities itself and compares them with the reference's, which tells a head fed at the wrong positions
from the method even where the argmax tokens agree. The loop probes compute the greedy continuation here from
the lab's setup and send, per step, the context the drafter saw and its draft; the checker recomputes the
continuation, checks those contexts against it and re-verifies every draft itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from specdec_probe import call, get, plain, tensor

MAX_SCORED = 400  # rows of scored features sent per call (a drafter scores depth x top_k of them, or k)


def eagle_training_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_training_pairs")
    return [call(f, tensor(c["features"]), tensor(c["tokens"], torch.long)) for c in inputs["cases"]]


def lab_head(ns: dict, case: dict):
    """The case's head: the lab's trained `head` when it names no seed, else the lab's `EagleHead(seed)`."""
    seed = case.get("head_seed")
    return get(ns, "head") if seed is None else get(ns, "EagleHead")(seed=seed)


@contextmanager
def scored(ns: dict) -> Iterator[list]:
    """While the block runs, every feature row the target's output layer (`target.lm_head`, which `logits_of`
    is) receives is kept, up to MAX_SCORED rows: the list yielded holds them as tensors (rows, D)."""
    rows: list[torch.Tensor] = []

    def keep(module, args, output) -> None:
        room = MAX_SCORED - sum(len(r) for r in rows)
        if args and isinstance(args[0], torch.Tensor) and room > 0:
            rows.append(args[0].detach().reshape(-1, args[0].shape[-1])[:room].clone())

    handle = get(ns, "target").lm_head.register_forward_hook(keep)
    try:
        yield rows
    finally:
        handle.remove()


def scored_rows(rows: list) -> dict:
    return plain(torch.cat(rows) if rows else torch.zeros(0, 0))


def drafted(ns: dict, run) -> dict:
    """The student's draft from `run()` ("draft", plain) and the features scored while it ran ("scored")."""
    with scored(ns) as rows:
        draft = call(run)
    return {"draft": draft, "scored": scored_rows(rows)}


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
    answers = []
    with torch.no_grad():
        for c in inputs["cases"]:
            head, context = lab_head(ns, c), features(c["tokens"][:-1])
            answers.append(drafted(ns, lambda c=c, head=head, context=context: f(head, context, list(c["tokens"]),
                                                                                 c["k"])))
    return answers


def select_nodes(ns: dict, inputs: dict) -> list:
    f = get(ns, "select_nodes")
    return [call(f, list(c["parents"]), list(c["scores"]), c["budget"]) for c in inputs["cases"]]


def dynamic_tree(ns: dict, inputs: dict) -> list:
    f, features = get(ns, "dynamic_tree"), get(ns, "target_features")
    answers = []
    with torch.no_grad():
        for c in inputs["cases"]:
            head, context = lab_head(ns, c), features(c["tokens"][:-1])
            answers.append(drafted(ns, lambda c=c, head=head, context=context: f(
                head, context, list(c["tokens"]), depth=c["depth"], top_k=c["top_k"], budget=c["budget"])))
    return answers


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
    """Greedy speculative decoding of `inputs["new_tokens"]` after the prompt, along the greedy continuation
    computed here by the lab's `greedy`: per step, the context the drafter saw, its draft and what it scored."""
    features, prompt = get(ns, "target_features"), list(inputs["prompt"])
    wanted = [int(t) for t in get(ns, "greedy")(prompt, inputs["new_tokens"])]
    emitted, steps = 0, []
    while emitted < len(wanted):
        context = prompt + wanted[:emitted]
        context_features = features(context[:-1])
        with scored(ns) as rows:
            draft = propose(context_features, context)
        tokens, parents = draft if isinstance(draft, tuple) else (draft, list(range(-1, len(draft) - 1)))
        tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
        steps.append({"context": context, "tokens": tokens, "parents": parents, "scored": scored_rows(rows)})
        emitted += accepted_in(tokens, parents, wanted[emitted:]) + 1
    return {"steps": steps}


def chain_loop(ns: dict, inputs: dict) -> dict:
    f, head = get(ns, "eagle_chain"), lab_head(ns, inputs)
    with torch.no_grad():
        return call(loop, ns, inputs, lambda feats, context: list(f(head, feats, context, inputs["k"])))


def tree_loop(ns: dict, inputs: dict) -> dict:
    f, head = get(ns, "dynamic_tree"), lab_head(ns, inputs)

    def propose(feats, context):
        tokens, parents = f(head, feats, context, inputs["depth"], inputs["top_k"], inputs["budget"])
        return list(tokens), list(parents)

    with torch.no_grad():
        return call(loop, ns, inputs, propose)
