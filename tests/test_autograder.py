"""The autograder: simulated submissions graded end to end through real nbgrader, plus the lab rules and the
handling of bad input.

The end-to-end tests are slow (each notebook runs in its own kernel): every lab's fixtures are graded in ONE
batch, which is also what shows that a bad submission does not change anyone else's grade. The runtime
attacks (infinite loop, SystemExit, output flood, memory bomb) exercise the kernel's defences, which do not
depend on the lab, so they run in lab 1's batch only; every lab's static attacks are also checked against
the rules without running (fast).
"""

from __future__ import annotations

import csv
import hashlib
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import fixtures, pipeline, policy

LIMITS = pipeline.Limits(cell_timeout=20, memory_bytes=3 << 30, cpu_seconds=300)
RUNTIME_ATTACKS = {"infinite_loop", "raise_system_exit", "stdout_flood", "memory_bomb"}
STATIC_ATTACKS = {"sys_exit", "os_exit", "imports_reference", "monkeypatch_module", "monkeypatch_alias"}
LABS = pipeline.list_labs()


def release_of(lab: str) -> nbformat.NotebookNode:
    """The committed student version (tests/test_labs.py checks it equals a fresh nbgrader generation)."""
    return nbformat.read(pipeline.LABS / lab / f"{lab}.ipynb", as_version=4)


def student(name: str) -> str:
    return name.replace("_", "-")


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_lab_has_fixtures_and_rules_catch_static_attacks():
    assert LABS == sorted(fixtures.LABS), "every lab in solutions/ needs a fixture spec in autograder/fixtures.py"
    for lab in LABS:
        release = release_of(lab)
        by_name = {f.name: f for f in fixtures.fixtures(lab, release)}
        target = fixtures.LABS[lab].target_cell
        for name, fixture in by_name.items():
            if fixture.notebook is None:
                continue
            flagged = {fixtures.grade_id(fixture.notebook.cells[v.cell_index])
                       for v in policy.find_violations(fixture.notebook, release)}
            if name in STATIC_ATTACKS:
                assert flagged == {target}, f"{lab}/{name}: the rules should stop exactly the attacking cell"
            else:
                assert flagged == set(), f"{lab}/{name}: honest code was flagged in {flagged}"


@pytest.mark.parametrize("source, reasons", [
    ("import numpy as np", ["imports 'numpy'"]),
    ("x = __import__('os')", ["uses '__import__'"]),
    ("torch.allclose = None", ["modifies 'torch'"]),
    ("def f():\n    t = torch\n    t.equal = None", ["sets an attribute of something other than 'self'"]),
    ("y = torch.os.getpid()", ["reaches for the attribute 'os'"]),
    ("z = (1).__class__", ["uses the special attribute '__class__'"]),
    ("!ls", ["uses 'get_ipython'"]),
    ("helper = 3", ["rebinds 'helper'"]),
])
def test_rules_name_what_is_forbidden(source, reasons):
    found = policy.check_source(source, protected={"helper"}, module_names={"torch"})
    for reason in reasons:
        assert any(reason in f for f in found), (source, found)


def test_rules_allow_ordinary_code():
    source = ("import math\nfrom collections import deque\n\n\nclass Box:\n    def __init__(self):\n"
              "        self.items = []\n\n\ndef f(helper):\n    counts = [0] * 3\n    counts[1] += 1\n"
              "    return math.sqrt(helper) + torch.zeros(2).sum()\n")
    assert policy.check_source(source, protected={"helper"}, module_names={"torch"}) == []


@pytest.mark.parametrize("name, expected", [
    ("doe_123_456_lab01_sampling.ipynb", "doe"),
    ("Jane Doe_81_assignsubmission_file_", "Jane-Doe-81"),
    ("ana.lima", "ana.lima"),
])
def test_student_ids_from_lms_names(name, expected):
    assert pipeline.student_id(name) == expected


