"""Probes of lab 3 (draft trees). Each returns one plain answer per case; nothing here judges."""

from __future__ import annotations

from collections.abc import Callable

import torch
from specdec_probe import call, get, replaced, served, tensor


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
    """The student's tree logits on the setup's seeded model of each (visible) case."""
    f, build = get(ns, "tree_logits"), get(ns, "tiny_llama")
    return [{"logits": call(f, build(c["seed"]), list(c["context"]), list(c["tokens"]), list(c["parents"]))}
            for c in inputs["cases"]]


def tree_logits_served(ns: dict, inputs: dict) -> list:
    """The student's tree logits on models the trusted side serves (it counts their forwards)."""
    f = get(ns, "tree_logits")
    return [{"logits": call(f, served(inputs, f"case{i}"), list(c["context"]), list(c["tokens"]), list(c["parents"]))}
            for i, c in enumerate(inputs["cases"])]


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


def against_q(real: Callable) -> Callable:
    """`real` (a verify_tree_sampling) made deliberately wrong: it verifies against the draft's own q (the rows
    of p that q covers are replaced by q), so the first child is always accepted and the first emitted token
    follows q, not p. It still returns whatever `real` returns, so the caller's code runs unchanged."""
    def broken(tokens, parents, p, q, *args, **kwargs):
        p, q_rows = torch.as_tensor(p), torch.as_tensor(q)
        q_rows = q_rows[None] if q_rows.dim() == 1 else q_rows
        return real(tokens, parents, torch.cat([q_rows.to(p.dtype), p[len(q_rows):]]), q, *args, **kwargs)

    return broken


def first_token_histogram(ns: dict, inputs: dict) -> list:
    """Per case: the student's counts ("counts"), and their counts when verify_tree_sampling is broken to accept
    the first child ("broken", same seed): counts that come from the verification must then follow q."""
    f, real = get(ns, "first_token_histogram"), get(ns, "verify_tree_sampling")
    answers = []
    for c in inputs["cases"]:
        args = (c["width"], c["n"])
        counts = call(f, tensor(c["p"]), tensor(c["q"]), *args, torch.Generator().manual_seed(c["seed"]))
        with replaced(ns, f, "verify_tree_sampling", against_q(real)):
            broken = call(f, tensor(c["p"]), tensor(c["q"]), *args, torch.Generator().manual_seed(c["seed"]))
        answers.append({"counts": counts, "broken": broken})
    return answers
