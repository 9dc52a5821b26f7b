"""Checks of lab 6 (training a drafter): Medusa's residual block, shifted labels, loss over heads, training and
per-head accuracy; EAGLE's feature/token pairs, regression plus token loss, training and acceptance in a greedy
decode loop; MTP modules' inputs and labels per depth; EAGLE-3's fused features and training-time test.

Hidden cases are drawn for every run: random padded batches (so a loss taken on padding, labels shifted the
wrong way or features paired with the token at their own position show), random head weights and seeds.

Training is judged here, never in the sandbox. A training probe runs the student's training function on a fresh
head it builds from the lab's own classes (never a head the notebook's cells left in its namespace), on the
setup's target reset to the setup's weights (sent from here, see `with_target`), and sends back only the
function's return value (the losses) and the raw weights of the head it trained (and, for the hidden checks,
of the target after the call). This side then loads those weights into a head built from the REFERENCE's class
(names and shapes validated first) and measures, with the reference's target and data:

- that something was learned: the trained head's loss on the held-out sentences is below the loss of the same
  head untrained (built here from the same seed) by a stated margin (`DROP`); for EAGLE also the drafted tokens
  the target accepts per step in the reference's greedy chain decode (`eagle_decode`), against the untrained head;
- that the reported losses belong to these weights: the first one is the untrained head's loss on the first
  batch of `training_batches(32, seed)` and the trained head's loss on the last batch is not above the last one
  reported (hidden checks), so a made-up falling curve without an optimizer step fails;
- that the target stayed frozen: its weights after the call equal the reference's (hidden checks).

The trusted side measures on one torch thread (`one_thread`): these models are tiny, and more threads only
contend with each other (25x slower on a busy 2-core grading machine).
"""

from __future__ import annotations

import base64
import copy
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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



# ----------------------------------------------------------------------------------------------- trusted side

# what the trusted side computes once per reference namespace: the target's weights, the held-out batch and the
# untrained heads' acceptance (keyed by id(ref); the namespace is kept alive with its entry)
_memo: dict[tuple, tuple[dict, object]] = {}


def memo(ref: dict, key: tuple, make: Callable[[], object]):
    """`make()` computed once per reference namespace and `key`."""
    full = (id(ref), *key)
    if full not in _memo:
        _memo[full] = (ref, make())
    return _memo[full][1]


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread for a measurement (see the module docstring), the previous setting restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)


def reference_target(ref: dict) -> dict[str, torch.Tensor]:
    """The setup's target weights (name -> tensor), taken from the reference namespace before any probe runs."""
    return memo(ref, ("target",), lambda: {name: value.detach().clone()
                                           for name, value in ref["target"].state_dict().items()})


def target_blob(ref: dict) -> dict:
    """The setup's target weights as sent to the sandbox: name -> {"b64": float32 bytes, "shape"} (a quarter of
    the size of nested lists; the probe resets the notebook's target to them before calling student code)."""
    def encode() -> dict:
        return {name: {"b64": base64.b64encode(value.float().contiguous().numpy().tobytes()).decode(),
                       "shape": list(value.shape)} for name, value in reference_target(ref).items()}
    return memo(ref, ("blob",), encode)


def with_target(inputs: Callable[[torch.Generator, dict], dict]) -> Callable[[torch.Generator, dict], dict]:
    """`inputs` plus the setup's target weights, for every probe whose student code uses the target: a cell that
    changed the target (a training function that did not freeze it) then costs only its own check."""
    return lambda generator, ref: inputs(generator, ref) | {"target": target_blob(ref)}


def heldout(ref: dict) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """The held-out sentences padded, with the reference target's hidden states on them (tokens, mask, hidden)."""
    def make():
        tokens, mask = ref["pad_batch"](ref["HELDOUT"])
        with one_thread():
            return tokens, mask, ref["target_view"](tokens)[0]
    return memo(ref, ("heldout",), make)


