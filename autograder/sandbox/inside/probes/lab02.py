"""Probes of lab 2 (the decode loop). They drive the student's functions with the lab's own models and report
tokens, distributions and cache lengths as plain data; nothing here judges."""

from __future__ import annotations

import torch
from specdec_probe import call, get, plain, replaced, served


def draft(ns: dict, inputs: dict) -> list:
    f, model, cache_class = get(ns, "draft"), get(ns, "draft_model"), get(ns, "DynamicCache")

    def one(case: dict) -> dict:
        cache = cache_class(config=model.config)
        tokens, q = f(model, cache, list(case["context"]), case["k"], case["temperature"],
                      torch.Generator().manual_seed(case["seed"]))
        return {"tokens": plain(tokens), "q": plain(q), "cache": cache.get_seq_length()}

    return [call(one, case) for case in inputs["cases"]]


def draft_samples(ns: dict, inputs: dict) -> dict:
    """The first drafted token of many one-token drafts (one seed each), and the q row reported the first time."""
    f, model, cache_class = get(ns, "draft"), get(ns, "draft_model"), get(ns, "DynamicCache")
    tokens, first_q = [], None
    for seed in range(inputs["n"]):
        drafted, q = f(model, cache_class(config=model.config), list(inputs["context"]), 1, inputs["temperature"],
                       torch.Generator().manual_seed(inputs["seed"] + seed))
        tokens.append(int(list(drafted)[0]))
        first_q = q[0] if first_q is None else first_q
    return {"tokens": tokens, "q": plain(first_q)}


def other_draft(ns: dict, inputs: dict):
    """A draft model that differs from the target (a seeded random Llama of the lab's shape): it gets rejected
    often, so rollback and verification really matter."""
    other = get(ns, "tiny_llama")(seed=inputs["draft_seed"], hidden=48, layers=2)
    with torch.no_grad():
        other.lm_head.weight.mul_(inputs["draft_sharpness"])
    return other


def step(ns: dict, inputs: dict) -> dict:
    """`steps` speculative steps from `start(context)`: tokens and both caches' lengths after each."""
    start, speculative_step = get(ns, "start"), get(ns, "speculative_step")
    dec = start(list(inputs["context"]), inputs["temperature"], inputs["seed"])
    if "draft_seed" in inputs:
        dec.draft = other_draft(ns, inputs)
        dec.draft_cache = get(ns, "DynamicCache")(config=dec.draft.config)
    after = []
    for _ in range(inputs["steps"]):
        emitted = speculative_step(dec, inputs["k"])
        after.append({"emitted": plain(emitted), "tokens": plain(dec.tokens),
                      "target_cache": dec.target_cache.get_seq_length(),
                      "draft_cache": dec.draft_cache.get_seq_length()})
    return {"steps": after}


def with_served_pair(ns: dict, inputs: dict, work):
    """`work()` with the lab's `target` and `draft_model` (which `start` reads) pointed at the served pair."""
    start = get(ns, "start")
    with replaced(ns, start, "target", served(inputs, "target")), \
            replaced(ns, start, "draft_model", served(inputs, "draft")):
        return work()


def step_checked(ns: dict, inputs: dict) -> dict:
    """The cache run of `step`, then a few steps on the served pair: the tokens each step emitted."""
    start, speculative_step = get(ns, "start"), get(ns, "speculative_step")
    perfect = inputs["perfect"]

    def run() -> list:
        dec = start(list(perfect["context"]), 0.0, 0)
        return [plain(speculative_step(dec, perfect["k"])) for _ in range(perfect["steps"])]

    answer = call(step, ns, inputs)  # {"steps": ...}, or {"error": ...} that the judge reports
    return {**answer, "perfect": call(with_served_pair, ns, inputs, run)}


def first_tokens(ns: dict, inputs: dict) -> dict:
    """The first token of one step after a greedy start, over many seeds, with a draft model that differs from
    the target (a seeded random Llama of the lab's own shape)."""
    start, speculative_step = get(ns, "start"), get(ns, "speculative_step")
    cache_class = get(ns, "DynamicCache")
    other = other_draft(ns, inputs)
    tokens = []
    for seed in range(inputs["n"]):
        dec = start(list(inputs["context"]), 0.0, inputs["seed"] + seed)
        dec.draft, dec.draft_cache, dec.temperature = other, cache_class(config=other.config), inputs["temperature"]
        tokens.append(int(list(speculative_step(dec, inputs["k"]))[0]))
    return {"tokens": tokens}


def generate(ns: dict, inputs: dict) -> list:
    """The student's generate on each case; a case with "draft_seed" drafts with a model that differs from the
    target (the lab's `draft_model` name, which `start` reads, is pointed at it for that call)."""
    f, original = get(ns, "generate"), ns.get("draft_model")
    answers = []
    for case in inputs["cases"]:
        def run(case=case):
            return call(f, list(case["prompt"]), case["max_new_tokens"], k=case["k"],
                        **({"eos": case["eos"]} if "eos" in case else {}))

        if case.get("served"):
            answers.append(with_served_pair(ns, inputs, run))
            continue
        if "draft_seed" in case:
            ns["draft_model"] = other_draft(ns, case)
        try:
            answers.append(run())
        finally:
            ns["draft_model"] = original
    return answers


def measure(ns: dict, inputs: dict) -> list:
    """The student's (alpha, tau) for each case, on the lab's own models."""
    f = get(ns, "measure_alpha_and_tau")
    return [call(f, list(case["prompt"]), case["steps"], k=case["k"]) for case in inputs["cases"]]


def measure_served(ns: dict, inputs: dict):
    """The student's (alpha, tau) of one run on the served pair (a new target and a draft that differs from it),
    whose forwards are counted where they run."""
    f = get(ns, "measure_alpha_and_tau")
    return with_served_pair(ns, inputs, lambda: call(f, list(inputs["prompt"]), inputs["steps"], k=inputs["k"]))


def formulas(ns: dict, inputs: dict) -> dict:
    tokens, speedup = get(ns, "expected_tokens_per_step"), get(ns, "expected_speedup")
    return {"tokens": [call(tokens, c["alpha"], c["k"]) for c in inputs["cases"]],
            "speedup": [call(speedup, c["alpha"], c["k"], c["c"]) for c in inputs["cases"]]}
