"""Probes of lab 1 (speculative sampling). Each returns one plain answer per case; nothing here judges.

The histogram probe also runs the student's `first_token_histogram` with the namespace's `verify` swapped for
a deliberately broken rule (see `specdec_probe.replaced`): a histogram that counts what `verify` emits follows the
broken rule there, one that samples p by itself does not, and the checker tells the two apart."""

from __future__ import annotations

from collections.abc import Callable

import torch
from specdec_probe import call, get, replaced, tensor


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


def verify_repeated(ns: dict, inputs: dict) -> list:
    """Each case's draft verified `n` times by the student's `verify` with one generator: every emitted list."""
    f = get(ns, "verify")

    def repeat(case: dict) -> list:
        tokens, p, q = tensor(case["tokens"], torch.long), tensor(case["p"]), tensor(case["q"])
        generator = torch.Generator().manual_seed(case["seed"])
        return [[int(t) for t in f(tokens.clone(), p.clone(), q.clone(), generator)] for _ in range(case["n"])]

    return [call(repeat, case) for case in inputs["cases"]]


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


def against_q(real: Callable) -> Callable:
    """`real` (a verify function) made deliberately wrong: it verifies every draft against the draft's own q
    (the rows of p that q covers are replaced by q), so every drafted token is accepted and the first emitted
    token follows q, not p. It still returns whatever `real` returns, so the caller's code runs unchanged."""
    def broken(draft_tokens, p, q, *args, **kwargs):
        p, q_rows = torch.as_tensor(p), torch.as_tensor(q)
        q_rows = q_rows[None] if q_rows.dim() == 1 else q_rows
        return real(draft_tokens, torch.cat([q_rows.to(p.dtype), p[len(q_rows):]]), q, *args, **kwargs)

    return broken


def first_token_histogram(ns: dict, inputs: dict) -> list:
    """Per case: the student's counts ("counts"), and their counts when `verify` is broken to accept every
    drafted token ("broken", same seed): counts that come from verify must then follow q."""
    f, real = get(ns, "first_token_histogram"), get(ns, "verify")
    answers = []
    for c in inputs["cases"]:
        counts = call(f, tensor(c["p"]), tensor(c["q"]), c["n"], torch.Generator().manual_seed(c["seed"]))
        with replaced(ns, f, "verify", against_q(real)):
            broken = call(f, tensor(c["p"]), tensor(c["q"]), c["n"], torch.Generator().manual_seed(c["seed"]))
        answers.append({"counts": counts, "broken": broken})
    return answers


def verify_rejection(ns: dict, inputs: dict) -> dict:
    """The fixed rejection cases, and the first-token distribution over many one-token drafts."""
    return {"cases": verify(ns, inputs), "first": call(verify_first_tokens, ns, inputs["first"])}


def verify_block(ns: dict, inputs: dict) -> list:
    f = get(ns, "verify_block")
    return [call(f, tensor(c["tokens"], torch.long), tensor(c["p"]), tensor(c["q"]),
                 torch.Generator().manual_seed(c["seed"])) for c in inputs["cases"]]


def verify_block_lossless(ns: dict, inputs: dict) -> dict:
    """`n` two-token drafts sampled from q, each verified by the student's `verify_block` (one generator for
    drafting and verifying): the drafts and what was emitted."""
    f = get(ns, "verify_block")
    p, q = tensor(inputs["p"]), tensor(inputs["q"])
    generator = torch.Generator().manual_seed(inputs["seed"])

    def run() -> dict:
        drafts, outputs = [], []
        for _ in range(inputs["n"]):
            draft = torch.multinomial(q, 1, generator=generator)[:, 0]
            outputs.append([int(t) for t in f(draft.clone(), p.clone(), q.clone(), generator)])
            drafts.append(draft.tolist())
        return {"drafts": drafts, "outputs": outputs}

    return call(run)
