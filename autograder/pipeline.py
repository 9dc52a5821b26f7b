"""Headless grading of a class in one command, with the trust boundary drawn by a sandbox.

    python -m autograder grade lab01_sampling submissions.zip --out grades/lab01

For each submission, on its own (one failure never touches another student):
  1. assemble (trusted): read the file leniently and rebuild it on the lab's release (assemble.py);
  2. run (untrusted): execute it in a bubblewrap sandbox that sees only the notebook, the runner and the
     lab's probes; after each test cell a probe calls the student's functions on the checker's inputs and
     writes plain data (sandbox/);
  3. judge (trusted): compare that data with the reference solution on the same inputs, outside the sandbox
     (checks/); hidden cases are drawn fresh for every run and student;
  4. record (trusted): scores into nbgrader's gradebook; feedback pages by nbgrader (gradebook.py).

Outputs in `--out`, written all at once at the end (a failed run leaves nothing half-written):

    grades.csv                     one row per student: score, max score, status, notes
    scores.json                    the same with every test cell's score and the checker's message
    autograded/<student>.ipynb     the executed notebook with the checker's verdict under each test cell
    feedback/<student>.html        nbgrader's feedback page
    grading.log                    the run's seed, timings and sandbox logs

A status is "graded" or "needs review" (the file is not a notebook, or the sandbox itself failed); the command
exits non-zero and lists the students who need review.
"""

from __future__ import annotations

import csv
import importlib
import json
import queue
import re
import secrets
import shutil
import sys
import tempfile
import threading
import types
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import torch

from autograder import assemble, gradebook, sandbox
from autograder.checks._common import judge
from autograder.gradebook import LABS, REPO, SOLUTIONS, GradingError, check_lab, list_labs, release  # noqa: F401
from autograder.sandbox import Limits
from specdec_lab import lab_rules

AUTOGRADER = Path(__file__).resolve().parent
# The worker threads share the trusted side's state: the reference namespace, torch's global random generator
# (reference helpers such as a lab's `tiny_llama(seed)` seed it and then draw weights from it) and CPython 3.11's
# ast.parse, which is not safe in concurrent threads. So everything but the sandbox run holds this lock: two
# judges drawing from the global generator at once would build different models than the seeds say.
TRUSTED_LOCK = threading.RLock()


@dataclass
class Submission:
    """One student's notebook: `student` is the id used everywhere in the outputs, `path` the file read."""

    student: str
    path: Path


@dataclass
class StudentResult:
    """The grade of one submission: total and per-test-cell scores, a status, notes, and the checker's message
    for every test cell."""

    student: str
    score: float
    max_score: float
    status: str
    notes: list[str] = field(default_factory=list)
    tests: dict[str, float] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


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
                if info.file_size > assemble.MAX_NOTEBOOK_BYTES:
                    raise GradingError(f"{info.filename} in {source.name} is larger than "
                                       f"{assemble.MAX_NOTEBOOK_BYTES} bytes")
                (target / info.filename).parent.mkdir(parents=True, exist_ok=True)
                (target / info.filename).write_bytes(archive.read(info))
    except (zipfile.BadZipFile, zlib.error) as error:
        raise GradingError(f"{source} is a corrupt zip archive: {error}") from None
    if not target.exists():
        raise GradingError(f"{source} holds no .ipynb files")
    return target


def lab_checks(lab: str) -> dict:
    """grade id -> Check for every test cell of `lab` (autograder/checks/labNN.py)."""
    return importlib.import_module(f"autograder.checks.{lab.split('_')[0]}").CHECKS


