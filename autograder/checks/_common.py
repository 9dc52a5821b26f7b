"""The trusted checker's building blocks: checks, verdicts, reading the sandbox's plain answers, comparisons.

This code runs only in the grading process, outside the sandbox. A check pairs a probe (the program that runs
in the student's kernel, see sandbox/inside/probes/) with the inputs the checker sends it and a judge that
decides pass or fail from the plain data that came back. Judges compare against the lab's reference solution
(run here, from solutions/), so nothing the student's code does can change what is expected.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# What one answer may make the grader build. The reader caps an answer's JSON (20 MB), but a few bytes can still
# *name* a huge tensor ({"tensor": [], "shape": [20000, 20000]} once took the grader to 19 GiB) and a message that
# lists or prints an answer can grow without bound. So every shape is checked against these limits before
# anything is allocated, and every message is cut: the grader's memory stays bounded whatever arrives.
MAX_ELEMENTS = 10_000_000  # values in all the tensors of one answer (80 MB as float64); probes send far fewer
MAX_DIMS = 16  # dimensions of one tensor (the labs use at most 3)
MAX_DEPTH = 64  # nesting of lists and dicts in one answer (the probes send at most 20 levels)
MAX_SHOWN = 12  # items per list, tensor or dict that show() converts
MAX_SHOWN_DEPTH = 6  # levels of nesting that show() descends into
MAX_SHOWN_CHARS = 400  # characters of one show()
MAX_MESSAGE_CHARS = 2_000  # characters of one verdict's message
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how the probes send what JSON lacks


class Fail(Exception):
    """A failed check; the message says what was checked and what came back."""


@dataclass
class Check:
    """One graded test cell: `probe` (function name in the lab's probe module), `inputs` (built from a seeded
    generator and the reference namespace, so hidden cases change with every grading run), `judge` (raises
    Fail), `what` (one line for the student: what is checked).

    Inputs under the key "secret" are never sent to the sandbox. `serve`, when set, builds from the inputs
    (their secret part: seeds the sandbox must not learn) and the reference namespace the models that the
    trusted side serves during the call, by name; the probe reaches them with `specdec_probe.served`, and the
    judge finds their forwards, counted here, in `inputs["measured"]["forwards"][name]`."""

    probe: str
    inputs: Callable[[torch.Generator, dict], dict]
    judge: Callable[[dict, Any, dict], None]
    what: str
    serve: Callable[[dict, dict], dict] | None = None


@dataclass
class Verdict:
    passed: bool
    message: str


def fixed(value: dict) -> Callable[[torch.Generator, dict], dict]:
    """Inputs that do not depend on the run's seed (the visible tests' own cases)."""
    return lambda generator, ref: value


def decode(answer):
    """Plain data from the sandbox (`answer`: parsed JSON) -> Python values with real tensors. Raises Fail for a
    reported error and for anything malformed (a shape its values do not fill, a value that is not a number,
    nesting past MAX_DEPTH, more than MAX_ELEMENTS values), always before allocating anything of that size."""
    return decode_within(answer, 0, [MAX_ELEMENTS])


def decode_within(answer, depth: int, budget: list[int]):
    """decode() at nesting `depth`; `budget` holds how many tensor values this answer may still make."""
    if depth > MAX_DEPTH:
        raise Fail(f"your code returned data nested more than {MAX_DEPTH} levels deep")
    if isinstance(answer, np.generic):  # numpy values reach here only from the trusted side; read them plainly
        return answer.item()
    if isinstance(answer, np.ndarray):
        return torch.tensor(answer) if answer.dtype.kind in "biuf" else decode_within(answer.tolist(), depth, budget)
    if isinstance(answer, dict):
        if "error" in answer:
            where = f" ({clip(str(answer['where']), 100)})" if answer.get("where") else ""
            raise Fail(f"your code raised {clip(str(answer['error']), 400)}{where}")
        if "unsupported" in answer:
            found = a_name(clip(str(answer["unsupported"]), 100))
            if answer.get("why"):
                raise Fail(f"your code returned {found}, which the grader does not read: "
                           f"{clip(str(answer['why']), 200)}")
            raise Fail(f"your code returned {found}, which is not a tensor, list or number")
        if "tensor" in answer:
            return decode_tensor(answer, budget)
        return {k: decode_within(v, depth + 1, budget) for k, v in answer.items()}
    if isinstance(answer, (list, tuple)):
        return [decode_within(v, depth + 1, budget) for v in answer]
    return answer


def decode_tensor(answer: dict, budget: list[int]) -> torch.Tensor:
    """A tensor from {"tensor": nested values, "shape", "dtype"} (see specdec_probe.plain), its shape and values
    checked first; `budget` as in decode_within (reduced by this tensor's size)."""
    shape = answer.get("shape")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape)):
        raise Fail(f"your code returned a tensor with an unreadable shape {show(shape)} (expected a list of at most "
                   f"{MAX_DIMS} non-negative integers)")
    if math.prod(shape) > budget[0]:
        raise Fail(f"your code returned a tensor of shape {tuple(shape)}, more than the {MAX_ELEMENTS:,} values "
                   "the grader reads in one answer")
    budget[0] -= math.prod(shape)
    values = answer["tensor"]
    has_float = check_values(values, shape, 0)
    dtype = str(answer.get("dtype", ""))
    if has_float or "float" in dtype:
        dtype = torch.float64
    elif math.prod(shape) == 0:  # no values to infer from: the dtype the probe named
        dtype = torch.bool if "bool" in dtype else torch.int64 if "int" in dtype else torch.float64
    else:
        dtype = None  # ints -> int64, bools -> bool
    try:
        return torch.tensor(unfinite(values) if has_float else values, dtype=dtype).reshape(shape)
    except (RuntimeError, OverflowError, ValueError, TypeError) as error:  # e.g. an integer past int64
        raise Fail(f"your code returned a tensor whose values could not be read ({clip(str(error), 200)})") from None


