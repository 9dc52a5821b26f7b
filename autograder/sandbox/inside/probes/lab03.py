"""Probes of lab 3 (draft trees). Each returns one plain answer per case; nothing here judges."""

from __future__ import annotations

from specdec_probe import call, get


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
