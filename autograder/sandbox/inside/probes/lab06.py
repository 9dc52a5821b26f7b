"""Probes of lab 6 (training a drafter). Each returns plain answers; nothing here judges or measures.

Every probe whose student code uses the setup's `target` first resets it to the setup's weights, which the
checker sends (a notebook cell that changed the target, such as a training function that did not freeze it,
then costs only its own check), with its weights requiring gradients as the setup leaves them (freezing it is
the training function's job), and restores it afterwards. The training probes run the student's training
function on a fresh head built from the lab's own class and the checker's seed, never on a head the notebook
left in its namespace (a scratch cell that rebinds `eagle_head` or `medusa_heads` changes nothing), and send
back what the function returned (the losses) with the raw weights of the head it trained and, when asked, of
the target after the call. Whether anything was learned, whether the losses belong to those weights and
whether the target stayed frozen is measured by the checker, outside the sandbox, from these weights.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from specdec_probe import call, get, tensor


def batch(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return tensor(case["tokens"], torch.long), tensor(case["mask"], torch.bool)


def medusa_block(ns: dict, inputs: dict) -> list:
    f = get(ns, "medusa_block")
    return [call(f, tensor(c["hidden"]), tensor(c["weight"]), tensor(c["bias"])) for c in inputs["cases"]]


def medusa_labels(ns: dict, inputs: dict) -> list:
    f = get(ns, "medusa_labels")
    return [call(f, *batch(c), c["k"]) for c in inputs["cases"]]


def medusa_loss(ns: dict, inputs: dict) -> list:
    f = get(ns, "medusa_loss")
    return [call(f, tensor(c["logits"]), *batch(c)) for c in inputs["cases"]]


@contextmanager
def setup_target(ns: dict, inputs: dict) -> Iterator[torch.nn.Module]:
    """The notebook's `target` holding the setup's weights (`inputs["target"]`: name -> float32 bytes and shape)
    while the block runs; afterwards the same weights again and the flags it had."""
    target = get(ns, "target")
    sent = inputs["target"]
    weights = {}
    for name in target.state_dict():
        if name not in sent:
            raise ValueError(f"the target has a weight {name!r} the setup's target does not have")
        raw = bytearray(base64.b64decode(sent[name]["b64"]))
        weights[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(sent[name]["shape"])
    flags = [p.requires_grad for p in target.parameters()]
    load(target, weights)
    target.requires_grad_(True)
    try:
        yield target
    finally:
        load(target, weights)
        for parameter, flag in zip(target.parameters(), flags, strict=True):
            parameter.requires_grad_(flag)


def load(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in module.state_dict().items():
            value.copy_(weights[name])


def trained(ns: dict, inputs: dict, train, make_head, case: dict) -> tuple[dict, torch.nn.Module]:
    """The student's `train` run on a fresh head of `make_head()` with the case's keyword arguments: the plain
    answer (losses returned, the head's raw weights, the target's when the case asks) and the head itself."""
    with setup_target(ns, inputs) as target:
        head = make_head()
        answer = {"losses": call(train, head, **case["kwargs"]), "head": call(head.state_dict)}
        if case.get("frozen"):
            answer["target"] = call(target.state_dict)
    return answer, head


def train_medusa(ns: dict, inputs: dict) -> list:
    f, heads = get(ns, "train_medusa"), get(ns, "MedusaHeads")
    return [trained(ns, inputs, f, lambda c=c: heads(num_heads=c["heads"]), c)[0] for c in inputs["cases"]]


def medusa_accuracy_trained(ns: dict, inputs: dict) -> list:
    """The visible case: heads trained by the student's `train_medusa` as the answer cell trains `medusa_heads`,
    then the student's `medusa_accuracy` of them on the sentences sent."""
    train, heads, accuracy = get(ns, "train_medusa"), get(ns, "MedusaHeads"), get(ns, "medusa_accuracy")
    out = []
    for c in inputs["cases"]:
        answer, head = trained(ns, inputs, train, lambda c=c: heads(num_heads=c["heads"]), c)
        with setup_target(ns, inputs):
            answer["accuracy"] = call(accuracy, head, [list(s) for s in c["sentences"]])
        out.append(answer)
    return out


def medusa_accuracy(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "medusa_accuracy"), get(ns, "MedusaHeads")
    out = []
    for c in inputs["cases"]:
        heads = make(num_heads=len(c["weights"]))
        with torch.no_grad():
            for block, (weight, bias) in zip(heads.blocks, c["weights"], strict=True):
                block.weight.copy_(tensor(weight))
                block.bias.copy_(tensor(bias))
        with setup_target(ns, inputs):
            out.append(call(f, heads, [list(s) for s in c["sentences"]]))
    return out


def eagle_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_pairs")
    return [call(f, tensor(c["features"]), *batch(c)) for c in inputs["cases"]]


def mtp_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "mtp_pairs")
    return [call(f, tensor(c["states"]), *batch(c), c["depth"]) for c in inputs["cases"]]


def eagle_loss(ns: dict, inputs: dict) -> list:
    f, head = get(ns, "eagle_loss"), get(ns, "EagleHead")
    with setup_target(ns, inputs):
        return [call(f, head(seed=c["seed"]), tensor(c["features"]), *batch(c), w_token=c["w_token"])
                for c in inputs["cases"]]


def train_eagle(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "train_eagle"), get(ns, "EagleHead")
    return [trained(ns, inputs, f, lambda c=c: make(seed=c["head_seed"]), c)[0] for c in inputs["cases"]]


def ttt_losses(ns: dict, inputs: dict) -> list:
    f, head, fused = get(ns, "ttt_losses"), get(ns, "EagleHead"), get(ns, "fused_features")
    out = []
    for c in inputs["cases"]:
        hidden = tuple(tensor(h) for h in c["hidden"])
        with setup_target(ns, inputs):
            out.append({"fused": call(fused, hidden),
                        "losses": call(f, head(inputs=3, seed=c["seed"]), hidden, *batch(c), c["steps"])})
    return out


def train_eagle3(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "train_eagle3"), get(ns, "EagleHead")
    return [trained(ns, inputs, f, lambda c=c: make(inputs=3, seed=c["head_seed"]), c)[0] for c in inputs["cases"]]
