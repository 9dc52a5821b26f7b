"""Headless grading with nbgrader: release the labs, then grade a class's submissions in one command.

    python -m autograder grade lab01_sampling submissions.zip --out grades/lab01

`grade` builds a throw-away nbgrader course under a temporary folder (config from nbgrader_config.py, the
source notebook from solutions/), copies the submissions in (the originals are only read), checks them
against the lab rules (policy.py), autogrades them all in one nbgrader run (each notebook in its own
resource-limited kernel, see kernel_startup.py), generates the HTML feedback, and writes into `--out`:

    grades.csv                     one row per student: score, max score, status, notes
    scores.json                    the same with the score of every test cell
    autograded/<student>.ipynb     the executed notebook
    feedback/<student>.html        nbgrader's feedback page

Everything is written to a staging folder first and moved into place at the end: a failed run leaves
nothing half-written. The hidden checks (autograder/checks/) are on the grading kernel's path only.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat

from autograder import policy

AUTOGRADER = Path(__file__).resolve().parent
REPO = AUTOGRADER.parent
SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"
MAX_NOTEBOOK_BYTES = 20 << 20


class GradingError(Exception):
    """Bad input or a failed nbgrader step, with a message meant for the instructor."""


@dataclass
class Limits:
    """Per-submission limits: seconds per cell, bytes of address space, CPU seconds per notebook, output chars."""

    cell_timeout: int = 60
    memory_bytes: int = 6 << 30
    cpu_seconds: int = 900
    output_chars: int = 1_000_000


@dataclass
class Submission:
    """One student's notebook: `student` is the id used everywhere in the outputs, `path` the file read."""

    student: str
    path: Path


@dataclass
class StudentResult:
    """The grade of one submission: total and per-test-cell scores, a status and notes for the instructor."""

    student: str
    score: float
    max_score: float
    status: str
    notes: list[str] = field(default_factory=list)
    tests: dict[str, float] = field(default_factory=dict)