def test_bad_input_gets_a_clear_message_and_writes_nothing(tmp_path):
    corrupt = tmp_path / "class.zip"
    corrupt.write_bytes(b"PK\x03\x04 this is not really a zip")
    out = tmp_path / "out"
    with pytest.raises(pipeline.GradingError, match="zip"):
        pipeline.grade("lab01_sampling", corrupt, out)
    with pytest.raises(pipeline.GradingError, match="does not exist"):
        pipeline.grade("lab01_sampling", tmp_path / "missing", out)
    with pytest.raises(pipeline.GradingError, match="unknown lab"):
        pipeline.grade("lab99_nothing", tmp_path, out)
    (tmp_path / "twice").mkdir()
    for name in ["ana_1.ipynb", "ana_2.ipynb"]:
        (tmp_path / "twice" / name).write_text("{}")
    with pytest.raises(pipeline.GradingError, match="two submissions map to the student id 'ana'"):
        pipeline.grade("lab01_sampling", tmp_path / "twice", out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(pipeline.GradingError, match="no submissions"):
        pipeline.grade("lab01_sampling", tmp_path / "empty", out)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("instructor notes")
    with pytest.raises(pipeline.GradingError, match="not empty"):
        pipeline.grade("lab01_sampling", tmp_path / "twice", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def chosen_fixtures(lab: str) -> list[fixtures.Fixture]:
    every = fixtures.fixtures(lab, release_of(lab))
    if lab == "lab01_sampling":
        return every
    return [f for f in every if f.name not in RUNTIME_ATTACKS]


@pytest.mark.grading
@pytest.mark.parametrize("lab", LABS)
def test_end_to_end_grading_of_simulated_class(lab, tmp_path):
    chosen = chosen_fixtures(lab)
    submissions = tmp_path / "submissions"
    fixtures.write(chosen, submissions)
    before = digest(submissions)
    results = {r.student: r for r in pipeline.grade(lab, submissions, tmp_path / "out", LIMITS)}
    assert digest(submissions) == before, "the submitted files must be left untouched"

    every_test = fixtures.test_ids(lab)
    full = results[student("solution")]
    assert full.status == "graded" and set(full.tests) == every_test
    assert full.score == full.max_score > 0 and all(v > 0 for v in full.tests.values()), full
    for fixture in chosen:
        result = results[student(fixture.name)]
        if fixture.notebook is None or fixture.lost is None:
            assert result.score == 0, (fixture.name, result)
            continue
        lost = {test for test, score in result.tests.items() if score == 0}
        earned_too_much = {t for t, s in result.tests.items() if s > full.tests[t]}
        assert not earned_too_much and set(result.tests) == every_test, (fixture.name, result)
        if fixture.exact:
            assert lost == fixture.lost, f"{fixture.name}: lost {sorted(lost)}, expected {sorted(fixture.lost)}"
        else:
            assert fixture.lost <= lost, f"{fixture.name}: lost {sorted(lost)}, expected at least {fixture.lost}"
    assert results[student("corrupt_file")].status == "unreadable"

    out = tmp_path / "out"
    with open(out / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert set(rows) == set(results) and float(rows[student("solution")]["score"]) == full.max_score
    graded = [name for name, r in results.items() if r.status == "graded"]
    assert all((out / "feedback" / f"{name}.html").exists() for name in graded)
    assert all((out / "autograded" / f"{name}.ipynb").exists() for name in graded)
    if lab == "lab01_sampling":
        assert (out / "autograded" / "stdout-flood.ipynb").stat().st_size < 2_000_000
        notes = " ".join(results[student("imports_reference")].notes)
        assert "specdec_lab" in notes, "the CSV should tell the instructor why a cell was not run"


@pytest.mark.grading
def test_a_kernel_killed_by_a_submission_costs_only_that_submission(tmp_path):
    """With the static rules switched off, os._exit kills its kernel and sys.exit raises inside it; the
    batch still grades everybody else exactly (submitted as an LMS zip of per-student folders)."""
    chosen = {f.name: f for f in fixtures.fixtures("lab01_sampling", release_of("lab01_sampling"))}
    archive = tmp_path / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ["solution", "os_exit", "sys_exit"]:
            folder = f"{name.replace('_', ' ')}_4{len(name)}_assignsubmission_file_"
            handle.writestr(f"{folder}/lab01_sampling.ipynb", nbformat.writes(chosen[name].notebook))
    results = {r.student: r for r in pipeline.grade("lab01_sampling", archive, tmp_path / "out", LIMITS,
                                                    enforce_policy=False)}
    solution, killed, exited = results["solution-48"], results["os-exit-47"], results["sys-exit-48"]
    assert solution.score == solution.max_score > 0
    assert killed.status == "failed" and killed.score == 0
    lost = {test for test, score in exited.tests.items() if score == 0}
    assert lost == chosen["sys_exit"].lost
