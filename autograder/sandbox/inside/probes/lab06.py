"""Probes of lab 6 (training a drafter). Each returns plain answers; nothing here judges.

The training probes snapshot the target's weights, run the student's training function on a fresh head,
report how much the target moved and restore it, so a probe never changes what later cells see. Acceptance is
measured with this module's own greedy chain decode loop (the same as the lab's `eagle_decode`).
"""

from __future__ import annotations

import torch
from specdec_probe import call, get, plain, tensor


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


def trained(ns: dict, train, make_head, case: dict) -> dict:
    """Train a fresh head with the student's function; the losses and the largest change of a target weight.

    The target is handed over as the setup left it (its weights require gradients: freezing it is the
    training function's job), and restored afterwards, weights and flags."""
    target = get(ns, "target")
    saved = {name: value.detach().clone() for name, value in target.state_dict().items()}
    flags = [p.requires_grad for p in target.parameters()]
    target.requires_grad_(True)
    head = make_head()
    losses = call(train, head, *case["args"], **case["kwargs"])
    change = max(float((value.detach() - saved[name]).abs().max()) for name, value in target.state_dict().items())
    with torch.no_grad():
        target.load_state_dict(saved)
    for parameter, flag in zip(target.parameters(), flags, strict=True):
        parameter.requires_grad_(flag)
    return {"losses": losses, "target_change": change, "head": head}


def train_medusa(ns: dict, inputs: dict) -> list:
    f, heads = get(ns, "train_medusa"), get(ns, "MedusaHeads")
    out = []
    for c in inputs["cases"]:
        result = trained(ns, f, lambda c=c: heads(num_heads=c["heads"]), c)
        out.append({"losses": result["losses"], "target_change": result["target_change"]})
    return out


def medusa_accuracy_trained(ns: dict, inputs: dict) -> list:
    """The visible case: the notebook's own trained `medusa_heads` on the sentences sent."""
    f = get(ns, "medusa_accuracy")
    return [call(f, get(ns, "medusa_heads"), [list(s) for s in c["sentences"]]) for c in inputs["cases"]]


def medusa_accuracy(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "medusa_accuracy"), get(ns, "MedusaHeads")
    out = []
    for c in inputs["cases"]:
        heads = make(num_heads=len(c["weights"]))
        with torch.no_grad():
            for block, (weight, bias) in zip(heads.blocks, c["weights"], strict=True):
                block.weight.copy_(tensor(weight))
                block.bias.copy_(tensor(bias))
        out.append(call(f, heads, [list(s) for s in c["sentences"]]))
    return out


def eagle_pairs(ns: dict, inputs: dict) -> list:
    f = get(ns, "eagle_pairs")
    return [call(f, tensor(c["features"]), *batch(c)) for c in inputs["cases"]]


def eagle_loss(ns: dict, inputs: dict) -> list:
    f, head = get(ns, "eagle_loss"), get(ns, "EagleHead")
    return [call(f, head(seed=c["seed"]), tensor(c["features"]), *batch(c), w_token=c["w_token"])
            for c in inputs["cases"]]


@torch.no_grad()
def accepted_per_step(ns: dict, head, prompts: list[list[int]], new_tokens: int, k: int,
                      layers: tuple[int, ...]) -> float:
    """Greedy chain decoding with `head`: drafted tokens the target accepted per verification step."""
    target = get(ns, "target")
    lm_head = target.lm_head
    accepted = []
    for prompt in prompts:
        tokens = list(prompt)
        out = target(torch.tensor([tokens]), output_hidden_states=True)
        hidden, logits = out.hidden_states, out.logits
        tokens.append(int(logits[0, -1].argmax()))
        while len(tokens) - len(prompt) < new_tokens:
            feature = head.fuse(torch.cat([hidden[layer][0, len(tokens) - 2] for layer in layers], dim=-1))
            draft, token = [], tokens[-1]
            for _ in range(k):
                feature = head(feature, torch.tensor(token))
                token = int(lm_head(feature).argmax())
                draft.append(token)
            out = target(torch.tensor([tokens + draft]), output_hidden_states=True)
            hidden, logits = out.hidden_states, out.logits
            wanted = logits[0, len(tokens) - 1 :].argmax(-1).tolist()
            n = 0
            while n < k and draft[n] == wanted[n]:
                n += 1
            tokens += draft[:n] + [wanted[n]]
            accepted.append(n)
    return sum(accepted) / len(accepted)


def measure(ns: dict, head, case: dict) -> float | dict:
    try:
        return accepted_per_step(ns, head, case["prompts"], case["new_tokens"], case["k"], tuple(case["layers"]))
    except Exception as error:  # a head the decode loop cannot run is an answer to report
        return {"error": f"{type(error).__name__}: {str(error)[:300]}", "where": "decoding with your head"}


def eagle_acceptance(ns: dict, inputs: dict) -> list:
    """The visible case: the notebook's own trained `eagle_head`, measured here."""
    return [measure(ns, get(ns, "eagle_head"), c) for c in inputs["cases"]]


def train_eagle(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "train_eagle"), get(ns, "EagleHead")
    out = []
    for c in inputs["cases"]:
        result = trained(ns, f, lambda c=c: make(seed=c["head_seed"]), c)
        accepted = measure(ns, result["head"], c) if "error" not in result["losses"] else None
        out.append({"losses": result["losses"], "target_change": result["target_change"], "accepted": accepted})
    return out


def ttt_losses(ns: dict, inputs: dict) -> list:
    f, head, fused = get(ns, "ttt_losses"), get(ns, "EagleHead"), get(ns, "fused_features")
    out = []
    for c in inputs["cases"]:
        hidden = tuple(tensor(h) for h in c["hidden"])
        out.append({"fused": call(fused, hidden),
                    "losses": call(f, head(inputs=3, seed=c["seed"]), hidden, *batch(c), c["steps"])})
    return out


def train_eagle3(ns: dict, inputs: dict) -> list:
    f, make = get(ns, "train_eagle3"), get(ns, "EagleHead")
    out = []
    for c in inputs["cases"]:
        result = trained(ns, f, lambda c=c: make(inputs=3, seed=c["head_seed"]), c)
        out.append(plain({"losses": result["losses"], "target_change": result["target_change"]}))
    return out