def list_labs() -> list[str]:
    """The lab ids (folder names in solutions/), in order."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and re.fullmatch(r"lab\d\d_\w+", p.name))


def check_lab(lab: str) -> None:
    if lab not in list_labs():
        raise GradingError(f"unknown lab {lab!r}; the labs are: {', '.join(list_labs())}")


def kernel_environment(workdir: Path, limits: Limits) -> dict[str, str]:
    """Environment for nbgrader and its kernels: startup file, checks on the path, limits, one thread."""
    startup = workdir / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    shutil.copy(AUTOGRADER / "kernel_startup.py", startup / "00-specdec-grading.py")
    env = dict(os.environ)
    env.update({
        "IPYTHONDIR": str(workdir / "ipython"),
        "PYTHONPATH": os.pathsep.join([str(AUTOGRADER), str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p]),
        "SPECDEC_GRADER_MEMORY_BYTES": str(limits.memory_bytes),
        "SPECDEC_GRADER_CPU_SECONDS": str(limits.cpu_seconds),
        "SPECDEC_GRADER_OUTPUT_CHARS": str(limits.output_chars),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTHONWARNINGS": "ignore",
        "TQDM_DISABLE": "1",
        # nbgrader runs `alembic` (installed next to the interpreter) to check its database schema.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    })
    return env


def make_course(workdir: Path, lab: str, limits: Limits) -> Path:
    """An nbgrader course folder under `workdir` with `lab` generated (database and release)."""
    course = workdir / "course"
    (course / "source" / lab).mkdir(parents=True)
    shutil.copy(SOLUTIONS / lab / f"{lab}.ipynb", course / "source" / lab / f"{lab}.ipynb")
    config = (AUTOGRADER / "nbgrader_config.py").read_text()
    config += f"\nc.CourseDirectory.root = {str(course)!r}\nc.Execute.timeout = {limits.cell_timeout}\n"
    (course / "nbgrader_config.py").write_text(config)
    run_nbgrader(course, ["generate_assignment", lab, "--force"], kernel_environment(workdir, limits), check=True)
    return course


def run_nbgrader(course: Path, args: list[str], env: dict[str, str], check: bool) -> subprocess.CompletedProcess:
    """Run one nbgrader command in `course`; with `check`, a failure raises GradingError with nbgrader's log."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True)
    if check and done.returncode != 0:
        raise GradingError(f"nbgrader {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done


def release(lab: str, dest: Path) -> Path:
    """Generate the student version of `lab` with nbgrader into `dest`/<lab>.ipynb; returns that path."""
    check_lab(lab)
    with tempfile.TemporaryDirectory(prefix="specdec-release-") as tmp:
        course = make_course(Path(tmp), lab, Limits())
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / f"{lab}.ipynb"
        shutil.copy(course / "release" / lab / f"{lab}.ipynb", target)
    return target


def student_id(name: str) -> str:
    """A safe student id from an LMS file or folder name ("doe_jane_123_lab01.ipynb" -> "doe")."""
    name = name.split("_assignsubmission")[0]  # Moodle folders: "<name>_<id>_assignsubmission_file_"
    name = re.sub(r"\.ipynb$", "", name).split("_")[0] if name.endswith(".ipynb") else name
    safe = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-.")
    if not safe:
        raise GradingError(f"cannot derive a student id from {name!r}")
    return safe


def find_submissions(folder: Path) -> list[Submission]:
    """Submissions in `folder`: one sub-folder per student holding one notebook, or flat files named
    "<student>_<anything>.ipynb" (the LMS download styles)."""
    submissions = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "__MACOSX")):
            continue
        if entry.is_dir():
            notebooks = sorted(p for p in entry.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            if len(notebooks) != 1:
                raise GradingError(f"{entry.name}/ should hold exactly one notebook, found {len(notebooks)}")
            submissions.append(Submission(student_id(entry.name), notebooks[0]))
        elif entry.suffix == ".ipynb":
            submissions.append(Submission(student_id(entry.name), entry))
    if not submissions:
        raise GradingError(f"no submissions (.ipynb files or per-student folders) found in {folder}")
    seen: dict[str, Path] = {}
    for sub in submissions:
        if sub.student in seen:
            raise GradingError(f"two submissions map to the student id {sub.student!r}: {seen[sub.student]} "
                               f"and {sub.path}; rename one")
        seen[sub.student] = sub.path
    return submissions


def unpack(source: Path, workdir: Path) -> Path:
    """The folder of submissions: `source` itself, or an LMS zip safely extracted under `workdir`."""
    if source.is_dir():
        return source
    if not source.is_file():
        raise GradingError(f"{source} does not exist: give a folder of submissions or a .zip of them")
    if not zipfile.is_zipfile(source):
        raise GradingError(f"{source} is neither a folder nor a valid zip archive")
    target = workdir / "unzipped"
    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                unsafe = ".." in Path(info.filename).parts or info.filename.startswith("/")
                if info.is_dir() or unsafe or not info.filename.endswith(".ipynb"):
                    continue  # only notebooks, and never outside the extraction folder
                if info.file_size > MAX_NOTEBOOK_BYTES:
                    raise GradingError(f"{info.filename} in {source.name} is larger than {MAX_NOTEBOOK_BYTES} bytes")
                (target / info.filename).parent.mkdir(parents=True, exist_ok=True)
                (target / info.filename).write_bytes(archive.read(info))
    except (zipfile.BadZipFile, zlib.error) as error:
        raise GradingError(f"{source} is a corrupt zip archive: {error}") from None
    if not target.exists():
        raise GradingError(f"{source} holds no .ipynb files")
    return target


def read_notebook(path: Path) -> tuple[nbformat.NotebookNode | None, str]:
    """The notebook at `path`, or None and the reason it cannot be graded."""
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return None, f"the file is larger than {MAX_NOTEBOOK_BYTES} bytes"
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as error:  # nbformat raises several types for unreadable JSON and invalid notebooks
        return None, f"not a valid notebook ({type(error).__name__}: {str(error)[:200]})"
    return nb, ""


def prepare(course: Path, lab: str, submissions: list[Submission], enforce_policy: bool) -> dict[str, StudentResult]:
    """Copy readable submissions into the course (rule-breaking cells neutralised); results for the others."""
    release_nb = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
    early: dict[str, StudentResult] = {}
    for sub in submissions:
        nb, problem = read_notebook(sub.path)
        if nb is None:
            early[sub.student] = StudentResult(sub.student, 0.0, 0.0, "unreadable", [problem])
            continue
        notes = []
        if enforce_policy:
            violations = policy.find_violations(nb, release_nb)
            policy.neutralise(nb, violations)
            notes = [f"cell {v.cell_index} not run: {v.reason}" for v in violations]
        target = course / "submitted" / sub.student / lab / f"{lab}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
        if notes:
            early[sub.student] = StudentResult(sub.student, 0.0, 0.0, "graded", notes)
    return early


def collect(course: Path, lab: str, submissions: list[Submission], early: dict[str, StudentResult],
            staging: Path) -> list[StudentResult]:
    """Read the gradebook and copy the autograded notebooks and feedback of every student into `staging`."""
    from nbgrader.api import Gradebook, MissingEntry

    results = []
    (staging / "autograded").mkdir(parents=True)
    (staging / "feedback").mkdir()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        max_score = gradebook.find_assignment(lab).max_score
        for sub in submissions:
            result = early.get(sub.student) or StudentResult(sub.student, 0.0, max_score, "graded")
            result.max_score = max_score
            graded = course / "autograded" / sub.student / lab / f"{lab}.ipynb"
            if result.status == "unreadable":
                results.append(result)
                continue
            if not graded.exists():
                result.status = "failed"
                result.notes.append("the notebook could not be run to the end (its kernel died or stopped "
                                    "responding); it scores 0, see the grading log")
                results.append(result)
                continue
            try:
                notebook = gradebook.find_submission_notebook(lab, lab, sub.student)
            except MissingEntry:
                result.status = "failed"
                result.notes.append("nbgrader recorded no grades for this notebook")
                results.append(result)
                continue
            result.tests = {grade.name: float(grade.score) for grade in notebook.grades}
            result.score = float(sum(result.tests.values()))
            shutil.copy(graded, staging / "autograded" / f"{sub.student}.ipynb")
            feedback = course / "feedback" / sub.student / lab / f"{lab}.html"
            if feedback.exists():
                shutil.copy(feedback, staging / "feedback" / f"{sub.student}.html")
            results.append(result)
    return results


def write_reports(results: list[StudentResult], lab: str, staging: Path) -> None:
    with open(staging / "grades.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "lab", "score", "max_score", "status", "notes"])
        for r in results:
            writer.writerow([r.student, lab, f"{r.score:g}", f"{r.max_score:g}", r.status, " | ".join(r.notes)])
    (staging / "scores.json").write_text(json.dumps([asdict(r) for r in results], indent=1))


def grade(lab: str, source: Path, out: Path, limits: Limits | None = None, enforce_policy: bool = True,
          force: bool = False) -> list[StudentResult]:
    """Grade every submission of `lab` found in `source` (folder or zip) and write the results into `out`.

    limits: per-submission limits (default `Limits()`); enforce_policy: check the lab rules before running
    (turned off only by tests that exercise the kernel's own defences); force: replace an existing `out`.
    """
    check_lab(lab)
    limits = limits or Limits()
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise GradingError(f"{out} already exists and is not empty; choose another folder or pass --force")
    with tempfile.TemporaryDirectory(prefix="specdec-grade-") as tmp:
        workdir = Path(tmp)
        submissions = find_submissions(unpack(Path(source), workdir))
        course = make_course(workdir, lab, limits)
        early = prepare(course, lab, submissions, enforce_policy)
        env = kernel_environment(workdir, limits)
        done = run_nbgrader(course, ["autograde", lab], env, check=False)
        (workdir / "autograde.log").write_text(done.stderr)
        run_nbgrader(course, ["generate_feedback", lab, "--force"], env, check=False)
        staging = workdir / "staging"
        results = collect(course, lab, submissions, early, staging)
        write_reports(results, lab, staging)
        shutil.copy(workdir / "autograde.log", staging / "autograde.log")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(out))
    return results