def nth_batch(ref: dict, seed: int, step: int):
    """The batch (tokens, mask, hidden) that `training_batches(32, seed)` yields at `step` (1 = the first)."""
    return next(itertools.islice(ref["training_batches"](32, seed), step - 1, None))


def losses_of(answer, steps: int, label: str) -> list[float]:
    got = decode(answer)
    require(isinstance(got, list) and len(got) == steps, f"{label} should return one loss per step ({steps}), got "
                                                         f"{show(got)}")
    values = [as_float(v) for v in got]
    require(all(math.isfinite(v) for v in values), f"{label}: the losses are not all finite: {show(values)}")
    return values


def kind(value) -> str:
    """What came back, named by type only (an answer's text in a message is the student's, and unbounded)."""
    return type(value).__name__


def tensor_entry(raw, like: torch.Tensor, what: str) -> torch.Tensor:
    """One raw weight from the sandbox as a finite float tensor of `like`'s shape; the shape is checked before
    anything is decoded (nothing is allocated for a shape an answer merely names)."""
    if isinstance(raw, dict) and "error" in raw:
        decode(raw)
    require(isinstance(raw, dict) and "tensor" in raw, f"{what} is not a tensor, got a {kind(raw)}")
    shape = raw.get("shape")
    require(isinstance(shape, list) and len(shape) <= 8 and all(isinstance(n, int) for n in shape),
            f"{what} came back without a readable shape")
    require(shape == list(like.shape), f"{what} has shape {tuple(shape)}, expected {tuple(like.shape)}")
    value = as_tensor(raw, tuple(like.shape))
    require(value.is_floating_point() and bool(torch.isfinite(value).all()),
            f"{what} has NaN, infinite or non-float entries")
    return value.to(like.dtype)


