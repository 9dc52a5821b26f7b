"""Turns a submitted file into the notebook the sandbox runs (trusted side; nothing here executes student code).

A submission is read leniently (any nbformat 4 minor version, odd metadata, a missing or duplicated cell) and
rebuilt on the lab's release notebook: every cell the lab provides (instructions, setup, tests) comes from the
release, each answer cell from the student's cell with the same grade id, and every cell the student added
(scratch work, helpers) is kept after the lab cell it followed. So a deleted test cell, an edited locked cell, a
helper pasted from another lab or a changed cell metadata never stops grading; each repair is noted.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

# Saved outputs are discarded (the sandbox makes its own), so they never count against the notebook's size: a
# correct notebook with a big plotly figure is graded. Only the raw file has a hard cap, against exhausting the
# grader's memory while parsing it (JSON takes about 4x its size in Python objects, and two notebooks may be read
# at once); what is kept (sources, metadata) has the real limit.
MAX_NOTEBOOK_BYTES = 100 << 20  # the raw file, saved outputs included
MAX_CONTENT_BYTES = 20 << 20  # the notebook as JSON once its saved outputs are dropped
CELL_TYPES = {"code", "markdown", "raw"}


@dataclass
class StudentCell:
    """One cell as submitted: its type, source and grade id (None for cells without nbgrader metadata)."""

    cell_type: str
    source: str
    grade_id: str | None


@dataclass
class Assembled:
    """The notebook to run, the index of each graded cell in it, and notes on what was repaired."""

    notebook: nbformat.NotebookNode
    graded_cells: dict[str, int]
    notes: list[str] = field(default_factory=list)


class Unreadable(Exception):
    """The file is not a notebook at all; the message says why."""


def source_text(source) -> str:
    if isinstance(source, list):
        return "".join(str(part) for part in source)
    return source if isinstance(source, str) else ""


def read_cells(path: Path) -> tuple[list[StudentCell], list[str]]:
    """The cells of the submitted file at `path`, read without trusting its schema and with its saved outputs
    dropped (they never count against a size limit); and notes on oddities. Raises Unreadable, saying why, for
    a file that is not a notebook, over MAX_NOTEBOOK_BYTES, or over MAX_CONTENT_BYTES without its outputs."""
    if not path.is_file():  # a FIFO or a device would block or never end
        raise Unreadable("the submission is not a regular file")
    with path.open("rb") as handle:  # at most the cap, whatever size the file claims
        content = handle.read(MAX_NOTEBOOK_BYTES + 1)
    if len(content) > MAX_NOTEBOOK_BYTES:
        raise Unreadable(f"the file is larger than {MAX_NOTEBOOK_BYTES >> 20} MB, the most the grader reads even "
                         "though saved outputs are discarded; clear its outputs and submit it again")
    try:
        data = json.loads(content, object_hook=without_outputs)
    except (ValueError, RecursionError) as error:
        raise Unreadable(f"the file is not valid JSON ({str(error)[:120]})") from None
    del content  # the parsed notebook, outputs dropped, is all that is kept
    if json_size(data, MAX_CONTENT_BYTES) > MAX_CONTENT_BYTES:
        raise Unreadable(f"the notebook is larger than {MAX_CONTENT_BYTES >> 20} MB without its saved outputs (its "
                         "code, text, attachments and metadata); the limit is for those alone")
    if isinstance(data, dict) and "worksheets" in data:  # nbformat 3: let nbformat convert it
        data = nbformat.convert(nbformat.from_dict(data), 4)
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise Unreadable("the file is JSON but not a Jupyter notebook (it has no list of cells)")
    cells, notes = [], []
    for index, raw in enumerate(data["cells"]):
        kind = raw.get("cell_type") if isinstance(raw, dict) else None
        if kind not in CELL_TYPES:
            notes.append(f"cell {index} is not a code, markdown or raw cell and was skipped")
            continue
        meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
        nbgrader = meta.get("nbgrader") if isinstance(meta.get("nbgrader"), dict) else {}
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader.get("grade_id"), str) else None
        cells.append(StudentCell(kind, source_text(raw.get("source", "")), grade_id))
    return cells, notes


def without_outputs(obj: dict) -> dict:
    """json.loads' hook: a cell (any dict with a cell_type) loses its saved outputs as soon as it is parsed, so
    they are never kept while the rest of the notebook is read."""
    if "cell_type" in obj:
        obj.pop("outputs", None)
    return obj


def json_size(data, limit: int) -> int:
    """The size in bytes of `data` written as JSON (UTF-8), counted in pieces and only until it passes `limit`,
    so measuring a huge notebook builds no huge string."""
    size = 0
    for chunk in json.JSONEncoder(ensure_ascii=False).iterencode(data):
        size += len(chunk.encode(errors="surrogatepass"))  # a lone surrogate is valid JSON
        if size > limit:
            break
    return size


def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def is_answer(cell) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def is_test(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def is_written(cell) -> bool:
    """A written answer: nbgrader's manually graded answer cell (solution and grade, not a task). No check can
    grade it; a person does, and until then its points are reported as awaiting manual grading."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("solution")) and bool(meta.get("grade")) and not meta.get("task")


