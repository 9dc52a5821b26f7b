"""Checks of lab 6 (training a drafter): Medusa's residual block, shifted labels, loss over heads, training and
per-head accuracy; EAGLE's feature/token pairs, regression plus token loss, training and acceptance in a greedy
decode loop; EAGLE-3's fused features and training-time test.

Hidden cases are drawn for every run: random padded batches (so a loss taken on padding, labels shifted the
wrong way or features paired with the token at their own position show), random head weights and seeds. The
training checks run a few steps of the student's training function on a fresh head and require that the first
loss equals the reference's on the same batch, that the loss falls, and that no weight of the target moved.
"""

from __future__ import annotations

import math

import torch

from autograder.checks._common import Check, Fail, as_float, as_tensor, decode, require, require_close, show

D, VOCAB, PAD, IGNORE = 32, 32, 0, -100


# ----------------------------------------------------------------------------------------------- random cases


def randint(low: int, high: int, generator: torch.Generator) -> int:
    """An integer in [low, high] drawn from `generator`."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))


def padded_batch(generator: torch.Generator, rows: int, shortest: int, longest: int) -> dict:
    """Random right-padded token rows of random lengths (at least one row shorter than the longest)."""
    lengths = [randint(shortest, longest, generator) for _ in range(rows)]
    lengths[0], lengths[-1] = longest, min(lengths[-1], longest - 2)
    tokens = [[1] + torch.randint(2, VOCAB, (n - 1,), generator=generator).tolist() + [PAD] * (longest - n)
              for n in lengths]
    mask = [[True] * n + [False] * (longest - n) for n in lengths]
    return {"tokens": tokens, "mask": mask}


def as_batch(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(case["tokens"]), torch.tensor(case["mask"])


def first_batch(ref: dict, seed: int):
    """The first batch `training_batches(32, seed)` yields (the training checks' first step)."""
    return next(ref["training_batches"](32, seed))


def losses_of(answer, steps: int, label: str) -> list[float]:
    got = decode(answer)
    require(isinstance(got, list) and len(got) == steps, f"{label} should return one loss per step ({steps}), got "
                                                         f"{show(got)}")
    values = [as_float(v) for v in got]
    require(all(math.isfinite(v) for v in values), f"{label}: the losses are not all finite: {show(values)}")
    return values


def require_training(answer: dict, case: dict, expected_first: float, label: str) -> list[float]:
    """The checks every hidden training case shares: frozen target, first loss as the reference's, a falling loss."""
    require(isinstance(answer, dict), f"{label}: no result came back")
    change = as_float(answer["target_change"])
    require(change == 0.0, f"{label} changed the target's weights (by up to {change:.3g}): the target must stay "
                           "frozen, only the head learns")
    losses = losses_of(answer["losses"], case["args"][0], label)
    require(abs(losses[0] - expected_first) < 1e-4, f"{label}: the first step's loss on the first batch should be "
                                                    f"{expected_first:.5f} (the loss of the fresh head on it), got "
                                                    f"{losses[0]:.5f}")
    third = max(1, len(losses) // 3)
    require(sum(losses[-third:]) / third < sum(losses[:third]) / third,
            f"{label}: the loss should fall over {len(losses)} steps, got {show(losses)}")
    return losses


# ----------------------------------------------------------------------------------------------- Medusa


def block_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for _ in range(2):
        width = randint(3, 8, generator)
        shape = (randint(1, 3, generator), randint(1, 4, generator), width)
        cases.append({"hidden": torch.randn(shape, generator=generator).tolist(),
                      "weight": torch.randn(width, width, generator=generator).tolist(),
                      "bias": torch.randn(width, generator=generator).tolist()})
    return {"cases": cases}


def block_visible(generator: torch.Generator, ref: dict) -> dict:
    hidden = (torch.arange(6.0).reshape(2, 3) / 4).tolist()
    return {"cases": [{"hidden": hidden, "weight": [[0.0] * 3] * 3, "bias": [0.0] * 3},
                      {"hidden": hidden, "weight": torch.eye(3).tolist(), "bias": [-0.5] * 3}]}


def judge_block(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        hidden, weight, bias = (torch.tensor(case[k]) for k in ("hidden", "weight", "bias"))
        expected = ref["medusa_block"](hidden, weight, bias)
        require_close(answer, expected, f"medusa_block on hidden states of shape {tuple(hidden.shape)}")


def labels_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"tokens": [[1, 5, 6, 7, 8], [1, 9, 10, 0, 0]],
                       "mask": [[True] * 5, [True] * 3 + [False] * 2], "k": 1}]}