def weights_of(raw, expected: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """The raw state dict the sandbox sent, validated against the names and shapes of `expected`."""
    if isinstance(raw, dict) and ("error" in raw or "unsupported" in raw):
        decode(raw)
    require(isinstance(raw, dict), f"{what}: no weights came back, got a {kind(raw)}")
    require(set(raw) == set(expected), f"{what}: the weights should be named {sorted(expected)}, got "
                                       f"{sorted(str(name)[:40] for name in list(raw)[:12])}")
    return {name: tensor_entry(raw[name], value, f"{what}: the weight {name!r}") for name, value in expected.items()}


def loaded(raw, fresh: torch.nn.Module, label: str) -> torch.nn.Module:
    """A copy of `fresh` (a head of the reference's class) holding the weights the student's training produced."""
    head = copy.deepcopy(fresh)
    head.load_state_dict(weights_of(raw, fresh.state_dict(), f"{label}: the trained head"))
    return head.eval()


def require_frozen(raw, ref: dict, label: str) -> None:
    """The target's weights after the student's training call equal the setup's."""
    expected = reference_target(ref)
    got = weights_of(raw, expected, f"{label}: the target after training")
    moved = {name: float((got[name] - value).abs().max()) for name, value in expected.items()}
    worst = max(moved, key=moved.get)
    require(moved[worst] == 0.0, f"{label} changed the target's weights (by up to {moved[worst]:.3g}, in "
                                 f"{worst!r}): the target must stay frozen, only the head learns")


@dataclass
class Drafter:
    """How the trusted side rebuilds and scores one kind of trained head.

    name: the training function; fresh(ref, case): the untrained head the probe also built (the reference's
    class, the same seed); loss(ref, head, tokens, mask, hidden, case): the training loss on one batch, the one
    the student's function reports; drop: the least fall of the held-out loss that counts as learned."""

    name: str
    fresh: Callable[[dict, dict], torch.nn.Module]
    loss: Callable[[dict, torch.nn.Module, torch.Tensor, torch.Tensor, tuple, dict], torch.Tensor]
    drop: float

    def label(self, case: dict) -> str:
        """The call as a student reads it in a message."""
        args = ", ".join(f"{k}={v}" for k, v in case["kwargs"].items())
        return f"{self.name}(a fresh head, {args})"


def steps_of(case: dict) -> int:
    return case["kwargs"]["steps"]


def batch_loss(ref: dict, drafter: Drafter, head: torch.nn.Module, batch, case: dict) -> float:
    with one_thread():
        return float(drafter.loss(ref, head, *batch, case))


def measured(answer, case: dict, ref: dict, drafter: Drafter) -> tuple[list[float], torch.nn.Module, torch.nn.Module]:
    """The losses the student's function returned, its trained head loaded here, and the same head untrained."""
    label = drafter.label(case)
    require(isinstance(answer, dict) and "losses" in answer and "head" in answer, f"{label}: no result came back, "
                                                                                   f"got a {kind(answer)}")
    losses = losses_of(answer["losses"], steps_of(case), label)
    fresh = drafter.fresh(ref, case)
    return losses, loaded(answer["head"], fresh, label), fresh


def require_learned(ref: dict, drafter: Drafter, head: torch.nn.Module, fresh: torch.nn.Module, case: dict) -> None:
    """The trained head's held-out loss is below the untrained head's by `drafter.drop`."""
    sentences = heldout(ref)
    before, after = (batch_loss(ref, drafter, h, sentences, case) for h in (fresh, head))
    require(after < before - drafter.drop,
            f"{drafter.label(case)}: training should lower the head's loss on the held-out sentences by more than "
            f"{drafter.drop}; the grader measured your trained weights: untrained {before:.3f}, trained {after:.3f}")


def require_falling(losses: list[float], window: int, label: str) -> None:
    require(sum(losses[-window:]) / window < sum(losses[:window]) / window,
            f"{label}: the loss should fall over {len(losses)} steps: first {show(losses[:window])}, last "
            f"{show(losses[-window:])}")


def require_consistent(ref: dict, drafter: Drafter, losses: list[float], head: torch.nn.Module,
                       fresh: torch.nn.Module, case: dict) -> None:
    """The reported losses belong to the weights: the first is the untrained head's on the first batch, and the
    trained head does no worse on the last batch than the last loss reported (one more step only lowers it)."""
    label, seed = drafter.label(case), case["kwargs"].get("seed", 0)
    first = batch_loss(ref, drafter, fresh, nth_batch(ref, seed, 1), case)
    require(abs(losses[0] - first) < 1e-4, f"{label}: the first step's loss on the first batch should be "
                                           f"{first:.5f} (the loss of the fresh head on it), got {losses[0]:.5f}")
    last = batch_loss(ref, drafter, head, nth_batch(ref, seed, steps_of(case)), case)
    require(last <= losses[-1] + 0.05 + 0.05 * abs(losses[-1]),
            f"{label}: the last loss reported is {losses[-1]:.4f}, but your trained head's loss on that step's batch "
            f"is {last:.4f}: the losses should come from the training that produced these weights")


def visible_training(drafter: Drafter, window: int = 5) -> Callable[[dict, list, dict], None]:
    """The judge of a visible training check: one loss per step, falling as the notebook's test asks, and the
    head learned (measured here)."""
    def judge_visible(inputs: dict, answers: list, ref: dict) -> None:
        for case, answer in zip(inputs["cases"], answers, strict=True):
            losses, head, fresh = measured(answer, case, ref, drafter)
            require_falling(losses, window, drafter.label(case))
            require_learned(ref, drafter, head, fresh, case)
    return judge_visible


def hidden_training(drafter: Drafter, extra: Callable | None = None) -> Callable[[dict, list, dict], None]:
    """The judge of a hidden training check: frozen target, losses consistent with the weights and falling, the
    head learned; `extra(ref, case, head, fresh)` adds a check (EAGLE's acceptance)."""
    def judge_hidden(inputs: dict, answers: list, ref: dict) -> None:
        for case, answer in zip(inputs["cases"], answers, strict=True):
            losses, head, fresh = measured(answer, case, ref, drafter)
            require_frozen(answer.get("target"), ref, drafter.label(case))
            require_consistent(ref, drafter, losses, head, fresh, case)
            require_falling(losses, max(1, len(losses) // 3), drafter.label(case))
            require_learned(ref, drafter, head, fresh, case)
            if extra is not None:
                extra(ref, case, head, fresh)
    return judge_hidden


def acceptance(ref: dict, head: torch.nn.Module, prompts: list[list[int]], new_tokens: int, k: int) -> float:
    """Drafted tokens the reference's target accepts per step in the reference's greedy chain decode."""
    with one_thread():
        steps = [a for p in prompts for a in ref["eagle_decode"](head, list(p), new_tokens, k)["accepted"]]
    return sum(steps) / len(steps)
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



def medusa_batch_loss(ref: dict, heads, tokens, mask, hidden, case: dict) -> torch.Tensor:
    return ref["medusa_loss"](ref["logits_of"](heads(hidden[-1])), tokens, mask)[0]


# zero-initialised heads start near 7.2 on the held-out sentences; the reference reaches 4.2 after 12 steps
MEDUSA = Drafter("train_medusa", lambda ref, case: ref["MedusaHeads"](num_heads=case["heads"]), medusa_batch_loss,
                 drop=1.0)


def train_medusa_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"heads": 2, "kwargs": {"steps": 30, "seed": 1}}]}


