"""Probes of lab 1 (speculative sampling). Each returns one plain answer per case; nothing here judges."""

from __future__ import annotations

import torch
from specdec_probe import call, get, tensor


def process_logits(ns: dict, inputs: dict) -> list:
    f = get(ns, "process_logits")
    return [call(f, tensor(c["logits"]), c["temperature"], c["top_k"]) for c in inputs["cases"]]


def residual(ns: dict, inputs: dict) -> list:
    f = get(ns, "residual")
    return [call(f, tensor(c["p"]), tensor(c["q"])) for c in inputs["cases"]]


def accepted_count(ns: dict, inputs: dict) -> list:
    f = get(ns, "accepted_count")
    return [call(f, tensor(c["tokens"], torch.long), tensor(c["p"]), tensor(c["q"]), tensor(c["u"]))
            for c in inputs["cases"]]


def verify(ns: dict, inputs: dict) -> list:
    f = get(ns, "verify")
    return [call(f, tensor(c["tokens"], torch.long), tensor(c["p"]), tensor(c["q"]),
                 torch.Generator().manual_seed(c["seed"])) for c in inputs["cases"]]


def verify_first_tokens(ns: dict, inputs: dict) -> list:
    """One-token drafts sampled from q, verified by the student's `verify`: the first emitted token of each."""
    f = get(ns, "verify")
    q = tensor(inputs["q"])
    p_rows, q_rows = tensor([inputs["p"], inputs["p"]]), q[None]
    generator = torch.Generator().manual_seed(inputs["seed"])
    firsts = []
    for _ in range(inputs["n"]):
        out = f(torch.multinomial(q, 1, generator=generator), p_rows, q_rows, generator)
        firsts.append(int(list(out)[0]))
    return firsts


def first_token_histogram(ns: dict, inputs: dict) -> list:
    f = get(ns, "first_token_histogram")
    return [call(f, tensor(c["p"]), tensor(c["q"]), c["n"], torch.Generator().manual_seed(c["seed"]))
            for c in inputs["cases"]]


def verify_rejection(ns: dict, inputs: dict) -> dict:
    """The fixed rejection cases, and the first-token distribution over many one-token drafts."""
    return {"cases": verify(ns, inputs), "first": call(verify_first_tokens, ns, inputs["first"])}