def labels_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for k in (1, randint(2, 3, generator)):
        case = padded_batch(generator, 3, 3, randint(7, 10, generator))
        cases.append(case | {"k": k})
    return {"cases": cases}


def judge_labels(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        expected = ref["medusa_labels"](tokens, mask, case["k"])
        got = as_tensor(answer, tuple(expected.shape))
        require(got.tolist() == expected.tolist(),
                f"medusa_labels(tokens={tokens.tolist()}, k={case['k']}): head {case['k']} at position t predicts "
                f"token t + {case['k'] + 1}; expected {expected.tolist()}, got {got.tolist()}")


def loss_visible(generator: torch.Generator, ref: dict) -> dict:
    logits = torch.zeros(1, 6, 2, VOCAB)
    logits[0, :, 0, 7] = 2.0
    return {"cases": [{"tokens": [[1, 5, 6, 7, 8, 9]], "mask": [[True] * 6], "logits": logits.tolist()}]}


def loss_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for heads in (2, 3):
        case = padded_batch(generator, 3, 4, randint(8, 11, generator))
        length = len(case["tokens"][0])
        case["logits"] = (2 * torch.randn(3, length, heads, VOCAB, generator=generator)).tolist()
        cases.append(case)
    return {"cases": cases}


def judge_loss(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        logits = torch.tensor(case["logits"])
        loss, per_head = ref["medusa_loss"](logits, tokens, mask)
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 2 and isinstance(got[1], list),
                f"medusa_loss should return (loss, per_head), got {show(got)}")
        label = (f"medusa_loss on {tuple(tokens.shape)} tokens ({int((~mask).sum())} padding) with "
                 f"{logits.shape[2]} heads")
        got_heads = [as_float(v) for v in got[1]]
        expected_heads = [float(v) for v in per_head]
        require(len(got_heads) == len(expected_heads) and all(abs(a - b) < 1e-4 for a, b in
                                                              zip(got_heads, expected_heads, strict=True)),
                f"{label}: expected the per-head losses {show(expected_heads, 5)}, got {show(got_heads, 5)}")
        require(abs(as_float(got[0]) - float(loss)) < 1e-4, f"{label}: expected the mean {float(loss):.5f}, got "
                                                            f"{as_float(got[0]):.5f}")


def train_medusa_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"heads": 2, "args": [30], "kwargs": {"seed": 1}}]}


def judge_train_medusa_visible(inputs: dict, answers: list, ref: dict) -> None:
    losses = losses_of(decode(answers[0])["losses"], 30, "train_medusa(MedusaHeads(num_heads=2), steps=30, seed=1)")
    require(sum(losses[-5:]) < sum(losses[:5]), f"30 steps should lower the loss: first {show(losses[:5])}, last "
                                                f"{show(losses[-5:])}")


def train_medusa_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"heads": randint(2, 3, generator), "args": [12],
                       "kwargs": {"seed": randint(0, 10_000, generator)}}]}


def judge_train_medusa(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask, hidden = first_batch(ref, case["kwargs"]["seed"])
        with torch.no_grad():
            heads = ref["MedusaHeads"](num_heads=case["heads"])
            expected = float(ref["medusa_loss"](ref["logits_of"](heads(hidden[-1])), tokens, mask)[0])
        require_training(decode(answer), case, expected, f"train_medusa({case['heads']} fresh heads, steps=12, "
                                                         f"seed={case['kwargs']['seed']})")


def accuracy_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"sentences": ref["HELDOUT"]}]}


def judge_accuracy_visible(inputs: dict, answers: list, ref: dict) -> None:
    got = decode(answers[0])
    require(isinstance(got, list) and len(got) == 3, f"medusa_accuracy(medusa_heads, HELDOUT) should give three "
                                                     f"fractions, got {show(got)}")
    values = [as_float(v) for v in got]
    require(all(0 <= a <= 1 for a in values), f"accuracies are fractions, got {show(values)}")
    require(values[0] > 0.4, f"a trained head 1 should be right on more than 40% of held-out positions, got "
                             f"{values[0]:.2f}")


def accuracy_cases(generator: torch.Generator, ref: dict) -> dict:
    heads = randint(2, 3, generator)
    weights = [((0.3 * torch.randn(D, D, generator=generator)).tolist(),
                (0.3 * torch.randn(D, generator=generator)).tolist()) for _ in range(heads)]
    rows = torch.randperm(len(ref["HELDOUT"]), generator=generator)[:12].tolist()
    return {"cases": [{"weights": weights, "sentences": [ref["HELDOUT"][i] for i in rows]}]}


