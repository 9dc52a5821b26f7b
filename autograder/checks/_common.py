"""The trusted checker's building blocks: checks, verdicts, reading the sandbox's plain answers, comparisons.

This code runs only in the grading process, outside the sandbox. A check pairs a probe (the program that runs
in the student's kernel, see sandbox/inside/probes/) with the inputs the checker sends it and a judge that
decides pass or fail from the plain data that came back. Judges compare against the lab's reference solution
(run here, from solutions/), so nothing the student's code does can change what is expected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


class Fail(Exception):
    """A failed check; the message says what was checked and what came back."""


@dataclass
class Check:
    """One graded test cell: `probe` (function name in the lab's probe module), `inputs` (built from a seeded
    generator and the reference namespace, so hidden cases change with every grading run), `judge` (raises
    Fail), `what` (one line for the student: what is checked)."""

    probe: str
    inputs: Callable[[torch.Generator, dict], dict]
    judge: Callable[[dict, Any, dict], None]
    what: str


@dataclass
class Verdict:
    passed: bool
    message: str


def fixed(value: dict) -> Callable[[torch.Generator, dict], dict]:
    """Inputs that do not depend on the run's seed (the visible tests' own cases)."""
    return lambda generator, ref: value


def decode(answer):
    """Plain data from the sandbox -> Python values with real tensors; raises Fail for reported errors."""
    if isinstance(answer, dict):
        if "error" in answer:
            where = f" ({answer['where']})" if answer.get("where") else ""
            raise Fail(f"your code raised {answer['error']}{where}")
        if "unsupported" in answer:
            raise Fail(f"your code returned a {answer['unsupported']}, which is not a tensor, list or number")
        if "tensor" in answer:
            values = unfinite(answer["tensor"])
            dtype = torch.float64 if "float" in str(answer.get("dtype", "")) else None
            t = torch.tensor(values, dtype=dtype) if values != [] else torch.zeros(answer.get("shape", [0]))
            if list(t.shape) != list(answer.get("shape", t.shape)):
                raise Fail("your code returned a tensor whose values do not match its shape")
            return t.reshape(answer["shape"])
        return {k: decode(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [decode(v) for v in answer]
    return answer


def unfinite(values):
    if isinstance(values, list):
        return [unfinite(v) for v in values]
    return float(values) if isinstance(values, str) else values


def judge(check: Check, inputs: dict, answer: Any, reference: dict) -> Verdict:
    """Run `check`'s judge; a judge that cannot read the answer counts as a failed check, never a crash."""
    if answer is None:
        return Verdict(False, f"{check.what}: no answer came back (the cell did not finish, or the notebook "
                              "stopped before it)")
    try:
        if isinstance(answer, dict) and ("error" in answer or "unsupported" in answer):
            decode(answer)  # the probe itself reported a failure (e.g. the function is not defined)
        check.judge(inputs, answer, reference)
    except Fail as failure:
        return Verdict(False, f"{check.what}: {failure}")
    except Exception as error:  # odd data from the sandbox: a failure with a reason, not a crashed batch
        return Verdict(False, f"{check.what}: the answer could not be read ({type(error).__name__}: {error})")
    return Verdict(True, check.what)


def show(value, digits: int = 3) -> str:
    """A short readable form of a tensor, list or number for messages."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list):
        text = "[" + ", ".join(show(v, digits) for v in value[:12]) + (", ...]" if len(value) > 12 else "]")
        return text
    return repr(value)


def as_tensor(value, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """`value` decoded as a tensor (of `shape` if given), or Fail saying what came back instead."""
    value = decode(value)
    if not isinstance(value, torch.Tensor):
        raise Fail(f"expected a tensor, got {type(value).__name__} {show(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Fail(f"expected a tensor of shape {tuple(shape)}, got shape {tuple(value.shape)}")
    return value


def as_ints(value) -> list[int]:
    """`value` decoded as a list of integers (a 1-D tensor or a list), or Fail."""
    value = decode(value)
    if isinstance(value, torch.Tensor) and value.dim() <= 1 and not value.is_floating_point():
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise Fail(f"expected a list of token ids, got {show(value)}")


def as_int(value) -> int:
    value = decode(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Fail(f"expected an integer, got {show(value)}")


def as_float(value) -> float:
    value = decode(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise Fail(f"expected a number, got {show(value)}")


def require_close(got, expected: torch.Tensor, label: str, atol: float = 1e-5) -> None:
    """Fail unless `got` is a finite tensor of `expected`'s shape equal to it within `atol`."""
    got = as_tensor(got, tuple(expected.shape))
    if not bool(torch.isfinite(got).all()):
        raise Fail(f"{label}: the result has NaN or infinite entries: {show(got)}")
    if not torch.allclose(got.double(), expected.double(), atol=atol, rtol=0):
        raise Fail(f"{label}: expected {show(expected)}, got {show(got)}")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise Fail(message)


def distributions(rows: int, vocab: int, generator: torch.Generator, sharpness: float = 2.0) -> torch.Tensor:
    """Random probability vectors (rows, vocab) drawn from `generator`."""
    return torch.softmax(sharpness * torch.randn(rows, vocab, generator=generator), dim=-1)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test of `counts` against `probs`; rare categories are pooled so that
    every expected count is at least `min_expected`. An observed count where probs is 0 gives p = 0."""
    counts, probs = counts.double(), probs.double()
    n = float(counts.sum())
    if bool(((probs == 0) & (counts > 0)).any()):
        return 0.0
    order = torch.argsort(probs, descending=True)
    expected, observed = [], []
    pool_e = pool_o = 0.0
    for i in order.tolist():
        if probs[i] == 0:
            continue
        pool_e += float(probs[i]) * n
        pool_o += float(counts[i])
        if pool_e >= min_expected:
            expected.append(pool_e)
            observed.append(pool_o)
            pool_e = pool_o = 0.0
    if pool_e > 0 and expected:
        expected[-1] += pool_e
        observed[-1] += pool_o
    if len(expected) < 2:
        return 1.0
    e, o = torch.tensor(expected), torch.tensor(observed)
    statistic = float(((o - e) ** 2 / e).sum())
    return float(torch.special.gammaincc(torch.tensor((len(expected) - 1) / 2), torch.tensor(statistic / 2)))


def histogram(tokens: list[int], vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab)
    for token in tokens:
        if not 0 <= token < vocab:
            raise Fail(f"token {token} is outside the vocabulary of {vocab}")
        counts[token] += 1
    return counts


def isclose(a: float, b: float, tol: float = 1e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= tol
