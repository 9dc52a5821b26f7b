"""The trusted side reading answers from the sandbox: no answer can hurt the grader, every honest form is read.

An answer is plain JSON that code inside the sandbox chose, so it may name a huge shape, hold values that do not
fill its shape, nest without end or carry megabytes of text: each must fail its own test with a short, clear
message, quickly and without the grader allocating what the answer names. And an honest student's numpy
integers, 0-d tensors, tuples or arrays must be read as the token lists and numbers they are, through the real
path: specdec_probe.plain inside the sandbox, JSON, decode on the trusted side. Last, a notebook's saved outputs
never count against its size limit.
"""

from __future__ import annotations

import importlib
import json
import math
import time
import tracemalloc
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from autograder import assemble, pipeline
from autograder.checks import _common
from autograder.checks._common import Check, Fail, as_float, as_int, as_ints, as_tensor, fixed, judge, show


@pytest.fixture
def probe(monkeypatch):
    """The sandbox's specdec_probe module, imported as the probes import it."""
    monkeypatch.syspath_prepend(str(pipeline.AUTOGRADER / "sandbox" / "inside"))
    return importlib.import_module("specdec_probe")


@pytest.fixture
def sent(probe):
    """What the trusted side receives for a student's return value: plain() inside, then strict JSON."""
    return lambda value: json.loads(json.dumps(probe.plain(value), allow_nan=False))


def reads(read) -> Check:
    """A check whose judge only reads the answer with `read` (as_tensor, as_ints, ...)."""
    return Check("probe", fixed({}), lambda inputs, answer, ref: read(answer), f"reads with {read.__name__}")


def refused(read, answer) -> str:
    """judge()'s message for `answer` read with `read`; the test fails if the answer passes or judge raises."""
    verdict = judge(reads(read), {}, answer, {})
    assert not verdict.passed, answer
    assert len(verdict.message) <= _common.MAX_MESSAGE_CHARS
    return verdict.message


@pytest.mark.parametrize("answer", [
    {"tensor": [], "shape": [20000, 20000]},
    {"tensor": [], "shape": [20000, 20000], "dtype": "torch.int64"},
    {"tensor": [1.0], "shape": [1, 100000, 100000, 100000]},
    {"tensor": [], "shape": [10_000_000, 10_000_000, 0]},  # no values to make, and none to fill dimension 0
])
def test_a_huge_shape_is_refused_quickly_without_allocating(answer):
    tracemalloc.start()
    started = time.monotonic()
    try:
        message = refused(as_tensor, answer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 1.0, "refusing takes no work proportional to the named shape"
    assert peak < 1 << 20, f"refusing allocated {peak} bytes"
    assert "shape" in message, message


def test_the_values_in_one_answer_are_bounded_across_its_tensors():
    half = _common.MAX_ELEMENTS // 2 + 1
    one = {"tensor": [0] * half, "shape": [half], "dtype": "torch.int8"}
    assert as_tensor(one).shape == (half,), "one tensor of half the limit is read"
    with pytest.raises(Fail, match="more than the 10,000,000 values"):
        _common.decode([one, one])


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("answer, reason", [
    ({"tensor": [1, 2], "shape": [3]}, "should hold 3 values, it holds 2"),
    ({"tensor": [[1, 2], [3]], "shape": [2, 2]}, "dimension 1 should hold 2 values, it holds 1"),
    ({"tensor": [1, [2]], "shape": [2]}, "a value is a list"),
    ({"tensor": [[1, 2], 3], "shape": [2, 2]}, "dimension 1 should be a list of 2 values, it is an int"),
    ({"tensor": ["abc", 1.5], "shape": [2]}, "a value is a str ('abc')"),
    ({"tensor": [{"a": 1}], "shape": [1]}, "a value is a dict"),
    ({"tensor": [None], "shape": [1]}, "a value is None"),
    ({"tensor": "nonsense", "shape": []}, "a value is a str"),
    ({"tensor": [1], "shape": [-1]}, "unreadable shape"),
    ({"tensor": [1], "shape": [True]}, "unreadable shape"),
    ({"tensor": [1], "shape": "1"}, "unreadable shape"),
    ({"tensor": [1], "shape": [1.0]}, "unreadable shape"),
    ({"tensor": [1]}, "unreadable shape"),
    ({"tensor": nested(40), "shape": [1] * 40}, "unreadable shape"),
    ({"tensor": [2 ** 80], "shape": [1]}, "could not be read"),
    ({"unsupported": "x" * 5_000_000}, "not a tensor, list or number"),
    ({"error": "E" * 5_000_000, "where": "w" * 5_000_000}, "your code raised EEE"),
    (nested(5000), "nested more than 64 levels"),
    ({"k": nested(100)}, "nested more than 64 levels"),
])
def test_a_malformed_answer_fails_its_own_test_with_a_short_clear_message(answer, reason):
    message = refused(as_tensor, answer)
    assert reason in message, message


def test_show_reads_no_more_of_a_value_than_it_prints():
    values = [torch.zeros(3000, 3000), np.zeros((2000, 2000)), nested(5000), list(range(1_000_000)),
              {str(i): i for i in range(100_000)}, "x" * 5_000_000, 10 ** 4000, [[1.23456, 2], (3, np.int64(4))]]
    started = time.monotonic()
    texts = [show(value) for value in values]
    assert time.monotonic() - started < 0.5
    assert all(len(text) <= _common.MAX_SHOWN_CHARS for text in texts), [len(t) for t in texts]
    assert texts[0].startswith("[[0, 0, 0,") and texts[3].startswith("[0, 1, 2,") and "..." in texts[3]
    assert texts[-1] == "[[1.23, 2], [3, 4]]"


@pytest.mark.parametrize("value", [
    [1, 2, 3], (1, 2, 3), [np.int64(1), np.int64(2), np.int64(3)], (np.int32(1), np.uint8(2), np.int16(3)),
    [torch.tensor(1), torch.tensor(2), torch.tensor(3)], [torch.tensor(1, dtype=torch.int32), 2, np.int64(3)],
    torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3], dtype=torch.int32), np.array([1, 2, 3]),
    np.array([1, 2, 3], dtype=np.uint8), np.array([1, 2, 3], dtype=">i4"),  # big-endian, as np.load can give
], ids=lambda v: type(v).__name__ + ("" if not isinstance(v, (list, tuple)) else f"[{type(v[0]).__name__}]"))
def test_every_honest_form_of_a_token_list_is_read(value, sent):
    assert as_ints(sent(value)) == [int(v) for v in value]