def check_values(values, shape: list[int], dim: int) -> bool:
    """Fail unless `values` (nested lists) fill `shape` from dimension `dim` on with numbers; True when a float
    (or NaN / infinity, sent as a string) is among them."""
    def mismatch(what: str) -> Fail:
        return Fail(f"your code returned a tensor whose values do not match its shape {tuple(shape)}: {what}")

    if dim == len(shape):  # a 0-d tensor's one value
        if type(values) in (int, bool, float) or (isinstance(values, str) and values in NON_FINITE):
            return type(values) not in (int, bool)
        raise mismatch(f"a value is {describe(values)}")
    if not isinstance(values, list):
        raise mismatch(f"dimension {dim} should be a list of {shape[dim]} values, it is {describe(values)}")
    if len(values) != shape[dim]:
        raise mismatch(f"dimension {dim} should hold {shape[dim]} values, it holds {len(values)}")
    if dim < len(shape) - 1:
        return any([check_values(v, shape, dim + 1) for v in values])  # a list: every row is checked
    kinds = {type(v) for v in values}
    if kinds <= {int, bool}:
        return False
    if kinds <= {int, bool, float, str}:
        bad = next((v for v in values if isinstance(v, str) and v not in NON_FINITE), None)
        if bad is None:
            return True
        raise mismatch(f"a value is {describe(bad)}")
    bad = next(v for v in values if type(v) not in (int, bool, float, str))
    raise mismatch(f"a value is {describe(bad)}")


def unfinite(values):
    """The probes' strings for NaN and infinity (see specdec_probe.finite) back as floats."""
    if isinstance(values, list):
        return [unfinite(v) for v in values]
    return NON_FINITE[values] if isinstance(values, str) else values


class NoAnswer:
    """The answer of a call that got none (the sandbox died or stalled), told apart from a function that
    returned None."""

    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER = NoAnswer()