def train_medusa_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"heads": randint(2, 3, generator),
                       "kwargs": {"steps": 12, "seed": randint(0, 10_000, generator)}, "frozen": True}]}


def accuracy_visible(generator: torch.Generator, ref: dict) -> dict:
    """The answer cell's own run, `train_medusa(MedusaHeads(num_heads=3), steps=100)`, repeated by the probe on a
    head of its own (a scratch cell that rebinds `medusa_heads` changes nothing)."""
    return {"cases": [{"heads": 3, "kwargs": {"steps": 100}, "sentences": ref["HELDOUT"]}]}


def judge_accuracy_visible(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        _, heads, _ = measured(answer, case, ref, MEDUSA)
        with one_thread():
            expected = ref["medusa_accuracy"](heads, case["sentences"])
        require_accuracies(answer.get("accuracy"), expected, "medusa_accuracy(your trained heads, HELDOUT)",
                           " (the grader's measurement of the same heads)")
        require(expected[0] > 0.4, f"a trained head 1 should be right on more than 40% of held-out positions; "
                                   f"train_medusa(MedusaHeads(num_heads=3), steps=100) gave heads right on "
                                   f"{expected[0]:.2f}")
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
        require_accuracies(answer, expected, "medusa_accuracy of random heads on 12 held-out sentences")


def require_accuracies(answer, expected: list[float], label: str, source: str = "") -> None:
    """The per-head accuracies in `answer` equal the trusted side's `expected` (one per head, within 1e-6)."""
    got = decode(answer)
    require(isinstance(got, list) and len(got) == len(expected),
            f"{label} should give {len(expected)} fractions, one per head, got {show(got)}")
    values = [as_float(v) for v in got]
    require(all(abs(a - b) < 1e-6 for a, b in zip(values, expected, strict=True)),
            f"{label}: expected {show(expected, 4)}{source}, got {show(values, 4)}")


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



def eagle_batch_loss(ref: dict, head, tokens, mask, hidden, case: dict) -> torch.Tensor:
    return ref["eagle_loss"](head, hidden[-1], tokens, mask)[0]


# a fresh head starts near 1.17 on the held-out sentences; the reference reaches 0.58 after 60 steps
EAGLE = Drafter("train_eagle", lambda ref, case: ref["EagleHead"](seed=case["head_seed"]), eagle_batch_loss,
                drop=0.2)


def untrained_acceptance(ref: dict, case: dict, fresh: torch.nn.Module) -> float:
    """The untrained head's acceptance on the case's prompts (once per seed and prompts)."""
    key = ("accepted", case["head_seed"], str(case["prompts"]), case["new_tokens"], case["k"])
    return memo(ref, key, lambda: acceptance(ref, fresh, case["prompts"], case["new_tokens"], case["k"]))


def acceptance_visible(generator: torch.Generator, ref: dict) -> dict:
    """The answer cell's own run, `train_eagle(EagleHead(seed=0), steps=200)`, repeated by the probe on a head of
    its own (a scratch cell that rebinds `eagle_head` changes nothing); measured here as the cell measures it."""
    return {"cases": [{"head_seed": 0, "kwargs": {"steps": 200}, "prompts": ref["PROMPTS"], "new_tokens": 20,
                       "k": 4}]}


def judge_acceptance_visible(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        _, head, fresh = measured(answer, case, ref, EAGLE)
        require_accepts(ref, case, head, fresh, margin=1.0)


def require_accepts(ref: dict, case: dict, head: torch.nn.Module, fresh: torch.nn.Module,
                    margin: float = 0.4) -> None:
    """The trained head's drafts get `margin` more tokens accepted per step than the untrained head's."""
    trained, untrained = acceptance(ref, head, case["prompts"], case["new_tokens"], case["k"]), \
        untrained_acceptance(ref, case, fresh)
    require(trained > untrained + margin,
            f"{EAGLE.label(case)}: the trained head's drafts (k = {case['k']}) should get more than {margin} more "
            f"tokens accepted per step in greedy decoding than an untrained head's; the grader measured your "
            f"trained weights: trained {trained:.2f}, untrained {untrained:.2f}")


def train_eagle_cases(generator: torch.Generator, ref: dict) -> dict:
    prompts = [s[:randint(4, 7, generator)] for s in ref["HELDOUT"][20:23]]
    return {"cases": [{"head_seed": randint(0, 10_000, generator),
                       "kwargs": {"steps": 60, "seed": randint(0, 10_000, generator)},
                       "prompts": prompts, "new_tokens": 16, "k": 3, "frozen": True}]}
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



def eagle3_batch_loss(ref: dict, head, tokens, mask, hidden, case: dict) -> torch.Tensor:
    return torch.stack(ref["ttt_losses"](head, hidden, tokens, mask, case["kwargs"]["ttt_steps"])).mean()


# ----------------------------------------------------------------------------------------------- MTP


def mtp_pairs_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"tokens": [[1, 5, 6, 7], [1, 8, 9, 0]], "mask": [[True] * 4, [True] * 3 + [False]],
                       "states": torch.arange(16.0).reshape(2, 4, 2).tolist(), "depth": depth} for depth in (1, 2)]}