def test_an_empty_token_list_is_read_in_every_form(sent):
    for value in ([], (), torch.tensor([], dtype=torch.long), np.array([], dtype=np.int64)):
        assert as_ints(sent(value)) == [], value


@pytest.mark.parametrize("value", [5, np.int64(5), np.int8(5), np.uint16(5), torch.tensor(5),
                                   torch.tensor([5]), torch.tensor(5, dtype=torch.int32), np.array(5)],
                         ids=lambda v: f"{type(v).__name__}-{getattr(v, 'dtype', '')}")
def test_every_honest_form_of_an_integer_is_read(value, sent):
    assert as_int(sent(value)) == int(value)


@pytest.mark.parametrize("value", [2.5, 2, np.float32(2.5), np.float64(2.5), np.float16(2.5), np.int64(2),
                                   torch.tensor(2.5), torch.tensor(2.5, dtype=torch.float16),
                                   torch.tensor(2.5, dtype=torch.bfloat16), torch.tensor([2.5]), torch.tensor(2),
                                   np.array(2.5, dtype=np.float32), np.array([2.5]), np.longdouble(2.5),
                                   np.array([2.5], dtype=np.longdouble)],
                         ids=lambda v: f"{type(v).__name__}-{getattr(v, 'dtype', '')}")
def test_every_honest_form_of_a_number_is_read(value, sent):
    assert as_float(sent(value)) == float(value.item() if hasattr(value, "item") else value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan"), torch.tensor(math.inf),
                                   torch.tensor([1.0, math.nan]), np.array([-math.inf, 2.0], dtype=np.float32)],
                         ids=repr)
def test_nan_and_infinity_survive_the_trip_as_what_they_are(value, sent):
    expected = torch.as_tensor(np.asarray(value, dtype=np.float64))
    got = as_tensor(sent(value)) if expected.dim() else torch.tensor(as_float(sent(value)), dtype=torch.float64)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(0.0), expected.nan_to_num(0.0))


@pytest.mark.parametrize("value", [np.array([[1.5, 2.0]], dtype=np.float32), np.array([[1, 2]], dtype=np.int16),
                                   np.array([True, False]), np.zeros((0, 3)), torch.tensor([[0.25], [0.5]])],
                         ids=lambda v: f"{type(v).__name__}-{v.dtype}")