def judge(check: Check, inputs: dict, answer: Any, reference: dict) -> Verdict:
    """Run `check`'s judge; a judge that cannot read the answer counts as a failed check, never a crash."""
    if answer is NO_ANSWER:
        return Verdict(False, f"{check.what}: no answer came back (the notebook stopped, or the sandbox was "
                              "ended, before this call)")
    try:
        if isinstance(answer, dict) and ("error" in answer or "unsupported" in answer):
            decode(answer)  # the probe itself reported a failure (e.g. the function is not defined)
        check.judge(inputs, answer, reference)
    except Fail as failure:
        return Verdict(False, clip(f"{check.what}: {failure}", MAX_MESSAGE_CHARS))
    except Exception as error:  # odd data from the sandbox: a failure with a reason, not a crashed batch
        reason = f"{type(error).__name__}: {clip(str(error), 300)}"
        return Verdict(False, clip(f"{check.what}: the answer could not be read ({reason})", MAX_MESSAGE_CHARS))
    return Verdict(True, check.what)


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, marked with "..." where it was cut."""
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def show(value, digits: int = 3) -> str:
    """A short readable form of a tensor, array, list, dict or number for messages (floats to `digits`
    significant digits). It reads no more of `value` than it prints: at most MAX_SHOWN items per level and about
    MAX_SHOWN_CHARS characters, so showing a huge answer costs nothing."""
    return clip(shown(value, digits, MAX_SHOWN_CHARS, 0), MAX_SHOWN_CHARS)


def shown(value, digits: int, room: int, depth: int) -> str:
    """show()'s text of `value` at nesting `depth`, stopping once about `room` characters are written."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0 or isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"  # printing a huge one is slow, or refused
    if isinstance(value, str):
        return repr(clip(value, room))
    if isinstance(value, (list, tuple, dict, torch.Tensor, np.ndarray)) and depth >= MAX_SHOWN_DEPTH:
        return "[...]" if not isinstance(value, dict) else "{...}"
    if isinstance(value, (list, tuple, torch.Tensor, np.ndarray)):
        items = (shown(value[i], digits, room, depth + 1) for i in range(len(value)))
        return "[" + shown_items(items, len(value), room) + "]"
    if isinstance(value, dict):
        items = (f"{shown(str(k), digits, 40, depth)}: {shown(v, digits, room, depth + 1)}" for k, v in value.items())
        return "{" + shown_items(items, len(value), room) + "}"
    return clip(repr(value), room)


def shown_items(items, count: int, room: int) -> str:
    """The first of `count` texts from the iterator `items`, joined, up to MAX_SHOWN of them or `room` chars."""
    parts, used = [], 0
    for part in itertools.islice(items, MAX_SHOWN):
        parts.append(part)
        used += len(part) + 2
        if used >= room:
            break
    return ", ".join(parts) + (", ..." if len(parts) < count else "")


def describe(value) -> str:
    """What `value` is, for a message that refuses it: its type and a short form, e.g. "a float (3.5)"."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        kind = str(value.dtype).removeprefix("torch.")
        if value.dim() == 0:
            return f"a 0-d {kind} tensor ({show(value)})"
        return f"a {value.dim()}-D {kind} tensor of shape {tuple(value.shape)} ({show(value)})"
    return f"{a_name(type(value).__name__)} ({show(value)})"


def a_name(name: str) -> str:
    """`name` with its article: "a float", "an int"."""
    return f"{'an' if name[:1].lower() in tuple('aeiou') else 'a'} {name}"


INTEGER_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


def integer(value) -> int | None:
    """`value` as an int when it is one: a Python or numpy integer, or an integer tensor of one element (0-d or
    not); None for anything else, bools included (True is not token 1)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype in INTEGER_DTYPES:
        return int(value.item())
    return None