def solution_code(lab: str) -> list[str]:
    """The reference: the source notebook's setup cells (locked cells before the first answer) and answers."""
    nb = nbformat.read(SOLUTIONS / lab / f"{lab}.ipynb", as_version=4)
    sources, answered = [], False
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or meta.get("grade") and not meta.get("solution"):
            continue
        if meta.get("solution"):
            answered = True
            sources.append(re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*$", "", cell.source, flags=re.M))
        elif meta.get("locked") and not answered:
            sources.append(cell.source)
    return sources


_references: dict[str, dict] = {}


def reference(lab: str) -> dict:
    """The namespace of `lab`'s reference solution, run here (trusted code) once per process."""
    with TRUSTED_LOCK:
        if lab not in _references:
            module = types.ModuleType(f"specdec_reference_{lab}")
            sys.modules[module.__name__] = module  # dataclasses look their module up there
            namespace = module.__dict__
            grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
            with warnings.catch_warnings():
                for source in solution_code(lab):
                    exec(compile(source, f"<reference {lab}>", "exec"), namespace)  # noqa: S102 - our own solutions
            torch.set_grad_enabled(grad)
            torch.set_num_threads(threads)
            _references[lab] = namespace
        return _references[lab]


def rule_notes(assembled: assemble.Assembled, release_nb: nbformat.NotebookNode) -> list[str]:
    """The lab rules' warnings for the cells the student wrote (guidance only: they cost nothing)."""
    locked = [c.source for c in release_nb.cells if c.cell_type == "code" and assemble.grade_id(c)
              and not assemble.is_answer(c)]
    provided = lab_rules.provided_names(locked)
    lab_cells = {assemble.grade_id(c): c.source for c in release_nb.cells if assemble.grade_id(c)}
    notes = []
    for index, cell in enumerate(assembled.notebook.cells):
        gid = assemble.grade_id(cell)
        if cell.cell_type != "code" or (gid and not assemble.is_answer(cell)) or cell.source == lab_cells.get(gid):
            continue
        for warning in lab_rules.check_cell(cell.source, provided):
            notes.append(f"lab rules (a warning, no points lost): cell {gid or index}, line {warning.line}: "
                         f"{warning.message}")
    return notes


def verdict_output(passed: bool, message: str, points: float) -> nbformat.NotebookNode:
    mark = "passed" if passed else "FAILED"
    return nbformat.v4.new_output("stream", name="stdout",
                                  text=f"[grader] {mark} ({points:g} point{'s' * (points != 1)}): {message}\n")


@dataclass
class Job:
    """Everything one grading run shares across students."""

    lab: str
    release: nbformat.NotebookNode
    points: dict[str, float]
    limits: Limits
    seed: int
    workdir: Path
    slots: queue.Queue


def check_inputs(lab: str, seed: int, student: str) -> dict[str, dict]:
    """The hidden checks' inputs for one student: drawn from the run's seed and the student's id, so a regrade
    with the same seed asks the same questions, and each student gets their own."""
    checks, ref = lab_checks(lab), reference(lab)
    with TRUSTED_LOCK:
        generator = torch.Generator().manual_seed(seed ^ zlib.crc32(student.encode()))
        return {gid: check.inputs(generator, ref) for gid, check in checks.items()}


def judged(check, inputs: dict, answer, ref: dict):
    """`check`'s verdict on one answer, decided under the trusted side's lock (see TRUSTED_LOCK)."""
    with TRUSTED_LOCK:
        return judge(check, inputs, answer, ref)


def grade_one(job: Job, sub: Submission) -> tuple[StudentResult, nbformat.NotebookNode | None]:
    """Assemble, run in the sandbox, judge. Never raises for anything in the submission."""
    result = StudentResult(sub.student, 0.0, sum(job.points.values()), "graded",
                           tests={gid: 0.0 for gid in job.points})
    try:
        cells, read_notes = assemble.read_cells(sub.path)
    except assemble.Unreadable as error:
        result.status = "needs review"
        result.notes.append(f"not graded: {error}")
        return result, None
    assembled = assemble.assemble(job.release, cells)
    with TRUSTED_LOCK:
        result.notes += read_notes + assembled.notes + rule_notes(assembled, job.release)
    checks, ref = lab_checks(job.lab), reference(job.lab)
    inputs = check_inputs(job.lab, job.seed, sub.student)
    probes: dict[int, list[dict]] = {}
    for gid, index in assembled.graded_cells.items():
        probes.setdefault(index, []).append({"grade_id": gid, "lab": job.lab.split("_")[0],
                                             "probe": checks[gid].probe, "inputs": inputs[gid]})
    folder = job.workdir / "sandboxes" / sub.student
    slot = job.slots.get()
    try:
        sandbox.prepare(folder, job.lab, assembled.notebook, probes, job.limits, slot)
        run = sandbox.run(folder, job.limits, slot)
    finally:
        job.slots.put(slot)
    result.seconds = run.seconds
    executed = sandbox.read_json(folder, folder / "executed.ipynb", 50 << 20)
    executed_cells = executed.get("cells") if isinstance(executed, dict) else None
    notebook = assembled.notebook
    if isinstance(executed_cells, list) and len(executed_cells) == len(notebook.cells):
        for cell, ran in zip(notebook.cells, executed_cells, strict=True):
            if cell.cell_type == "code" and isinstance(ran, dict):
                cell.outputs = assemble.clean_outputs(ran.get("outputs"))
    for gid, check in checks.items():
        answer = sandbox.read_json(folder, folder / "io" / f"{gid}.json", 20 << 20)
        verdict = judged(check, inputs[gid], answer, ref)
        result.tests[gid] = job.points[gid] if verdict.passed else 0.0
        result.messages[gid] = verdict.message
        if gid in assembled.graded_cells:
            notebook.cells[assembled.graded_cells[gid]].outputs.append(
                verdict_output(verdict.passed, verdict.message, result.tests[gid]))
    result.score = float(sum(result.tests.values()))
    result.notes += run_notes(run, notebook, job.limits)
    if run.problem:
        result.status = "needs review"
    shutil.rmtree(folder, ignore_errors=True)
    return result, notebook


def run_notes(run: sandbox.Run, notebook: nbformat.NotebookNode, limits: Limits) -> list[str]:
    """What the instructor and the student should know about how the run went, told apart by cause."""
    def name(index) -> str:
        try:
            cell = notebook.cells[int(index)]
        except (TypeError, ValueError, IndexError):
            return f"cell {index}"
        return f"cell '{assemble.grade_id(cell)}'" if assemble.grade_id(cell) else f"cell {index}"

    notes = [f"timeout: {name(i)} ran past the {limits.cell_timeout} s limit per cell and was interrupted"
             for i in run.report.get("timeouts", [])[:20] if isinstance(run.report.get("timeouts"), list)]
    if run.report.get("stopped_at") is not None:
        notes.append(f"crash: the kernel stopped while running {name(run.report['stopped_at'])} "
                     f"({str(run.report.get('reason'))[:100]}); the cells after it did not run")
    for cell in notebook.cells:
        if any(o.get("ename") == "MemoryError" for o in cell.get("outputs", [])):
            notes.append(f"memory: a cell ran out of its {limits.memory_bytes >> 30} GiB memory limit")
            break
    if run.problem:
        notes.append(f"sandbox: {run.problem}")
        notes.append(f"sandbox log: {run.log[-600:]}")
    return notes


def grade(lab: str, source: Path, out: Path, limits: Limits | None = None, force: bool = False,
          seed: int | None = None, workers: int = 2) -> list[StudentResult]:
    """Grade every submission of `lab` found in `source` (folder or zip) and write the results into `out`.

    limits: per-submission limits (default `Limits()`); force: replace an existing `out`; seed: the seed of
    the hidden cases (default: fresh for every run, recorded in grading.log); workers: sandboxes at once.
    """
    check_lab(lab)
    sandbox.available()
    limits = limits or Limits()
    seed = secrets.randbits(31) if seed is None else seed
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise GradingError(f"{out} already exists and is not empty; choose another folder or pass --force")
    with tempfile.TemporaryDirectory(prefix="specdec-grade-") as tmp:
        workdir = Path(tmp)
        submissions = find_submissions(unpack(Path(source), workdir))
        course = gradebook.make_course(workdir, lab)
        release_nb = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
        points = {assemble.grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in release_nb.cells
                  if assemble.is_test(c)}
        missing = set(points) ^ set(lab_checks(lab))
        if missing:
            raise GradingError(f"{lab}: test cells and checks do not match: {sorted(missing)}")
        slots: queue.Queue = queue.Queue()
        for slot in range(workers):
            slots.put(slot)
        job = Job(lab, release_nb, points, limits, seed, workdir, slots)
        reference(lab)  # once, before the threads start
        with ThreadPoolExecutor(max_workers=workers) as pool:
            graded = list(pool.map(lambda sub: safe_grade_one(job, sub), submissions))
        staging = workdir / "staging"
        (staging / "autograded").mkdir(parents=True)
        (staging / "feedback").mkdir()
        gradebook.record(course, lab, [(r.student, r.tests, r.status != "graded") for r, _ in graded])
        for result, notebook in graded:
            if notebook is not None:
                target = course / "autograded" / result.student / lab / f"{lab}.ipynb"
                target.parent.mkdir(parents=True)
                notebook.cells.insert(0, notes_cell(result))
                nbformat.write(notebook, target)
                shutil.copy(target, staging / "autograded" / f"{result.student}.ipynb")
        log = gradebook.generate_feedback(course, lab)
        results = [result for result, _ in graded]
        for result in results:
            feedback = course / "feedback" / result.student / lab / f"{lab}.html"
            if feedback.exists():
                shutil.copy(feedback, staging / "feedback" / f"{result.student}.html")
        write_reports(results, lab, staging)
        (staging / "grading.log").write_text(
            f"seed {seed}\n" + "".join(f"{r.student}: {r.seconds:.1f} s, {r.status}\n" for r in results)
            + "\nnbgrader generate_feedback:\n" + log[-20000:])
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(out))
    return results