def test_arrays_of_any_number_dtype_arrive_as_tensors_of_their_values(value, sent):
    got = as_tensor(sent(value), tuple(value.shape))
    expected = torch.as_tensor(np.asarray(value))
    assert got.dtype.is_floating_point == expected.dtype.is_floating_point and torch.equal(got.to(expected.dtype),
                                                                                           expected)


@pytest.mark.parametrize("read, value, named", [
    (as_ints, [1, 2, 3.5], "a list whose item 2 is a float (3.5)"),
    (as_ints, [1, True], "a list whose item 1 is a bool (True)"),
    (as_ints, [np.bool_(True)], "a list whose item 0 is a bool"),
    (as_ints, [1, "2"], "a list whose item 1 is a str ('2')"),
    (as_ints, [[1, 2]], "a list whose item 0 is a list ([1, 2])"),
    (as_ints, [torch.tensor([1, 2])], "item 0 is a 1-D int64 tensor of shape (2,)"),
    (as_ints, [torch.tensor(1.0)], "item 0 is a 0-d float64 tensor"),
    (as_ints, torch.tensor([[1, 2]]), "a 2-D int64 tensor of shape (1, 2)"),
    (as_ints, torch.tensor([1.0, 2.0]), "a 1-D float64 tensor"),
    (as_ints, torch.tensor([True]), "a 1-D bool tensor"),
    (as_ints, np.array(["a", "b"]), "item 0 is a str ('a')"),
    (as_ints, "123", "a str ('123')"),
    (as_ints, [1, None], "a list whose item 1 is None"),
    (as_ints, {"tokens": [1]}, "a dict ({'tokens': [1]})"),
    (as_int, 3.5, "a float (3.5)"),
    (as_int, np.bool_(False), "a bool (False)"),
    (as_int, torch.tensor([1, 2]), "a 1-D int64 tensor of shape (2,)"),
    (as_float, True, "a bool (True)"),
    (as_float, "fast", "a str ('fast')"),
    (as_float, [1.0], "a list ([1])"),
    (as_float, 1 + 2j, "complex"),
    (as_float, object(), "an object"),
    (as_tensor, [1.0, 2.0], "a list ([1, 2])"),
])
def test_a_refused_type_is_named_in_the_message(read, value, named, sent):
    message = refused(read, sent(value))
    assert named in message, message


def test_a_tensor_too_big_to_send_is_reported_by_its_size(probe, sent):
    big = torch.zeros(probe.MAX_VALUES + 1, dtype=torch.int8)
    assert probe.MAX_VALUES == _common.MAX_ELEMENTS, "the sandbox sends no more than the checker reads"
    message = refused(as_tensor, sent(big))
    assert "tensor of shape (10000001,)" in message and "more than the 10,000,000" in message, message


def notebook_file(tmp_path: Path, source: str, output_bytes: int) -> Path:
    """A notebook file with one code cell of `source` whose saved output is a plotly-like figure of about
    `output_bytes` bytes of JSON (numbers, as plotly saves them)."""
    points = [0.125] * (output_bytes // 6)  # "0.125," each
    output = nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": {"data": [{"y": points}]},
                                                          "text/plain": "Figure"})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# lab"),
                                         nbformat.v4.new_code_cell(source, outputs=[output])])
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))  # as one line: nbformat's indented writer is slow on this much
    return path


def test_saved_outputs_never_count_against_the_size_limit(tmp_path):
    path = notebook_file(tmp_path, "fig.show()", 25 << 20)
    assert path.stat().st_size > 25 << 20 > assemble.MAX_CONTENT_BYTES
    cells, notes = assemble.read_cells(path)
    assert [(c.cell_type, c.source) for c in cells] == [("markdown", "# lab"), ("code", "fig.show()")]
    assert notes == []


def test_a_notebook_too_big_without_its_outputs_is_refused_with_a_message(tmp_path):
    path = notebook_file(tmp_path, "x = 1\n" * ((25 << 20) // 6), 0)
    with pytest.raises(assemble.Unreadable, match="larger than 20 MB without its saved outputs"):
        assemble.read_cells(path)


def test_a_file_past_the_hard_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(assemble, "MAX_NOTEBOOK_BYTES", 1 << 20)
    path = notebook_file(tmp_path, "fig.show()", 2 << 20)
    with pytest.raises(assemble.Unreadable, match="larger than 1 MB"):
        assemble.read_cells(path)
    with pytest.raises(assemble.Unreadable, match="not a regular file"):
        assemble.read_cells(tmp_path)