def as_tensor(value, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """`value` decoded as a tensor (of `shape` if given), or Fail saying what came back instead."""
    value = decode(value)
    if not isinstance(value, torch.Tensor):
        raise Fail(f"expected a tensor, got {describe(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Fail(f"expected a tensor of shape {tuple(shape)}, got shape {tuple(value.shape)}")
    return value


def as_ints(value) -> list[int]:
    """`value` decoded as a list of token ids: a 1-D integer tensor or array, or a list or tuple whose items are
    integers (Python or numpy ints, 0-d integer tensors); or Fail naming what came back instead."""
    value = decode(value)
    if isinstance(value, torch.Tensor):
        if value.dim() <= 1 and value.dtype in INTEGER_DTYPES:
            return [int(v) for v in value.reshape(-1).tolist()]
        raise Fail(f"expected a list of token ids, got {describe(value)}")
    if not isinstance(value, list):
        raise Fail(f"expected a list of token ids, got {describe(value)}")
    tokens = []
    for index, item in enumerate(value):
        token = integer(item) if not isinstance(item, torch.Tensor) or item.dim() == 0 else None
        if token is None:
            raise Fail(f"expected a list of token ids, got a list whose item {index} is {describe(item)}")
        tokens.append(token)
    return tokens


def as_int(value) -> int:
    """`value` decoded as one integer (a Python or numpy int, an integer tensor of one element), or Fail."""
    value = decode(value)
    got = integer(value)
    if got is None:
        raise Fail(f"expected an integer, got {describe(value)}")
    return got


def as_float(value) -> float:
    """`value` decoded as one number (an int or float, Python or numpy, a tensor of one element; "nan" and
    "inf" as the probes send them), or Fail naming what came back instead. Bools are not numbers here."""
    value = decode(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return float(value.item())
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise Fail(f"expected a number, got {describe(value)}")


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


def histogram_run(case: dict, answer, broken: bool, rule: str) -> torch.Tensor:
    """The counts (V,) of one run of a histogram exercise whose probe also ran it with the lab's verification
    rule replaced by a broken one (`broken`: that run's counts; `rule`: how the message names the broken rule,
    e.g. "verify replaced by one that accepts every drafted token"), or Fail."""
    got = decode(answer)
    require(isinstance(got, dict) and "counts" in got and "broken" in got,
            f"expected the histogram and the histogram with {rule.split(' replaced')[0]} broken, got {show(got)}")
    when = f" (with {rule})" if broken else ""
    counts = as_tensor(got["broken" if broken else "counts"], (len(case["p"]),))
    require(int(counts.sum()) == case["n"], f"the counts{when} should add up to n = {case['n']}, they add up to "
                                            f"{show(float(counts.sum()))}")
    return counts


def require_follows_broken_rule(case: dict, answer, rule: str, verify: str, p_value: float) -> None:
    """The histogram run with the lab's verification replaced by a rule that checks every draft against q itself
    (`rule` names it, `verify` the lab's function) must follow q: a histogram counts what verification emits,
    while one that samples p by itself follows p there too."""
    counts, q = histogram_run(case, answer, True, rule), torch.tensor(case["q"])
    pvalue = chi_square_pvalue(counts, q)
    require(pvalue > p_value, f"with {rule}, the first tokens should follow q = {show(q)}, but your histogram does "
                              f"not change the way it should (chi-square p-value against q {pvalue:.1e}; observed "
                              f"{show(counts / case['n'])}): first_token_histogram must count what `{verify}` "
                              "emits, not sample p by itself")


@torch.no_grad()
def greedy_tokens(model, prompt: list[int], n: int) -> list[int]:
    """`n` tokens of plain greedy decoding of `model` after `prompt`, without any cache (the trusted side's
    ground truth)."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def serve_case_models(inputs: dict, ref: dict) -> dict:
    """A `Check.serve` for checks with one model per case, of the lab's own `tiny_llama(seed)`, from the seeds
    under inputs["secret"]["seeds"]: served as "case0", "case1", ..."""
    return {f"case{i}": ref["tiny_llama"](seed) for i, seed in enumerate(inputs["secret"]["seeds"])}