def mtp_pairs_cases(generator: torch.Generator, ref: dict) -> dict:
    """Random padded batches at depths 1 to 3 (a label shifted by `depth` instead of `depth + 1`, the token
    before the right one, or a row whose label is padding shows as a wrong row list)."""
    cases = []
    for depth in (1, 2, 3):
        case = padded_batch(generator, 3, depth + 2, randint(depth + 5, depth + 8, generator))
        case["states"] = torch.randn(3, len(case["tokens"][0]), 4, generator=generator).tolist()
        case["depth"] = depth
        cases.append(case)
    return {"cases": cases}


def judge_mtp_pairs(inputs: dict, answers: list, ref: dict) -> None:
    for case, answer in zip(inputs["cases"], answers, strict=True):
        tokens, mask = as_batch(case)
        depth = case["depth"]
        expected = ref["mtp_pairs"](torch.tensor(case["states"]), tokens, mask, depth)
        got = decode(answer)
        require(isinstance(got, list) and len(got) == 3, f"mtp_pairs should return three tensors, got {show(got)}")
        label = f"mtp_pairs at depth {depth} on tokens {tokens.tolist()}"
        got_labels, got_tokens = as_tensor(got[2]), as_tensor(got[1])
        require(got_labels.tolist() == expected[2].tolist(),
                f"{label}: module {depth} at position t predicts x_(t+{depth + 1}), for every t where that token is "
                f"real (not padding); expected labels {expected[2].tolist()}, got {got_labels.tolist()}")
        require(got_tokens.tolist() == expected[1].tolist(),
                f"{label}: module {depth} reads the token x_(t+{depth}) beside h_t; expected input tokens "
                f"{expected[1].tolist()}, got {got_tokens.tolist()}")
        require_close(got[0], expected[0], f"{label}: the input states h_t")


