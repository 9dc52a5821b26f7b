"""Probes of lab 3 (draft trees). Each returns one plain answer per case; nothing here judges."""

from __future__ import annotations

import torch
from specdec_probe import call, get, tensor


def tree_attention_mask(ns: dict, inputs: dict) -> list:
    f = get(ns, "tree_attention_mask")
    return [call(f, list(c["parents"])) for c in inputs["cases"]]


def tree_position_ids(ns: dict, inputs: dict) -> list:
    f = get(ns, "tree_position_ids")
    return [call(f, list(c["parents"]), c["start"]) for c in inputs["cases"]]


def verify_tree(ns: dict, inputs: dict) -> list:
    f = get(ns, "verify_tree")
    return [call(f, list(c["tokens"]), list(c["parents"]), list(c["predictions"]), c["root_prediction"])
            for c in inputs["cases"]]


def medusa_tree(ns: dict, inputs: dict) -> list:
    f = get(ns, "medusa_tree")
    return [call(f, [list(top) for top in c["head_top"]], [tuple(choice) for choice in c["choices"]])
            for c in inputs["cases"]]


def tree_mask_4d(ns: dict, inputs: dict) -> list:
    f = get(ns, "tree_mask_4d")
    return [call(f, list(c["parents"]), c["past"], getattr(torch, c["dtype"])) for c in inputs["cases"]]


def tree_logits(ns: dict, inputs: dict) -> list:
    """The student's tree logits on the setup cell's seeded model, and how often the model ran."""
    f, build = get(ns, "tree_logits"), get(ns, "tiny_llama")
    answers = []
    for c in inputs["cases"]:
        model = build(c["seed"])
        forwards = [0]

        def count(module, args, forwards=forwards):
            forwards[0] += 1

        hook = model.model.layers[0].register_forward_pre_hook(count)
        logits = call(f, model, list(c["context"]), list(c["tokens"]), list(c["parents"]))
        hook.remove()
        answers.append({"logits": logits, "forwards": forwards[0]})
    return answers


def verify_tree_sampling(ns: dict, inputs: dict) -> list:
    f = get(ns, "verify_tree_sampling")
    return [call(f, list(c["tokens"]), list(c["parents"]), tensor(c["p"]), tensor(c["q"]),
                 torch.Generator().manual_seed(c["seed"])) for c in inputs["cases"]]


def sampled_runs(ns: dict, run: dict) -> list:
    """Trees drawn here (children of each level without replacement from that level's q), verified by the
    student's rule `run["n"]` times: the emitted tokens of each run (accepted tokens, then the extra one)."""
    f = get(ns, "verify_tree_sampling")
    widths, p_levels, q_levels = run["widths"], tensor(run["p"]), tensor(run["q"])
    generator = torch.Generator().manual_seed(run["seed"])
    emitted = []
    for _ in range(run["n"]):
        tokens, parents, depth = [], [], []
        frontier = [-1]
        for level, width in enumerate(widths):
            next_frontier = []
            for parent in frontier:
                for token in torch.multinomial(q_levels[level], width, replacement=False, generator=generator):
                    tokens.append(int(token))
                    parents.append(parent)
                    depth.append(level + 1)
                    next_frontier.append(len(tokens) - 1)
            frontier = next_frontier
        levels = [0] + depth  # slot 0 is the root (level 0); slot i + 1 is node i
        p_rows, q_rows = p_levels[levels], q_levels[[min(d, len(widths) - 1) for d in levels]]
        path, token = f(tokens, parents, p_rows, q_rows, generator)
        emitted.append([tokens[int(i)] for i in list(path)] + [int(token)])
    return emitted


def verify_tree_sampling_runs(ns: dict, inputs: dict) -> dict:
    """The fixed cases, and the emitted tokens of many sampled trees."""
    return {"cases": verify_tree_sampling(ns, inputs), "runs": [call(sampled_runs, ns, r) for r in inputs["runs"]]}


def first_token_histogram(ns: dict, inputs: dict) -> list:
    f = get(ns, "first_token_histogram")
    return [call(f, tensor(c["p"]), tensor(c["q"]), c["width"], c["n"], torch.Generator().manual_seed(c["seed"]))
            for c in inputs["cases"]]
