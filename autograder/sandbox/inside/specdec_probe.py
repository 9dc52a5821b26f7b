"""Inside the sandbox: runs one probe in the student's kernel and writes its answer as plain data.

A probe (probes/<lab>.py) receives the kernel's namespace and the trusted checker's inputs, calls the
student's functions, and returns plain data. `plain` turns results into JSON-able values: tensors become
their raw values, shape and dtype; anything else that is not a number, string, list or dict is reported by
type name, never trusted or compared here. Nothing in this module decides a grade.
"""

from __future__ import annotations

import importlib
import json
import math
import traceback

import torch


def tensor(value, dtype=torch.float32) -> torch.Tensor:
    """A tensor from the plain nested lists the checker sent."""
    return torch.tensor(value, dtype=dtype)


def plain(value, depth: int = 0):
    """`value` as JSON-able plain data (tensors as {"tensor": values, "shape", "dtype"})."""
    if depth > 20:
        return {"unsupported": "nesting too deep"}
    if isinstance(value, torch.Tensor):
        t = torch.Tensor.detach(value).cpu()
        t = t.double() if t.is_floating_point() else t
        return {"tensor": finite(t.tolist()), "shape": list(t.shape), "dtype": str(value.dtype)}
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


def finite(value):
    """JSON has no NaN or infinity: send them as strings the checker understands."""
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


def run(probe_json: str, out_path: str) -> None:
    """Run the probe described by `probe_json` ({"lab", "probe", "inputs"}) and write its answer."""
    probe = json.loads(probe_json)
    namespace = get_ipython().user_ns  # noqa: F821 - provided by IPython in the kernel
    try:
        module = importlib.import_module(f"probes.{probe['lab']}")
        answer = getattr(module, probe["probe"])(namespace, probe["inputs"])
    except Exception as error:  # a missing function or a crash outside `call`: reported, never raised
        answer = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    with open(out_path, "w") as handle:
        json.dump(answer, handle)


def get(namespace: dict, name: str):
    """The student's object called `name`, or a clear error when the notebook never defined it."""
    if name not in namespace:
        raise NameError(f"'{name}' is not defined (did its cell run without an error?)")
    return namespace[name]