# a fresh fused head starts near 3.47 on the held-out sentences; the reference reaches 2.76 (ttt_steps=2) and
# 2.88 (ttt_steps=3) after 10 steps
EAGLE3 = Drafter("train_eagle3", lambda ref, case: ref["EagleHead"](inputs=3, seed=case["head_seed"]),
                 eagle3_batch_loss, drop=0.25)


def train_eagle3_visible(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"head_seed": 4, "kwargs": {"steps": 20, "ttt_steps": 2, "seed": 2}}]}


def train_eagle3_cases(generator: torch.Generator, ref: dict) -> dict:
    return {"cases": [{"head_seed": randint(0, 10_000, generator),
                       "kwargs": {"steps": 10, "ttt_steps": randint(2, 3, generator),
                                  "seed": randint(0, 10_000, generator)}, "frozen": True}]}


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
    "test_train_medusa": Check("train_medusa", with_target(train_medusa_visible), visible_training(MEDUSA),
                               "train_medusa on the visible case (30 steps): falling loss, held-out loss measured"),
    "test_train_medusa_hidden": Check("train_medusa", with_target(train_medusa_cases), hidden_training(MEDUSA),
                                      "train_medusa on fresh heads: frozen target, losses of these weights, "
                                      "held-out loss measured"),
    "test_medusa_accuracy": Check("medusa_accuracy_trained", with_target(accuracy_visible), judge_accuracy_visible,
                                  "medusa_accuracy of heads trained by your train_medusa on the held-out sentences"),
    "test_medusa_accuracy_hidden": Check("medusa_accuracy", with_target(accuracy_cases), judge_accuracy,
                                         "medusa_accuracy of random heads on random held-out sentences"),
    "test_eagle_pairs": Check("eagle_pairs", pairs_visible, judge_pairs, "eagle_pairs on the visible case"),
    "test_eagle_pairs_hidden": Check("eagle_pairs", pairs_cases, judge_pairs,
                                     "eagle_pairs on a random padded batch"),
    "test_eagle_loss": Check("eagle_loss", with_target(eagle_loss_visible), judge_eagle_loss_visible,
                             "eagle_loss on the visible case"),
    "test_eagle_loss_hidden": Check("eagle_loss", with_target(eagle_loss_cases), judge_eagle_loss,
                                    "eagle_loss on random padded batches and heads"),
    "test_train_eagle": Check("train_eagle", with_target(acceptance_visible), judge_acceptance_visible,
                              "acceptance of a head trained by your train_eagle against an untrained head"),
    "test_train_eagle_hidden": Check("train_eagle", with_target(train_eagle_cases),
                                     hidden_training(EAGLE, require_accepts),
                                     "train_eagle on a fresh head: frozen target, losses of these weights, held-out "
                                     "loss and acceptance in greedy decoding measured"),
    "test_mtp_pairs": Check("mtp_pairs", mtp_pairs_visible, judge_mtp_pairs, "mtp_pairs on the visible cases"),
    "test_mtp_pairs_hidden": Check("mtp_pairs", mtp_pairs_cases, judge_mtp_pairs,
                                   "mtp_pairs on random padded batches, depths 1 to 3"),
    "test_ttt": Check("ttt_losses", with_target(ttt_visible), judge_ttt_visible,
                      "fused_features and ttt_losses on the visible case"),
    "test_ttt_hidden": Check("ttt_losses", with_target(ttt_cases), judge_ttt,
                             "ttt_losses on random padded batches and features"),
    "test_train_eagle3": Check("train_eagle3", with_target(train_eagle3_visible), visible_training(EAGLE3),
                               "train_eagle3 on the visible case (20 steps): falling loss, held-out loss measured"),
    "test_train_eagle3_hidden": Check("train_eagle3", with_target(train_eagle3_cases), hidden_training(EAGLE3),
                                      "train_eagle3 on a fresh head: frozen target, losses of these weights, "
                                      "held-out loss measured"),
}
