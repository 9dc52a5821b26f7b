"""Probes of lab 4 (EAGLE drafting). Each returns one plain answer per case; nothing here judges."""

from __future__ import annotations

import torch
from specdec_probe import call, get, tensor


def eagle_training_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_training_pairs")
    return [call(f, tensor(c["features"]), tensor(c["tokens"], torch.long)) for c in inputs["cases"]]


def eagle_chain(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_chain")
    with torch.no_grad():
        return [call(f, tensor(c["feature"]), c["token"], c["k"]) for c in inputs["cases"]]


def select_nodes(ns: dict, inputs: dict) -> list:
    f = get(ns, "select_nodes")
    return [call(f, list(c["parents"]), list(c["scores"]), c["budget"]) for c in inputs["cases"]]


def dynamic_tree(ns: dict, inputs: dict) -> list:
    f = get(ns, "dynamic_tree")
    with torch.no_grad():
        return [call(f, tensor(c["feature"]), c["token"], depth=c["depth"], top_k=c["top_k"], budget=c["budget"])
                for c in inputs["cases"]]
