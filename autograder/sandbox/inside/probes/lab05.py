"""Probes of lab 5 (prompt lookup, Jacobi, lookahead). Each calls the student's functions on the checker's inputs
and returns plain data (tokens, pools, offsets and masks); nothing here judges."""

from __future__ import annotations

from specdec_probe import call, get, plain, replaced, served


def suffix_draft(ns: dict, inputs: dict) -> list:
    f = get(ns, "suffix_draft")
    return [call(f, list(c["tokens"]), k=c["k"], max_match=c["max_match"], factor=c["factor"],
                 min_probability=c["min_probability"]) for c in inputs["cases"]]


def prompt_lookup(ns: dict, inputs: dict) -> list:
    f = get(ns, "prompt_lookup")
    return [call(f, list(c["tokens"]), max_ngram=c["max_ngram"], k=c["k"], min_ngram=c["min_ngram"])
            for c in inputs["cases"]]


def jacobi_decode(ns: dict, inputs: dict) -> list:
    f = get(ns, "jacobi_decode")
    return [call(f, list(c["prompt"]), c["n"]) for c in inputs["cases"]]


def jacobi_decode_served(ns: dict, inputs: dict) -> list:
    """jacobi_decode with the lab's `target` (which its `logits_of` reads) pointed at a served model per case."""
    f, answers = get(ns, "jacobi_decode"), []
    for i, case in enumerate(inputs["cases"]):
        with replaced(ns, f, "target", served(inputs, f"case{i}")):
            answers.append(call(f, list(case["prompt"]), case["n"]))
    return answers


def advance_window(ns: dict, inputs: dict) -> list:
    f = get(ns, "advance_window")
    return [call(f, [list(level) for level in c["levels"]], list(c["new_guesses"]), ngram=c["ngram"])
            for c in inputs["cases"]]


def snapshot(pool) -> dict:
    """The pool as plain data: key -> continuations, and whether every continuation is a tuple."""
    if not isinstance(pool, dict):
        return {"unsupported": type(pool).__name__}
    entries = {str(key): plain([list(c) for c in value]) for key, value in pool.items()}
    tuples = all(isinstance(c, tuple) for value in pool.values() for c in value)
    return {"entries": entries, "tuples": tuples}


def update_pool(ns: dict, inputs: dict) -> list:
    """For each case: a fresh pool, `update_pool` once per batch of n-grams, a snapshot after each."""
    f = get(ns, "update_pool")

    def one(case: dict) -> list:
        pool: dict = {}
        after = []
        for batch in case["batches"]:
            f(pool, [list(ngram) for ngram in batch], case["size"])
            after.append(snapshot(pool))
        return after

    return [call(one, case) for case in inputs["cases"]]


def select_candidates(ns: dict, inputs: dict) -> list:
    f = get(ns, "select_candidates")

    def one(case: dict):
        pool = {int(key): [tuple(c) for c in value] for key, value in case["pool"].items()}
        return f(pool, list(case["tokens"]), case["max_len"])

    return [call(one, case) for case in inputs["cases"]]


def pool_and_candidates(ns: dict, inputs: dict) -> dict:
    """The visible test of section 4: the pool after each batch, then the candidates for `tokens`."""
    update, select = get(ns, "update_pool"), get(ns, "select_candidates")

    def run() -> dict:
        pool: dict = {}
        after = []
        for batch in inputs["batches"]:
            update(pool, [list(ngram) for ngram in batch], inputs["size"])
            after.append(snapshot(pool))
        return {"pools": after, "candidates": plain(select(pool, list(inputs["tokens"]), inputs["max_len"]))}

    return call(run)


def lookahead_layout(ns: dict, inputs: dict) -> list:
    f = get(ns, "lookahead_layout")
    return [call(f, list(c["lengths"]), width=c["width"], levels=c["levels"]) for c in inputs["cases"]]