def safe_grade_one(job: Job, sub: Submission) -> tuple[StudentResult, nbformat.NotebookNode | None]:
    """grade_one, with any failure of the grader itself confined to this student (marked for review)."""
    try:
        return grade_one(job, sub)
    except Exception as error:  # a grader bug must not cost the rest of the class their grades
        return StudentResult(sub.student, 0.0, sum(job.points.values()), "needs review",
                             [f"the grader failed on this submission: {type(error).__name__}: {error}"],
                             {gid: 0.0 for gid in job.points}), None


def notes_cell(result: StudentResult) -> nbformat.NotebookNode:
    """A markdown cell at the top of the graded notebook with the grader's notes for the student."""
    lines = [f"**Grader notes** (score {result.score:g} / {result.max_score:g}, {result.status})"]
    lines += [f"- {note}" for note in result.notes] or ["- nothing to report"]
    return nbformat.v4.new_markdown_cell("\n".join(lines))


def write_reports(results: list[StudentResult], lab: str, staging: Path) -> None:
    with open(staging / "grades.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "lab", "score", "max_score", "status", "notes"])
        for r in results:
            writer.writerow([r.student, lab, f"{r.score:g}", f"{r.max_score:g}", r.status, " | ".join(r.notes)])
    (staging / "scores.json").write_text(json.dumps([asdict(r) for r in results], indent=1))