def assemble(release: nbformat.NotebookNode, cells: list[StudentCell]) -> Assembled:
    """The release notebook with the student's answers and added cells in place (see the module docstring)."""
    known = {grade_id(c): c for c in release.cells if grade_id(c)}
    lab_texts = {c.source for c in release.cells if not grade_id(c)}  # the lab's own instructions
    answers: dict[str, str] = {}
    extras: dict[str | None, list[StudentCell]] = {}
    anchor: str | None = None
    notes: list[str] = []
    for cell in cells:
        if cell.grade_id is None and cell.source in lab_texts:
            continue  # the student's copy of the instructions: the release's copy is used
        if cell.grade_id in known and cell.grade_id not in answers:
            answers[cell.grade_id] = cell.source
            anchor = cell.grade_id
            continue
        if cell.grade_id in answers:
            notes.append(f"a second copy of the cell '{cell.grade_id}' was run as an ordinary cell")
        elif cell.grade_id is not None:
            notes.append(f"a cell marked '{cell.grade_id}', which this lab does not have (pasted from another "
                         "lab?), was run as an ordinary cell")
        extras.setdefault(anchor, []).append(cell)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    graded: dict[str, int] = {}
    first_lab_cell = next((i for i, c in enumerate(release.cells) if grade_id(c)), 0)
    for index, cell in enumerate(release.cells):
        if index == first_lab_cell:
            nb.cells.extend(plain_cell(c) for c in extras.get(None, []))
        cell = copy.deepcopy(cell)
        cell.pop("id", None)
        gid = grade_id(cell)
        if gid and is_answer(cell):
            if gid not in answers and is_written(cell):  # its question stays, unanswered: no answer, no points
                notes.append(f"the written answer '{gid}' was not found (deleted, or its cell metadata changed): "
                             "it counts as no answer")
            elif gid not in answers:  # deleted, or its metadata lost: its code (if any) runs as an added cell
                notes.append(f"the answer cell '{gid}' was not found (deleted, or its cell metadata changed)")
                nb.cells.extend(plain_cell(c) for c in extras.get(gid, []))
                continue
            else:
                cell.source = answers[gid]
        elif gid and gid not in answers:
            notes.append(f"the lab's cell '{gid}' was missing and was put back")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        if gid and is_test(cell):
            graded[gid] = len(nb.cells)
        nb.cells.append(cell)
        if gid:
            nb.cells.extend(plain_cell(c) for c in extras.get(gid, []))
    for cell in nb.cells:
        cell["id"] = f"cell-{nb.cells.index(cell)}"
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return Assembled(nb, graded, notes)


def plain_cell(cell: StudentCell) -> nbformat.NotebookNode:
    """A student-added cell, without any nbgrader metadata."""
    if cell.cell_type == "code":
        return nbformat.v4.new_code_cell(cell.source)
    if cell.cell_type == "markdown":
        return nbformat.v4.new_markdown_cell(cell.source)
    return nbformat.v4.new_raw_cell(cell.source)


ALLOWED_OUTPUT_DATA = ("text/plain", "image/png")
MAX_TEXT = 20_000
# nbconvert writes a PNG's data unescaped into <img src="data:image/png;base64,...">: only base64 text may reach it.
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def clean_outputs(outputs) -> list[nbformat.NotebookNode]:
    """Outputs from the sandbox (untrusted) reduced to plain text, tracebacks and PNG images, each capped."""
    cleaned = []
    for output in outputs if isinstance(outputs, list) else []:
        if not isinstance(output, dict):
            continue
        kind = output.get("output_type")
        if kind == "stream":
            cleaned.append(nbformat.v4.new_output("stream", name="stdout",
                                                  text=source_text(output.get("text"))[:MAX_TEXT]))
        elif kind == "error":
            trace = [str(line)[:MAX_TEXT] for line in output.get("traceback", [])][:60] \
                if isinstance(output.get("traceback"), list) else []
            cleaned.append(nbformat.v4.new_output("error", ename=str(output.get("ename"))[:200],
                                                  evalue=str(output.get("evalue"))[:2000], traceback=trace))
        elif kind in ("execute_result", "display_data") and isinstance(output.get("data"), dict):
            data = {k: source_text(v) for k, v in output["data"].items() if k in ALLOWED_OUTPUT_DATA}
            data = {k: v[:MAX_TEXT] if k == "text/plain" else v for k, v in data.items() if len(v) < 2_000_000
                    and (k != "image/png" or BASE64.fullmatch(v))}
            if data:
                cleaned.append(nbformat.v4.new_output("display_data", data=data))
    return cleaned
