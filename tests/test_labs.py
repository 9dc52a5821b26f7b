"""The graded labs: structure of the nbgrader source notebooks, and labs/ equal to a fresh nbgrader release.

The solutions themselves are executed (and must score full marks) in tests/test_autograder.py.
"""

from __future__ import annotations

import nbformat
import pytest

from autograder import assemble, pipeline

LABS = pipeline.list_labs()


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def comparable(nb) -> list[tuple]:
    """What a release must reproduce: each cell's type, source and nbgrader metadata (ids and outputs aside)."""
    return [(c.cell_type, c.source, nbgrader_meta(c)) for c in nb.cells]


def test_at_least_four_labs():
    assert len(LABS) >= 4 and LABS == sorted(LABS)


@pytest.mark.parametrize("lab", LABS)
def test_source_notebook_structure(lab):
    nb = nbformat.read(pipeline.SOLUTIONS / lab / f"{lab}.ipynb", as_version=4)
    ids = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), "grade ids must be unique"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    cells = [c for c in nb.cells if nbgrader_meta(c)]
    tests = [c for c in cells if nbgrader_meta(c).get("grade")]
    assert tests and all(nbgrader_meta(c)["points"] > 0 for c in tests)
    hidden = [c for c in tests if nbgrader_meta(c)["grade_id"].endswith("_hidden")]
    assert hidden, "each lab has hidden tests"
    assert all(c.source.startswith("# Hidden tests") and "\n" not in c.source.strip() for c in hidden), \
        "a hidden test cell holds one comment; its logic lives in autograder/checks, out of the notebook"
    assert "warnings.filterwarnings" in cells[0].source and nbgrader_meta(cells[0]).get("locked")
    for before, cell in zip(cells, cells[1:], strict=False):
        if nbgrader_meta(cell).get("grade") and not nbgrader_meta(cell).get("solution"):
            # nbgrader 0.9.6 can only restore a deleted test cell that follows a solution or test cell.
            assert nbgrader_meta(before).get("grade") or nbgrader_meta(before).get("solution"), cell.source[:60]
    for cell in cells:
        if nbgrader_meta(cell).get("solution") and cell.cell_type == "code":
            assert "### BEGIN SOLUTION" in cell.source, nbgrader_meta(cell)["grade_id"]


@pytest.mark.parametrize("lab", LABS)
def test_written_answers_are_manually_graded_cells_after_their_question(lab):
    """Every lab asks the student to interpret what they measured in at least one written answer: nbgrader's
    manually graded answer, a markdown cell, solution and grade, not a task, with points, holding the model answer
    (the release replaces it whole by nbgrader's text stub). The markdown cell before it asks the question and
    gives its rubric; the written answers come after the lab's last test."""
    nb = nbformat.read(pipeline.SOLUTIONS / lab / f"{lab}.ipynb", as_version=4)
    written = [i for i, c in enumerate(nb.cells) if assemble.is_written(c)]
    assert written, f"{lab} asks no written question"
    for index in written:
        cell, question = nb.cells[index], nb.cells[index - 1]
        meta = nbgrader_meta(cell)
        assert cell.cell_type == "markdown" and meta["points"] > 0 and meta.get("task") is False, meta
        assert "BEGIN SOLUTION" not in cell.source and len(cell.source.split()) > 40, "a model answer, whole"
        assert question.cell_type == "markdown" and not nbgrader_meta(question), "the question comes first"
        assert "**Rubric**" in question.source and "graded by a person" in question.source, question.source[:80]
    tests = [i for i, c in enumerate(nb.cells) if assemble.is_test(c)]
    assert all(index > max(tests) for index in written), "written answers come at the end of the lab"


@pytest.mark.parametrize("lab", LABS)
def test_committed_release_equals_fresh_generation(lab, tmp_path):
    fresh = nbformat.read(pipeline.release(lab, tmp_path), as_version=4)
    committed = nbformat.read(pipeline.LABS / lab / f"{lab}.ipynb", as_version=4)
    assert comparable(committed) == comparable(fresh), f"labs/{lab} is stale: run `python -m autograder release`"
    text = nbformat.writes(committed)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text and "from checks" not in text
    assert all(not c.get("outputs") for c in committed.cells if c.cell_type == "code")
