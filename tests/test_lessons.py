"""The lessons: every notebook runs top to bottom headless (nbclient, no network), is stored without outputs,
and comes with a valid question bank of at least five questions whose answer key grades as correct."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specdec_lab.widgets.quiz import load_bank, validation_problems

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))
BANKS = sorted((LESSONS_DIR / "quizzes").glob("*.json"))
MIN_QUESTIONS = 6
CELL_TIMEOUT = 300  # seconds per cell: far above any cell's run time, so only a hang reaches it


def test_the_course_has_its_lessons():
    assert len(LESSONS) >= 8
    assert [p.stem[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, len(LESSONS) + 1)]


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_has_a_quiz_bank_it_uses(path):
    bank_path = LESSONS_DIR / "quizzes" / f"{path.stem}.json"
    assert bank_path.is_file(), f"no question bank for {path.name}"
    bank = load_bank(bank_path)
    assert bank.lesson == path.stem
    assert len(bank.questions) >= MIN_QUESTIONS
    sources = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    assert f"quizzes/{path.stem}.json" in sources


@pytest.mark.parametrize("path", BANKS, ids=lambda p: p.stem)
def test_bank_is_valid_and_its_key_is_consistent(path):
    assert validation_problems(json.loads(path.read_text(encoding="utf-8"))) == []
    bank = load_bank(path)
    kinds = {q.kind for q in bank.questions}
    assert len(kinds) >= 2, "mix question kinds (single, multiple, numeric)"
    for question in bank.questions:
        assert question.check(question.key).correct, question.id
        if question.kind == "single":
            wrong = [i for i in range(len(question.options)) if i != question.key]
            assert all(not question.check(i).correct for i in wrong)
        elif question.kind == "multiple":
            assert not question.check(()).correct
            assert not question.check(tuple(range(len(question.options)))).correct or \
                len(question.key) == len(question.options)
        else:
            assert all(not question.check(m.value).correct for m in question.mistakes)
    assert bank.score(bank.answers()) == (len(bank.questions), len(bank.questions))


def execute(path: Path) -> tuple[nbformat.NotebookNode, float]:
    """Run a lesson exactly as `jupyter nbconvert --execute` or papermill would: nbclient, the default kernel, the
    lesson's folder as working directory, this process's environment unchanged (no switch for the course's widgets
    or threads). The per-cell timeout guards against a hang; it is no speed test."""
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                   resources={"metadata": {"path": str(LESSONS_DIR)}}).execute()
    return notebook, time.perf_counter() - started


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_headless(path, record_property):
    notebook, seconds = execute(path)
    record_property("seconds", round(seconds, 1))
    print(f"{path.stem}: executed in {seconds:.1f} s")
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "torch threads:" in text  # the lesson chose its thread count for the machine's load
    fallbacks = "\n".join(o["data"]["text/plain"] for o in outputs
                          if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    # With no front end attached, every widget's display still carries its text, the quiz's included.
    assert "Check yourself" in fallbacks
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures, f"{path.name} shows no plotly figure"