def judge_accuracy(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        heads = ref["MedusaHeads"](num_heads=len(case["weights"]))
        with torch.no_grad():
            for block, (weight, bias) in zip(heads.blocks, case["weights"], strict=True):
                block.weight.copy_(torch.tensor(weight))
                block.bias.copy_(torch.tensor(bias))
        expected = ref["medusa_accuracy"](heads, case["sentences"])
        got = decode(answer)
        require(isinstance(got, list) and len(got) == len(expected),
                f"medusa_accuracy with {len(expected)} heads should give {len(expected)} values, got {show(got)}")
        values = [as_float(v) for v in got]
        require(all(abs(a - b) < 1e-6 for a, b in zip(values, expected, strict=True)),
                f"medusa_accuracy of random heads on 12 held-out sentences: expected {show(expected, 4)}, got "
                f"{show(values, 4)}")


# ----------------------------------------------------------------------------------------------- EAGLE


def pairs_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"tokens": [[1, 5, 6], [1, 7, 0]], "mask": [[True] * 3, [True, True, False]],
                       "features": torch.arange(12.0).reshape(2, 3, 2).tolist()}]}


def pairs_cases(generator: torch.Generator, ref: dict) -> dict:
    case = padded_batch(generator, 3, 3, randint(6, 9, generator))
    case["features"] = torch.randn(3, len(case["tokens"][0]), 4, generator=generator).tolist()
    return {"cases": [case]}


def judge_pairs(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        expected = ref["eagle_pairs"](torch.tensor(case["features"]), tokens, mask)
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, f"eagle_pairs should return three tensors, got {show(got)}")
        label = f"eagle_pairs on tokens {tokens.tolist()}"
        got_tokens = as_tensor(got[1])
        require(got_tokens.tolist() == expected[1].tolist(),
                f"{label}: the token paired with f_t is x_(t+1), the one that followed (padding excluded); expected "
                f"{expected[1].tolist()}, got {got_tokens.tolist()}")
        require_close(got[0], expected[0], f"{label}: the input features f_t")
        require_close(got[2], expected[2], f"{label}: the target features f_(t+1)")


def eagle_loss_visible(generator: torch.Generator, ref: dict) -> dict:
    features = torch.randn(1, 4, D, generator=torch.Generator().manual_seed(0)).tolist()
    case = {"tokens": [[1, 5, 6, 7]], "mask": [[True] * 4], "features": features, "seed": 3}
    return {"cases": [case | {"w_token": 0.1}, case | {"w_token": 0.0}]}


def judge_eagle_loss_visible(inputs: dict, answers: list, ref: dict) -> None:
    results = []
    for answer in answers:
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, f"eagle_loss should return (loss, regression, token_loss), "
                                                         f"got {show(got)}")
        results.append([as_float(v) for v in got])
    (total, reg, tok), (same, _, _) = results
    require(abs(total - reg - 0.1 * tok) < 1e-5, f"loss = regression + 0.1 * token loss: got {total:.5f} for "
                                                 f"{reg:.5f} + 0.1 * {tok:.5f}")
    require(abs(same - reg) < 1e-6, f"with w_token = 0 the loss is the regression alone: got {same:.5f}, "
                                    f"regression {reg:.5f}")
    require(tok > 0 and reg > 0, f"both parts are positive for an untrained head, got {reg:.5f}, {tok:.5f}")


def eagle_loss_cases(generator: torch.Generator, ref: dict) -> dict:
    cases = []
    for w_token in (0.1, 0.5):
        case = padded_batch(generator, 3, 4, randint(7, 10, generator))
        case["features"] = torch.randn(3, len(case["tokens"][0]), D, generator=generator).tolist()
        cases.append(case | {"seed": randint(0, 10_000, generator), "w_token": w_token})
    return {"cases": cases}


def judge_eagle_loss(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        with torch.no_grad():
            expected = [float(v) for v in ref["eagle_loss"](ref["EagleHead"](seed=case["seed"]),
                                                            torch.tensor(case["features"]), tokens, mask,
                                                            w_token=case["w_token"])]
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, f"eagle_loss should return (loss, regression, token_loss), "
                                                         f"got {show(got)}")
        values = [as_float(v) for v in got]
        require(all(abs(a - b) < 1e-4 for a, b in zip(values, expected, strict=True)),
                f"eagle_loss on a padded batch of {tuple(tokens.shape)} tokens, w_token={case['w_token']}: expected "
                f"(loss, regression, token loss) = {show(expected, 5)}, got {show(values, 5)}")


_untrained: dict[tuple, float] = {}


