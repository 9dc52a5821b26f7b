"""Inside the sandbox: what every probe uses to call the student's functions and return plain data.

A probe (probes/<lab>.py) receives the notebook's namespace and the trusted checker's inputs (host.py runs it in a
child process of its own, one per call), calls the student's functions, and returns plain data. `plain` turns
results into JSON-able values: tensors become their raw values, shape and dtype; anything else that is not a
number, string, list or dict is reported by type name, never trusted or compared here. Nothing in this module
decides a grade.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch


def tensor(value, dtype=torch.float32) -> torch.Tensor:
    """A tensor from the plain nested lists the checker sent."""
    return torch.tensor(value, dtype=dtype)


def plain(value, depth: int = 0):
    """`value` (whatever the student's function returned; `depth`: how deep in it this is) as JSON-able plain
    data. Tensors and numpy arrays of numbers or bools become {"tensor": values, "shape", "dtype"}, numpy
    scalars become Python numbers, tuples lists; a type the checker cannot read becomes {"unsupported": its
    name}, with "why" when only its size is the problem."""
    if depth > 20:
        return {"unsupported": "nesting too deep"}
    if isinstance(value, torch.Tensor):
        return plain_tensor(torch.Tensor.detach(value).cpu(), str(value.dtype))
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":
            return plain_array(value)
        return plain(value.tolist(), depth + 1)  # strings or objects: item by item
    if isinstance(value, np.generic):  # np.int64, np.float32, np.bool_, ...: the Python number it holds
        item = float(value) if isinstance(value, np.floating) else value.item()  # longdouble's item() stays numpy
        return {"unsupported": f"numpy.{type(value).__name__}"} if isinstance(item, np.generic) else \
            plain(item, depth + 1)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return finite(float(value))
    if isinstance(value, str):
        return str(value)[:10_000]
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in list(value)[:100_000]]
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in list(value.items())[:10_000]}
    return {"unsupported": type(value).__name__}


# The most values one tensor or array may send: the checker reads no more in one answer (MAX_ELEMENTS in
# autograder/checks/_common.py), so a bigger one is reported here by its size instead of being sent.
MAX_VALUES = 10_000_000


def plain_tensor(t: torch.Tensor, dtype: str):
    """The CPU tensor `t` (of the student's dtype named `dtype`) as {"tensor": nested values, "shape", "dtype"};
    floats are sent as float64, so nothing is rounded on the way."""
    if t.is_complex() or t.layout != torch.strided:
        return {"unsupported": f"{dtype} tensor" if t.is_complex() else f"{t.layout} tensor"}
    if t.numel() > MAX_VALUES:
        return too_many(t.numel(), tuple(t.shape), "tensor")
    if t.is_floating_point():
        t = t.double()
        values = t.tolist()
        return {"tensor": values if bool(torch.isfinite(t).all()) else finite(values), "shape": list(t.shape),
                "dtype": dtype}
    return {"tensor": t.tolist(), "shape": list(t.shape), "dtype": dtype}


def plain_array(array: np.ndarray):
    """The numpy array `array` of numbers or bools, sent as a tensor is (see plain_tensor): its values become
    Python numbers exactly (float32 widens to float64 losslessly)."""
    if array.size > MAX_VALUES:
        return too_many(array.size, array.shape, "numpy array")
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:  # longdouble: tolist() would keep numpy scalars
        array = array.astype(np.float64)
    values = array.tolist()
    if array.dtype.kind == "f" and not bool(np.isfinite(array).all()):
        values = finite(values)
    return {"tensor": values, "shape": list(array.shape), "dtype": f"numpy.{array.dtype}"}


def too_many(count: int, shape: tuple[int, ...], kind: str) -> dict:
    """The answer for a `kind` of `shape` with more than MAX_VALUES values: its size, not its values."""
    return {"unsupported": f"{kind} of shape {tuple(shape)}",
            "why": f"it has {count:,} values, more than the {MAX_VALUES:,} the grader reads"}


def finite(value):
    """`value` (a float or nested lists of them) with NaN and infinity as the strings "nan", "inf" and "-inf",
    which the checker reads back: JSON has no such numbers."""
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def call(function, *args, **kwargs):
    """The plain result of one call, or {"error": ...} naming the exception the student's code raised."""
    try:
        return plain(function(*args, **kwargs))
    except Exception as error:  # any exception in student code is an answer to report, not a crash
        frames = traceback.extract_tb(error.__traceback__)
        where = next((f"line {f.lineno}" for f in reversed(frames) if f.filename.startswith("<")), "")
        text = f"{type(error).__name__}: {str(error)[:300]}" if str(error) else type(error).__name__
        return {"error": text, "where": where}


# The relay to the trusted side while a call runs (set by host.py in the call's child process; None in tests
# that run probes in the checker's own process, which install a channel of their own).
CHANNEL = None


def served(inputs: dict, name: str):
    """The model `name` that the trusted side serves for this call (its forwards are counted outside)."""
    from served import ServedModel

    if CHANNEL is None:
        raise RuntimeError("no channel to the trusted side: served models exist only during a grading call")
    return ServedModel(name, inputs["served"][name], CHANNEL)


def get(namespace: dict, name: str):
    """The student's object called `name`, or a clear error when the notebook never defined it."""
    if name not in namespace:
        raise NameError(f"'{name}' is not defined (did its cell run without an error?)")
    return namespace[name]


@contextmanager
def replaced(ns: dict, user: Callable, name: str, replacement) -> Iterator[None]:
    """While the block runs, `name` is `replacement` in `ns` and in the globals `user` (the student's function
    that calls it) looks names up in; both are restored afterwards."""
    scopes = [ns]
    scope = getattr(user, "__globals__", None)
    if isinstance(scope, dict) and scope is not ns:
        scopes.append(scope)
    missing = object()
    saved = [(s, s.get(name, missing)) for s in scopes]
    for s in scopes:
        s[name] = replacement
    try:
        yield
    finally:
        for s, value in saved:
            if value is missing:
                s.pop(name, None)
            else:
                s[name] = value