def untrained_acceptance(ref: dict, case: dict) -> float:
    """The untrained head's acceptance on the visible case (computed once per grading process)."""
    key = tuple(map(tuple, case["prompts"])) + (case["new_tokens"], case["k"])
    if key not in _untrained:
        _untrained[key] = ref["mean_accepted"](ref["EagleHead"](seed=0), k=case["k"])
    return _untrained[key]


def acceptance_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"prompts": ref["PROMPTS"], "new_tokens": 20, "k": 4, "layers": [-1]}]}


def judge_acceptance_visible(inputs: dict, answers: list, ref: dict) -> None:
    trained = as_float(answers[0])
    untrained = untrained_acceptance(ref, inputs["cases"][0])
    require(trained > untrained + 1.0, f"the trained head should get at least one more token accepted per step than "
                                       f"an untrained one: trained {trained:.2f}, untrained {untrained:.2f}")


def train_eagle_cases(generator: torch.Generator, ref: dict) -> dict:
    prompts = [s[:randint(4, 7, generator)] for s in ref["HELDOUT"][20:23]]
    return {"cases": [{"head_seed": randint(0, 10_000, generator), "args": [60],
                       "kwargs": {"seed": randint(0, 10_000, generator)},
                       "prompts": prompts, "new_tokens": 16, "k": 3, "layers": [-1]}]}


# drafted tokens accepted per step after 60 training steps (the reference: 0.8 to 1.3 over seeds; untrained: 0.0)
MIN_ACCEPTED = 0.4


def judge_train_eagle(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask, hidden = first_batch(ref, case["kwargs"]["seed"])
        with torch.no_grad():
            expected = float(ref["eagle_loss"](ref["EagleHead"](seed=case["head_seed"]), hidden[-1], tokens, mask)[0])
        label = f"train_eagle(a fresh head, steps=60, seed={case['kwargs']['seed']})"
        answer = decode(answer)
        require_training(answer, case, expected, label)
        accepted = as_float(answer["accepted"])
        require(accepted > MIN_ACCEPTED, f"{label}: the trained head's drafts (k = 3) should get more than "
                                         f"{MIN_ACCEPTED} tokens accepted per step in greedy decoding, got "
                                         f"{accepted:.2f}")


def ttt_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"hidden": [h[:4].tolist() for h in ref["TRAIN_HIDDEN"]],
                       "tokens": ref["TRAIN_TOKENS"][:4].tolist(), "mask": ref["TRAIN_MASK"][:4].tolist(),
                       "seed": 2, "steps": 3}]}


def judge_ttt_visible(inputs: dict, answers: list, ref: dict) -> None:
    got = decode(answers[0])
    length = len(inputs["cases"][0]["tokens"][0])
    as_tensor(got["fused"], (4, length, 3 * D))
    losses = got["losses"]
    require(isinstance(losses, list) and len(losses) == 3 and all(math.isfinite(as_float(v)) for v in losses),
            f"ttt_losses(steps=3) should return three finite losses, got {show(losses)}")


def ttt_cases(generator: torch.Generator, ref: dict) -> dict:
    case = padded_batch(generator, 3, 5, randint(9, 12, generator))
    length = len(case["tokens"][0])
    case["hidden"] = [torch.randn(3, length, D, generator=generator).tolist() for _ in range(4)]
    return {"cases": [case | {"seed": randint(0, 10_000, generator), "steps": 3}]}


def judge_ttt(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        hidden = tuple(torch.tensor(h) for h in case["hidden"])
        with torch.no_grad():
            expected = [float(v) for v in ref["ttt_losses"](ref["EagleHead"](inputs=3, seed=case["seed"]), hidden,
                                                            tokens, mask, case["steps"])]
        got = decode(answer)
        require_close(got["fused"], ref["fused_features"](hidden), "fused_features: the layers FUSED_LAYERS "
                                                                    "concatenated")
        losses = got["losses"]
        require(isinstance(losses, list) and len(losses) == len(expected), f"ttt_losses(steps={case['steps']}) should "
                                                                           f"return {len(expected)} losses, got "
                                                                           f"{show(losses)}")
        values = [as_float(v) for v in losses]
        bad = [s + 1 for s, (a, b) in enumerate(zip(values, expected, strict=True)) if not abs(a - b) < 1e-4]
        if bad:
            raise Fail(f"ttt_losses on a padded batch of {tuple(tokens.shape)} tokens: expected the per-step losses "
                       f"{show(expected, 5)}, got {show(values, 5)} (step {bad[0]} differs; from step 2 on, the "
                       "head must read its own previous output, never a true feature)")


def train_eagle3_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"head_seed": 4, "args": [20], "kwargs": {"ttt_steps": 2, "seed": 2}}]}


def judge_train_eagle3_visible(inputs: dict, answers: list, ref: dict) -> None:
    got = decode(answers[0])
    losses = losses_of(got["losses"], 20, "train_eagle3(EagleHead(inputs=3, seed=4), steps=20, ttt_steps=2, seed=2)")
    require(sum(losses[-5:]) < sum(losses[:5]), f"20 steps should lower the loss: first {show(losses[:5])}, last "
                                                f"{show(losses[-5:])}")


def train_eagle3_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"head_seed": randint(0, 10_000, generator), "args": [10],
                       "kwargs": {"ttt_steps": randint(2, 3, generator), "seed": randint(0, 10_000, generator)}}]}


def judge_train_eagle3(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask, hidden = first_batch(ref, case["kwargs"]["seed"])
        with torch.no_grad():
            head = ref["EagleHead"](inputs=3, seed=case["head_seed"])
            expected = float(torch.stack(ref["ttt_losses"](head, hidden, tokens, mask, case["kwargs"]["ttt_steps"]))
                             .mean())
        require_training(decode(answer), case, expected, f"train_eagle3(a fresh fused head, steps=10, "
                                                         f"ttt_steps={case['kwargs']['ttt_steps']})")


CHECKS = {
    "test_medusa_block": Check("medusa_block", block_visible, judge_block, "medusa_block on the visible cases"),
    "test_medusa_block_hidden": Check("medusa_block", block_cases, judge_block,
                                      "medusa_block on random hidden states and weights"),
    "test_medusa_labels": Check("medusa_labels", labels_visible, judge_labels, "medusa_labels on the visible case"),
    "test_medusa_labels_hidden": Check("medusa_labels", labels_cases, judge_labels,
                                       "medusa_labels on random padded batches, heads 1 to 3"),
    "test_medusa_loss": Check("medusa_loss", loss_visible, judge_loss, "medusa_loss on the visible case"),
    "test_medusa_loss_hidden": Check("medusa_loss", loss_cases, judge_loss,
                                     "medusa_loss on random padded batches and logits"),
    "test_train_medusa": Check("train_medusa", train_medusa_visible, judge_train_medusa_visible,
                               "train_medusa on the visible case (30 steps)"),
    "test_train_medusa_hidden": Check("train_medusa", train_medusa_cases, judge_train_medusa,
                                      "train_medusa on fresh heads: frozen target, first loss, falling loss"),
    "test_medusa_accuracy": Check("medusa_accuracy_trained", accuracy_visible, judge_accuracy_visible,
                                  "medusa_accuracy of your trained heads on the held-out sentences"),
    "test_medusa_accuracy_hidden": Check("medusa_accuracy", accuracy_cases, judge_accuracy,
                                         "medusa_accuracy of random heads on random held-out sentences"),
    "test_eagle_pairs": Check("eagle_pairs", pairs_visible, judge_pairs, "eagle_pairs on the visible case"),
    "test_eagle_pairs_hidden": Check("eagle_pairs", pairs_cases, judge_pairs,
                                     "eagle_pairs on a random padded batch"),
    "test_eagle_loss": Check("eagle_loss", eagle_loss_visible, judge_eagle_loss_visible,
                             "eagle_loss on the visible case"),
    "test_eagle_loss_hidden": Check("eagle_loss", eagle_loss_cases, judge_eagle_loss,
                                    "eagle_loss on random padded batches and heads"),
    "test_train_eagle": Check("eagle_acceptance", acceptance_visible, judge_acceptance_visible,
                              "acceptance of your trained eagle_head against an untrained head"),
    "test_train_eagle_hidden": Check("train_eagle", train_eagle_cases, judge_train_eagle,
                                     "train_eagle on a fresh head: frozen target, first loss, falling loss, "
                                     "acceptance in greedy decoding"),
    "test_ttt": Check("ttt_losses", ttt_visible, judge_ttt_visible,
                      "fused_features and ttt_losses on the visible case"),
    "test_ttt_hidden": Check("ttt_losses", ttt_cases, judge_ttt, "ttt_losses on random padded batches and features"),
    "test_train_eagle3": Check("train_eagle3", train_eagle3_visible, judge_train_eagle3_visible,
                               "train_eagle3 on the visible case (20 steps)"),
    "test_train_eagle3_hidden": Check("train_eagle3", train_eagle3_cases, judge_train_eagle3,
                                      "train_eagle3 on a fresh head: frozen target, first loss, falling loss"),
}

