"""Headless grading of a class in one command, with the trust boundary drawn by a sandbox.

    python -m autograder grade lab01_sampling submissions.zip --out grades/lab01

For each submission, on its own (one failure never touches another student):
  1. assemble (trusted): read the file leniently and rebuild it on the lab's release (assemble.py);
  2. run (untrusted): a host process in a bubblewrap sandbox (sandbox/) runs the cells, then answers one call
     per test cell over framed pipes: the inputs drawn for that call arrive only then (never an expected
     value), a probe calls the student's function in a forked child, and its plain answer goes back;
  3. judge (trusted): compare that answer with the reference solution on the same inputs, outside the sandbox
     (checks/), with forward counts and training results measured here; hidden cases are drawn fresh for every
     run and student (autograder/README.md: the trust boundary);
  4. record (trusted): scores into nbgrader's gradebook; feedback pages by nbgrader (gradebook.py).

Intake never stops a class (student_id, find_submissions, unpack): every file or folder name maps to a stable,
filesystem-safe id (Moodle "Jane Doe_12345_assignsubmission_file_" -> "Jane-Doe-12345", Canvas
"doe_jane_12345_67890_lab01.ipynb" -> "doe-jane-12345", other files "<student>_<anything>.ipynb" -> "<student>";
Unicode letters kept after NFKC normalisation, anything else "-", a name with no letters "student-<hash>", ids
that would clash get a hash appended). Several uploads of one student: the latest (modification time; a zip's
entry dates are kept) is graded. A student folder of several notebooks: the one named for the lab, else the
latest; Jupyter's "-Copy1" and "Untitled" only when nothing else is there. Hidden files are never graded and are
listed; __MACOSX, .ipynb_checkpoints, .DS_Store and "._x" are ignored. Each of these is a note on the student's
row; a student with nothing gradable gets a row "needs review". Only the instructor's own mistakes stop a run:
an unknown lab, a source that is missing or neither a folder nor a zip, a non-empty --out without --force.

Each student's result is journaled the moment it is graded (journal_folder: ".<out>.grading" beside --out), so
a crash or kill loses no student already graded and `--resume` grades only the rest; the notebooks wait on disk,
not in memory. The outputs in `--out` are placed at the end, by one rename (a failed run leaves nothing
half-written there):

    grades.csv                     one row per student: score, max score, status, notes
    scores.json                    the same with every test cell's score and the checker's message
    autograded/<student>.ipynb     the executed notebook with the checker's verdict under each test cell
    feedback/<student>.html        nbgrader's feedback page
    grading.log                    the run's seed, timings and sandbox logs

A status is "graded" or "needs review" (the file is not a notebook, or the sandbox itself failed); the command
exits non-zero and lists the students who need review.

Written answers (nbgrader's manually graded answer cells, `assemble.is_written`) are graded by a person, never
here: score and max_score are the autograded part, and each written answer is reported apart (`manual`): awaiting
manual grading when the student wrote one, or 0 points when it is left as released ("no answer", nbgrader's own
rule). The gradebook marks the ones awaiting a person as needing manual grading, the feedback page says so for
each of them, grades.csv gives the points still to be graded (manual_pending, of manual_max), and the command
lists those students apart from the ones who need review.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import importlib
import json
import os
import queue
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import types
import unicodedata
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
from autograder.sandbox import Limits, cgroups
from autograder.sandbox.session import ModelServer, NotebookRun, Session
from specdec_lab import lab_rules

AUTOGRADER = Path(__file__).resolve().parent
# The worker threads share the trusted side's state: the reference namespace, torch's global random generator
# (reference helpers such as a lab's `tiny_llama(seed)` seed it and then draw weights from it) and CPython 3.11's
# ast.parse, which is not safe in concurrent threads. So everything but the sandbox run holds this lock: two
# judges drawing from the global generator at once would build different models than the seeds say.
TRUSTED_LOCK = threading.RLock()


# Intake (student_id, find_submissions, unpack): what an LMS download, an OS or Jupyter puts beside the work.
JUNK_NAMES = {"__MACOSX", ".ipynb_checkpoints", ".DS_Store", "Thumbs.db", "desktop.ini"}  # ignored, unnoted
JUPYTER_COPY = re.compile(r"(-Copy\d*|-checkpoint)$|^(Untitled\d*|Copy of .*)$", re.IGNORECASE)
DUPLICATE = re.compile(r"\s*\(\d+\)\s*$")  # "name (1)": a browser's or an LMS's second copy of the same file
HIDDEN = "hidden (its name starts with '.'), not graded"
NOT_A_NOTEBOOK = "not a notebook (.ipynb), not graded"
MAX_ID_CHARS = 64
MAX_LISTED = 10  # file names quoted in one note
# A zip member larger than this is not extracted (a zip bomb must not fill the disk); it is well above
# assemble's own limit, which decides, with a note, what a notebook with large saved outputs gets.
MAX_EXTRACTED_BYTES = max(256 << 20, assemble.MAX_NOTEBOOK_BYTES)


@dataclass
class Submission:
    """One student's entry in the class: `student` is the id used everywhere in the outputs, `path` the notebook
    to grade (None when the student left nothing gradable: the row then needs review), `notes` what intake found
    (other uploads, extra notebooks, hidden or unreadable files), put first on the student's row."""

    student: str
    path: Path | None
    notes: list[str] = field(default_factory=list)


@dataclass
class StudentResult:
    """The grade of one submission: total and per-test-cell scores (the autograded part), a status, notes, and
    the checker's message for every test cell. `manual`: each written answer's score, None while it awaits
    manual grading (0.0: no answer); `manual_points`: what each written answer is worth."""

    student: str
    score: float
    max_score: float
    status: str
    notes: list[str] = field(default_factory=list)
    tests: dict[str, float] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    manual: dict[str, float | None] = field(default_factory=dict)
    manual_points: dict[str, float] = field(default_factory=dict)

    def awaiting(self) -> list[str]:
        """The written answers a person still has to grade."""
        return [gid for gid, score in self.manual.items() if score is None]

    def pending_points(self) -> float:
        """What the written answers awaiting a person are worth (not counted in `score` nor in `max_score`)."""
        return float(sum(self.manual_points.get(gid, 0.0) for gid in self.awaiting()))


def manual_scores(notebook: nbformat.NotebookNode, release_nb: nbformat.NotebookNode) -> dict[str, float | None]:
    """Each written answer of the assembled `notebook`: None (awaits manual grading) when the student wrote
    something, 0.0 when the cell is as the release has it (nbgrader gives an unchanged answer 0 by itself)."""
    released = {assemble.grade_id(c): c.source.strip() for c in release_nb.cells if assemble.is_written(c)}
    written = {assemble.grade_id(c): c.source.strip() for c in notebook.cells if assemble.is_written(c)}
    return {gid: None if written.get(gid, stub) not in ("", stub) else 0.0 for gid, stub in released.items()}


def manual_note(result: StudentResult) -> str | None:
    """The note that says what of the written answers is left to a person, or None when the lab has none."""
    if not result.manual:
        return None
    waiting = result.awaiting()
    if not waiting:
        return (f"written answers: none given ({', '.join(result.manual)}), 0 of "
                f"{sum(result.manual_points.values()):g} points")
    return (f"needs manual grading: the written answers {', '.join(waiting)} ({result.pending_points():g} points) "
            "are graded by a person; the score above is the autograded part")


def is_junk(name: str) -> bool:
    """Whether a file or folder name is litter of the OS, the LMS or Jupyter (never a student's work)."""
    return name in JUNK_NAMES or name.startswith("._")  # "._x": macOS's metadata twin of x


def is_notebook(name: str) -> bool:
    return name.lower().endswith(".ipynb")


def short_hash(text: str) -> str:
    """Eight hex digits that stand for `text` (surrogatepass: undecodable bytes in a file name still hash)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def student_key(name: str, is_file: bool | None = None) -> str:
    """The part of an LMS file or folder name that names the student, Unicode-normalised (NFKC, so a name
    written decomposed, as macOS does, is the same name); "" when the name has none.

    Moodle: "<full name>_<participant id>_assignsubmission_<plugin>_[<file>]" -> "<full name>_<participant id>";
    Canvas: "<name>[_LATE]_<user id>_<submission id>_<file>" -> "<name>_<user id>"; any other file:
    "<student>_<anything>" -> "<student>"; any other folder: its whole name. A leading "." (hidden) and a
    trailing " (1)" (a second copy) are dropped, so such files land on the student they belong to.
    is_file: whether `name` is a file's (None: guess, a file when it ends in ".ipynb").
    """
    name = unicodedata.normalize("NFKC", name).strip().lstrip(".").strip()
    if is_file is None:
        is_file = is_notebook(name)
    if "_assignsubmission_" in name:
        return name.split("_assignsubmission_")[0]
    if not is_file:
        return DUPLICATE.sub("", name)
    fields = (name.rsplit(".", 1)[0] if "." in name else name).split("_")
    for i in range(1, len(fields) - 1):
        if fields[i].isdigit() and fields[i + 1].isdigit():  # Canvas's user id, then its submission id
            names = [f for f in fields[:i] if f.upper() != "LATE"] or fields[:i]
            return "_".join([*names, fields[i]])
    return DUPLICATE.sub("", fields[0])


def safe_id(key: str) -> str:
    """`key` as a file name that is safe everywhere the id is used (outputs, nbgrader's folders, its database):
    letters, digits and combining marks of any script, "." and "-"; any other run of characters becomes one "-".
    Nothing left: "student-<hash of key>"; longer than MAX_ID_CHARS: cut, ending in the hash, so distinct keys
    stay distinct."""
    kept = "".join(c if c.isalnum() or c in ".-" or unicodedata.category(c).startswith("M") else "\0" for c in key)
    safe = re.sub("\0+", "-", kept).strip("-.")
    if not safe:
        return f"student-{short_hash(key)}"
    if len(safe) > MAX_ID_CHARS:
        return f"{safe[:MAX_ID_CHARS - 9].rstrip('-.')}-{short_hash(key)}"
    return safe


def student_id(name: str, is_file: bool | None = None) -> str:
    """The student id for an LMS file or folder name, stable and never an exception (see student_key, safe_id):
    "doe_jane_12345_67890_lab01.ipynb" -> "doe-jane-12345", "Jane Doe_81_assignsubmission_file_" ->
    "Jane-Doe-81", "李华_lab01_sampling.ipynb" -> "李华". A name with no student part is named by itself."""
    key = student_key(name, is_file)
    return safe_id(key or unicodedata.normalize("NFKC", name).rsplit(".", 1)[0])


@dataclass
class Found:
    """What intake found for one student: one candidate notebook per entry (file or folder), and notes."""

    uploads: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # why -> relative paths

    def ignore(self, why: str, rel: str) -> None:
        self.ignored.setdefault(why, []).append(rel)


def shown(names) -> str:
    """File names quoted for a note (repr: control characters and undecodable bytes show escaped), at most
    MAX_LISTED of them."""
    names = [name if isinstance(name, str) else str(name) for name in names]
    quoted = ", ".join(repr(name[:120]) for name in names[:MAX_LISTED])
    return quoted + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # a broken link in an instructor's folder
        return 0.0


def stamp(path: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(modified(path)))


def copy_number(name: str) -> int:
    """n for "name (n).ipynb", 0 otherwise: of two copies dated alike, the one the browser or LMS made later."""
    match = re.search(r"\((\d+)\)\s*$", name.rsplit(".", 1)[0])
    return int(match.group(1)) if match else 0


def lab_match(name: str, lab: str | None) -> int:
    """How surely a notebook's file name says it is `lab`'s: 3 the lab's own name (after a student prefix), 2 it
    contains it, 1 it names the lab's number ("lab01", "Lab 1"), 0 anything else, -1 a Jupyter copy, checkpoint
    or Untitled notebook (graded only when nothing else is there)."""
    stem = DUPLICATE.sub("", unicodedata.normalize("NFKC", name).rsplit(".", 1)[0]).strip()
    if JUPYTER_COPY.search(stem):
        return -1
    if not lab:
        return 0
    words = re.sub(r"[\W_]+", "_", stem.casefold()).strip("_")
    if words == lab or words.endswith(f"_{lab}"):
        return 3
    if lab in words:
        return 2
    number = re.match(r"lab(\d+)", lab)
    return int(bool(number and re.search(rf"lab_?0*{int(number.group(1))}(?!\d)", words)))


def pick_in_folder(entry: Path, root: Path, lab: str | None, skipped: dict[str, str], found: Found) -> Path | None:
    """The notebook of one student's folder (the lab's by name, else the latest; see lab_match), with notes on
    the rest: other notebooks, hidden entries, files that are not notebooks, an empty folder."""
    notebooks: list[Path] = []
    files = 0
    for dirpath, dirnames, filenames in os.walk(entry):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if is_junk(name) or name.startswith("."):
                dirnames.remove(name)  # never walked into: nothing hidden is graded
                if not is_junk(name):
                    found.ignore(HIDDEN, (here / name).relative_to(root).as_posix())
        dirnames.sort()
        for name in sorted(filenames):
            rel = (here / name).relative_to(root).as_posix()
            files += not is_junk(name)
            if is_junk(name):
                continue
            if name.startswith("."):
                found.ignore(HIDDEN, rel)
            elif is_notebook(name):
                notebooks.append(here / name)
            else:
                found.ignore(NOT_A_NOTEBOOK, rel)
    folder = entry.relative_to(root).as_posix()
    if not notebooks:
        empty = not files and not any(rel.startswith(f"{folder}/") for rel in skipped)
        found.notes.append(f"the folder {shown([folder])} holds no notebook{' (it is empty)' * empty}")
        return None
    rank = {path: (lab_match(path.name, lab), modified(path), copy_number(path.name)) for path in notebooks}
    best = max(notebooks, key=lambda path: (rank[path], path.name))
    if len(notebooks) > 1:
        tier = rank[best][0]
        why = ("named for the lab" if tier > 0 else "the most recently modified") + (
            ", the latest of those" if tier > 0 and sum(r[0] == tier for r in rank.values()) > 1 else "")
        others = [p.relative_to(root).as_posix() for p in notebooks if p != best]
        found.notes.append(f"the folder {shown([folder])} holds {len(notebooks)} notebooks: graded "
                           f"{shown([best.relative_to(root).as_posix()])} ({why}); not graded: {shown(others)}")
    return best


def unwrap(folder: Path, lab: str | None) -> Path:
    """The class inside a lone wrapper folder (a zip made by compressing the folder of submissions), else
    `folder`. A lone folder is a wrapper when it holds several sub-folders, a Moodle folder, or flat notebooks of
    several students none of which looks like a student's own copy of the lab."""
    for _ in range(3):
        entries = [e for e in folder.iterdir() if not is_junk(e.name)]
        if len(entries) != 1 or not entries[0].is_dir() or "_assignsubmission_" in entries[0].name:
            return folder
        inner = [e for e in entries[0].iterdir() if not is_junk(e.name) and not e.name.startswith(".")]
        dirs = [e for e in inner if e.is_dir()]
        flat = [e.name for e in inner if not e.is_dir() and is_notebook(e.name)]
        students = {student_key(name, True) for name in flat}
        # a student's own folder holds the lab's notebook under the lab's name, or Jupyter's copies of it
        own = any(lab_match(name, lab) < 0 or lab_match(name, lab) == 3 and bool(lab)
                  and lab.startswith(student_key(name, True).casefold()) for name in flat)
        moodle = any("_assignsubmission_" in d.name for d in dirs)
        if not (len(dirs) >= 2 or moodle or len(students) >= 2 and not own):
            return folder
        folder = entries[0]
    return folder


def unique_ids(keys: list[str], found: dict[str, Found]) -> dict[str, str]:
    """key -> id; keys whose ids would clash (also when they differ only in case, which some filesystems ignore)
    get a hash of their key appended, and a note saying so."""
    clash: dict[str, list[str]] = {}
    for key in keys:
        clash.setdefault(safe_id(key).casefold(), []).append(key)
    ids = {}
    for key in keys:
        ids[key] = safe_id(key)
        if len(clash[ids[key].casefold()]) > 1:
            found[key].notes.append(f"the names {shown(clash[ids[key].casefold()])} would all get the id "
                                    f"{ids[key]!r}; each got a hash of its name appended")
            ids[key] = f"{ids[key]}-{short_hash(key)}"
    return ids


def submission(student: str, root: Path, found: Found) -> Submission:
    """The Submission of one student: the latest of their uploads, with notes on everything else found."""
    notes = list(found.notes)
    notes += [f"{why}: {shown(rels)}" for why, rels in found.ignored.items()]
    if not found.uploads:
        return Submission(student, None, [*notes, "needs review: no notebook to grade was found for this student"])
    best = max(found.uploads, key=lambda path: (modified(path), copy_number(path.name), path.name))
    if len(found.uploads) > 1:
        others = [p for p in found.uploads if p != best]
        ignored = ", ".join(f"{shown([p.relative_to(root).as_posix()])} ({stamp(p)})" for p in others[:MAX_LISTED])
        ignored += f" and {len(others) - MAX_LISTED} more" if len(others) > MAX_LISTED else ""
        notes.insert(0, f"{len(found.uploads)} uploads for this student: graded "
                        f"{shown([best.relative_to(root).as_posix()])} (the latest, modified {stamp(best)}); "
                        f"ignored: {ignored}")
    return Submission(student, best, notes)


def find_submissions(folder: Path, lab: str | None = None, skipped: dict[str, str] | None = None
                     ) -> list[Submission]:
    """One Submission per student found in `folder`, sorted by id: sub-folders per student (Moodle's layout,
    notebooks at any depth inside), flat files "<student>_<anything>.ipynb" (Canvas, Moodle without folders), or
    both; all of them inside one wrapper folder too. Raises GradingError only when `folder` holds nothing at all.

    lab: the lab id, to pick a folder's notebook by name (None: the latest); skipped: relative path -> why, for
    entries of a zip that unpack did not extract (each becomes a note on its student's row).
    Whatever students uploaded becomes a note, never an exception: several uploads grade the latest, a folder of
    several notebooks grades the lab's, hidden files and folders are listed, and a student with nothing
    gradable gets a row with no notebook (path None), which `grade` marks "needs review".
    """
    root, folder = folder, unwrap(folder, lab)
    prefix = "" if folder == root else f"{folder.relative_to(root).as_posix()}/"
    found: dict[str, Found] = {}

    def student(name: str, is_file: bool) -> Found:
        key = student_key(name, is_file) or unicodedata.normalize("NFKC", name).rsplit(".", 1)[0]
        return found.setdefault(key, Found())

    for entry in sorted(folder.iterdir()):
        if is_junk(entry.name):
            continue
        rel = entry.relative_to(root).as_posix()
        into = student(entry.name, not entry.is_dir())
        if entry.name.startswith("."):
            into.ignore(HIDDEN, rel)
        elif entry.is_dir():
            chosen = pick_in_folder(entry, root, lab, skipped or {}, into)
            into.uploads += [chosen] if chosen else []
        elif is_notebook(entry.name):
            into.uploads.append(entry)
        else:
            into.ignore(NOT_A_NOTEBOOK, rel)
    for rel, why in sorted((skipped or {}).items()):
        parts = rel.removeprefix(prefix).split("/")
        if not is_junk(parts[0]):
            student(parts[0], len(parts) == 1).ignore(why, rel)
    if not found:
        raise GradingError(f"no submissions (notebooks, files or per-student folders) found in {root}")
    ids = unique_ids(list(found), found)
    return sorted((submission(ids[key], root, into) for key, into in found.items()), key=lambda s: s.student)


def zip_parts(filename: str) -> list[str]:
    """The path of a zip entry as safe parts: no absolute path, no "..", no part too long for a filesystem."""
    parts = [p for p in filename.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return [p if len(p.encode("utf-8", "surrogatepass")) <= 200 else
            f"{p[:40]}-{short_hash(p)}{'.ipynb' if is_notebook(p) else ''}" for p in parts]


def free_path(path: Path) -> Path:
    """`path`, or "name (2).ipynb" ... when a zip holds the same name twice (both are kept; see copy_number)."""
    number = 1
    while path.exists() or path.is_symlink():
        number += 1
        path = path.with_name(f"{path.name.rsplit('.', 1)[0]} ({number}).{path.name.rsplit('.', 1)[1]}")
    return path


def copy_capped(source, handle, limit: int) -> None:
    """Copy a zip member, refusing it past `limit` bytes whatever its header claims."""
    copied = 0
    while chunk := source.read(1 << 20):
        copied += len(chunk)
        if copied > limit:
            raise ValueError(f"larger than {limit >> 20} MB")
        handle.write(chunk)


def extract_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, skipped: dict[str, str]) -> None:
    """Extract one notebook (or folder) of the zip under `target`, dated as in the zip; anything else, and any
    entry that cannot be extracted, goes into `skipped` with the reason."""
    parts = zip_parts(info.filename)
    if not parts or any(is_junk(part) for part in parts):
        return
    rel, path = "/".join(parts), target.joinpath(*parts)
    if not info.is_dir() and not is_notebook(parts[-1]):
        skipped[rel] = NOT_A_NOTEBOOK
        return
    if info.file_size > MAX_EXTRACTED_BYTES:
        skipped[rel] = f"larger than {MAX_EXTRACTED_BYTES >> 20} MB, not extracted"
        return
    created = False
    try:
        if info.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path = free_path(path)
        with open(path, "xb") as handle:
            created = True
            with archive.open(info) as source:
                copy_capped(source, handle, MAX_EXTRACTED_BYTES)
    except (zipfile.BadZipFile, zlib.error, RuntimeError, NotImplementedError, EOFError, ValueError,
            OSError) as error:  # this entry only: a bad CRC, encryption, an odd method, a clashing path
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise GradingError(f"the disk filled up while extracting the zip into {target}") from None
        if created:
            path.unlink(missing_ok=True)
        skipped[rel] = f"could not be extracted ({type(error).__name__}: {str(error)[:100]})"
        return
    try:
        when = time.mktime((*info.date_time, 0, 0, -1))  # the zip's dates are local time, like the LMS's
        os.utime(path, (when, when))
    except (OverflowError, ValueError, OSError):
        pass  # a nonsense date: the file keeps its extraction time, so the zip's order decides


def unpack(source: Path, workdir: Path) -> tuple[Path, dict[str, str]]:
    """The folder of submissions, and the zip entries that were not extracted (relative path -> why).

    source: a folder (returned as it is) or an LMS zip, extracted under `workdir`: notebooks (up to
    MAX_EXTRACTED_BYTES each, every one dated as its zip entry, so that "the latest upload" means what it did in
    the LMS) and folders; other files only have their names listed, as notes. Raises GradingError only when
    `source` does not exist or is neither a folder nor a readable zip.
    """
    if source.is_dir():
        return source, {}
    if not source.is_file():
        raise GradingError(f"{source} does not exist: give a folder of submissions or a .zip of them")
    if not zipfile.is_zipfile(source):
        raise GradingError(f"{source} is neither a folder nor a valid zip archive")
    target = workdir / "unzipped"
    target.mkdir(parents=True)
    skipped: dict[str, str] = {}
    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                extract_entry(archive, info, target, skipped)
    except (zipfile.BadZipFile, zlib.error, OSError) as error:
        raise GradingError(f"{source} is a corrupt zip archive: {error}") from None
    return target, skipped


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
    """The checker's verdict under a test cell, as plain text: `message` (which may quote the student's values)
    with control characters escaped, and its further lines indented so none of them reads as a verdict."""
    mark = "passed" if passed else "FAILED"
    text = "\n    ".join(gradebook.plain_text(message).splitlines())
    return nbformat.v4.new_output("stream", name="stdout",
                                  text=f"[grader] {mark} ({points:g} point{'s' * (points != 1)}): {text}\n")


@dataclass
class Job:
    """Everything one grading run shares across students."""

    lab: str
    release: nbformat.NotebookNode
    points: dict[str, float]
    manual_points: dict[str, float]
    limits: Limits
    seed: int
    workdir: Path
    slots: queue.Queue
    workers: int


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


# A lab cell tagged so (a locked cell of the release: a demo run of the student's functions, or a visible test
# that reads one) is not run while grading: the checker's calls measure the same on the trusted side, and the
# sandbox's run of it would be believed for nothing. Lab 6's demo trainings are most of its notebook's time.
SKIPPED_TAG = "skip-when-graded"
SKIPPED_NOTE = ("Not run while grading: the grader calls your functions itself (see the checks' verdicts); "
                "run this cell in the lab to see its output.\n")


def skipped_when_graded(cell) -> bool:
    return SKIPPED_TAG in cell.get("metadata", {}).get("tags", []) and bool(
        cell.get("metadata", {}).get("nbgrader", {}).get("locked"))


def cell_plan(notebook: nbformat.NotebookNode) -> list[dict]:
    """The code cells the host runs, in order, each with its kind: "setup" for the lab's locked cells before
    the first answer (whose names the host restores before every call), else "answer", "test" or "other".
    The lab's cells tagged SKIPPED_TAG are left out."""
    plan, answered = [], False
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or skipped_when_graded(cell):
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        answered |= bool(meta.get("solution"))
        kind = ("answer" if meta.get("solution") else "test" if assemble.is_test(cell)
                else "setup" if meta.get("locked") and not answered else "other")
        plan.append({"index": index, "kind": kind, "source": cell.source})
    return plan


def answer_names(release_nb: nbformat.NotebookNode) -> list[str]:
    """The top-level names the lab's answer cells define (the host never restores these from the setup)."""
    import ast

    names: set[str] = set()
    with TRUSTED_LOCK:  # ast.parse is not safe in concurrent threads in CPython 3.11
        for cell in release_nb.cells:
            if cell.cell_type != "code" or not assemble.is_answer(cell):
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return sorted(names)


def grade_one(job: Job, sub: Submission) -> tuple[StudentResult, nbformat.NotebookNode | None]:
    """Assemble, run the notebook in the sandbox, make every check's call, judge. Never raises for anything in
    the submission."""
    result = StudentResult(sub.student, 0.0, sum(job.points.values()), "graded",
                           tests={gid: 0.0 for gid in job.points}, manual=dict.fromkeys(job.manual_points),
                           manual_points=dict(job.manual_points))
    try:
        cells, read_notes = assemble.read_cells(sub.path)
    except assemble.Unreadable as error:
        result.status = "needs review"
        result.notes.append(f"not graded: {error}")
        return result, None
    assembled = assemble.assemble(job.release, cells)
    result.manual = manual_scores(assembled.notebook, job.release)
    with TRUSTED_LOCK:
        result.notes += read_notes + assembled.notes + rule_notes(assembled, job.release)
    notebook = assembled.notebook
    folder = job.workdir / "sandboxes" / sub.student
    slot = job.slots.get()
    started = time.monotonic()
    limits = job.limits
    group = cgroups.create(f"{os.getpid()}-slot{slot}", limits.memory_bytes, limits.processes, limits.cpus)
    watchdog = None if group else cgroups.Watchdog(sandbox.FIRST_UID + slot, limits.memory_bytes)
    try:
        sandbox.prepare(folder, job.lab)
        command = sandbox.command(folder, limits, slot)
        session = Session(group.wrap(command) if group else command, folder / "sandbox.log", limits)
        try:
            run = session.run_notebook(cell_plan(notebook), answer_names(job.release))
            verdicts = judge_calls(job, sub.student, session)
        finally:
            session.close()
    finally:
        if group is not None:
            run_memory_hit = group.memory_limit_hit()
            group.remove()
        else:
            watchdog.stop()
            run_memory_hit = watchdog.tripped
        job.slots.put(slot)
    result.seconds = time.monotonic() - started
    if group is None:
        result.notes.append("sandbox: this machine has no writable cgroups; a watchdog measured the notebook's "
                            "memory instead, and its CPU was not shared out")
    if run_memory_hit:
        result.notes.append(f"memory: the notebook reached its {limits.memory_bytes >> 30} GiB limit (all its "
                            "processes together)")
    for index, cell_run in run.cells.items():
        notebook.cells[index].outputs = assemble.clean_outputs(cell_run.outputs)
    for cell in notebook.cells:
        if cell.cell_type == "code" and skipped_when_graded(cell):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=SKIPPED_NOTE)]
    for gid, verdict in verdicts.items():
        result.tests[gid] = job.points[gid] if verdict.passed else 0.0
        result.messages[gid] = verdict.message
        if gid in assembled.graded_cells:
            notebook.cells[assembled.graded_cells[gid]].outputs.append(
                verdict_output(verdict.passed, verdict.message, result.tests[gid]))
    result.score = float(sum(result.tests.values()))
    result.notes += run_notes(run, session, notebook, job.limits)
    result.notes += [note for note in [manual_note(result)] if note]
    if run.problem:
        result.status = "needs review"
    shutil.rmtree(folder, ignore_errors=True)
    return result, notebook


def judge_calls(job: Job, student: str, session: Session) -> dict:
    """Every check's call, made on inputs drawn now for this student, and its verdict (trusted side)."""
    checks, ref = lab_checks(job.lab), reference(job.lab)
    inputs = check_inputs(job.lab, job.seed, student)
    verdicts = {}
    for gid, check in checks.items():
        with TRUSTED_LOCK:
            server = ModelServer(check.serve(inputs[gid], ref)) if check.serve else None
        answer = session.call(job.lab.split("_")[0], check.probe, inputs[gid], server)
        if server is not None:
            inputs[gid]["measured"] = {"forwards": server.log}
        verdicts[gid] = judged(check, inputs[gid], answer, ref)
    return verdicts


def run_notes(run: NotebookRun, session: Session, notebook: nbformat.NotebookNode, limits: Limits) -> list[str]:
    """What the instructor and the student should know about how the run went, told apart by cause."""
    def name(index) -> str:
        try:
            cell = notebook.cells[int(index)]
        except (TypeError, ValueError, IndexError):
            return f"cell {index}"
        return f"cell '{assemble.grade_id(cell)}'" if assemble.grade_id(cell) else f"cell {index}"

    notes = [f"timeout: {name(i)} ran past the {limits.cell_timeout} s limit per cell and was interrupted"
             for i, cell in sorted(run.cells.items()) if cell.timeout][:20]
    if run.stopped_at is not None:
        notes.append(f"crash: the notebook stopped while running {name(run.stopped_at)} "
                     f"({str(run.problem)[:100]}); the cells after it did not run")
    for cell in notebook.cells:
        if any(o.get("ename") == "MemoryError" for o in cell.get("outputs", [])):
            notes.append(f"memory: a cell ran out of its {limits.memory_bytes >> 30} GiB memory limit")
            break
    if run.problem:
        notes.append(f"sandbox: {run.problem}")
        notes.append(f"sandbox log: {session.log_tail()}")
    elif session.dead:
        notes.append(f"sandbox: stopped during the checker's calls ({session.dead[:100]}); the calls after it "
                     "got no answer")
    return notes


def grade(lab: str, source: Path, out: Path, limits: Limits | None = None, force: bool = False,
          seed: int | None = None, workers: int = 2, resume: bool = False) -> list[StudentResult]:
    """Grade every submission of `lab` found in `source` (folder or zip) and write the results into `out`.

    limits: per-submission limits (default `Limits()`); force: replace an existing `out`, and start over when an
    interrupted run left a journal; seed: the seed of the hidden cases (default: fresh for every run, recorded in
    grading.log; a resumed run keeps its own); workers: sandboxes at once; resume: keep the students an
    interrupted run into the same `out` already graded (see journal_folder) and grade the rest.
    Raises GradingError only for the instructor's own mistakes: an unknown lab, a `source` that is not there
    or is neither a folder nor a zip, an `out` that holds something, a journal left without resume or force.
    """
    check_lab(lab)
    sandbox.available()
    limits = limits or Limits()
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise GradingError(f"{out} already exists and is not empty; choose another folder or pass --force")
    with tempfile.TemporaryDirectory(prefix="specdec-grade-") as tmp:
        workdir = Path(tmp)
        folder, skipped = unpack(Path(source), workdir)
        submissions = find_submissions(folder, lab, skipped)
        journal, seed = open_journal(out, lab, seed, force, resume)
        with ThreadPoolExecutor(max_workers=1) as side:  # nbgrader's generate_assignment is a process of its own:
            generated = side.submit(gradebook.make_course, workdir, lab)  # run the reference beside it
            reference(lab)  # once, before the threads start
            course = generated.result()
        release_nb = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
        points = {assemble.grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in release_nb.cells
                  if assemble.is_test(c)}
        manual_points = {assemble.grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in release_nb.cells
                         if assemble.is_written(c)}
        missing = set(points) ^ set(lab_checks(lab))
        if missing:
            raise GradingError(f"{lab}: test cells and checks do not match: {sorted(missing)}")
        slots: queue.Queue = queue.Queue()
        for slot in range(workers):
            slots.put(slot)
        job = Job(lab, release_nb, points, manual_points, limits, seed, workdir, slots, workers)
        results, kept = grade_all(job, submissions, journal)
        finish(job, course, results, kept, journal, out)
    return results


def journal_folder(out: Path) -> Path:
    """Where `grade` keeps each student's result the moment it is graded, until the outputs are placed:
    ".<out>.grading" beside `out` (so on its filesystem: the finished outputs move into `out` by one rename).

    It holds run.json (lab and seed) and, per student, students/<id>.json (the result and a fingerprint of the
    graded file and its intake notes) and students/<id>.ipynb (the graded notebook), each written whole or not
    at all; a crash or kill of the grader loses no student already graded."""
    return out.parent / f".{out.name}.grading"


def open_journal(out: Path, lab: str, seed: int | None, force: bool, resume: bool) -> tuple[Path, int]:
    """The journal of this run and its seed: the interrupted run's when resuming, else a fresh one (an empty
    journal, of a run that stopped before grading anyone, is simply replaced)."""
    journal = journal_folder(out)
    kept = list((journal / "students").glob("*.json")) if (journal / "run.json").exists() else []
    if journal.exists() and not kept:
        shutil.rmtree(journal)
    elif journal.exists() and not resume:
        if not force:
            raise GradingError(f"an earlier run into {out} stopped before it finished and kept {len(kept)} graded "
                               f"students in {journal}; pass --resume to keep them and grade the rest, or --force "
                               "to start over")
        shutil.rmtree(journal)
    if journal.exists():
        try:
            run = json.loads((journal / "run.json").read_text())
        except (OSError, ValueError) as error:
            raise GradingError(f"{journal / 'run.json'} is unreadable ({error}); pass --force to start over") from None
        if run.get("lab") != lab:
            raise GradingError(f"{journal} holds an interrupted run of {run.get('lab')!r}, not {lab!r}")
        if seed is not None and seed != run.get("seed"):
            raise GradingError(f"the interrupted run used the seed {run.get('seed')}, not {seed}: leave --seed out "
                               "to resume it, or pass --force to start over")
        return journal, int(run["seed"])
    seed = secrets.randbits(31) if seed is None else seed
    (journal / "students").mkdir(parents=True)
    write_whole(journal / "run.json", json.dumps({"lab": lab, "seed": seed}).encode())
    return journal, seed


def write_whole(path: Path, data: bytes) -> None:
    """Write `path` so that it is either complete or absent, whenever the grader dies."""
    part = path.with_name(f"{path.name}.part")
    with open(part, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(part, path)


def fingerprint(sub: Submission) -> str:
    """What a journaled result was graded from: the file's bytes and the intake notes (a rerun grades again a
    student whose file or intake changed)."""
    digest = hashlib.sha256(json.dumps(sub.notes).encode())
    if sub.path is not None:
        try:
            with open(sub.path, "rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
        except OSError as error:
            digest.update(str(error).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def journaled(journal: Path) -> dict[str, tuple[str, StudentResult]]:
    """student -> (fingerprint, result) of every complete record in the journal; a damaged one is graded again."""
    kept = {}
    for path in sorted((journal / "students").glob("*.json")):
        try:
            record = json.loads(path.read_text())
            kept[record["result"]["student"]] = (record["fingerprint"], StudentResult(**record["result"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return kept


def record(journal: Path, sub: Submission, print_: str, result: StudentResult,
           notebook: nbformat.NotebookNode | None) -> None:
    """Journal one student's result and graded notebook (the notebook first: a result on disk has its notebook).
    A notebook that cannot be serialised costs that student the notebook and feedback page, not the grade."""
    folder, data = journal / "students", None
    if notebook is not None:
        try:
            data = nbformat.writes(notebook).encode("utf-8")
        except Exception as error:  # e.g. a lone surrogate in an output: this student's page only
            result.notes.append(f"the graded notebook could not be saved ({type(error).__name__}); no feedback page")
    if data is None:
        (folder / f"{sub.student}.ipynb").unlink(missing_ok=True)
    else:
        write_whole(folder / f"{sub.student}.ipynb", data)
    write_whole(folder / f"{sub.student}.json", json.dumps({"fingerprint": print_, "result": asdict(result)}).encode())


def grade_and_record(job: Job, sub: Submission, print_: str, journal: Path) -> StudentResult:
    """Grade one student (a row needing review when intake found nothing to grade) and journal the result at
    once; the notebook is not kept in memory after that."""
    if sub.path is None:
        result, notebook = StudentResult(sub.student, 0.0, sum(job.points.values()), "needs review", [],
                                         {gid: 0.0 for gid in job.points}, manual=dict.fromkeys(job.manual_points),
                                         manual_points=dict(job.manual_points)), None
    else:
        result, notebook = safe_grade_one(job, sub)
    result.notes[:0] = [note for note in sub.notes if note not in result.notes]  # intake's notes first, once
    record(journal, sub, print_, result, notebook)
    return result


def grade_all(job: Job, submissions: list[Submission], journal: Path) -> tuple[list[StudentResult], int]:
    """The results of all `submissions` in order, and how many were kept from the journal (a student whose file
    and intake notes are unchanged is not graded again); the rest are graded `workers` at a time."""
    kept, results, todo = journaled(journal), {}, []
    for sub in submissions:
        print_ = fingerprint(sub)
        if sub.student in kept and kept[sub.student][0] == print_:
            results[sub.student] = kept[sub.student][1]
        else:
            todo.append((sub, print_))
    reused = len(results)
    pool = ThreadPoolExecutor(max_workers=job.workers)
    try:
        futures = {sub.student: pool.submit(grade_and_record, job, sub, print_, journal) for sub, print_ in todo}
        for student, future in futures.items():
            results[student] = future.result()
    finally:  # interrupted (Ctrl-C): students not started yet are not started; the journal keeps the others
        pool.shutdown(wait=True, cancel_futures=True)
    return [results[sub.student] for sub in submissions], reused


def finish(job: Job, course: Path, results: list[StudentResult], kept: int, journal: Path, out: Path) -> None:
    """Record the grades with nbgrader, render the feedback and move all outputs into `out` in one rename; then
    the journal goes. The notebooks are read back from the journal one at a time."""
    lab, staging = job.lab, journal / "outputs"
    shutil.rmtree(staging, ignore_errors=True)  # left by a run that died while finishing
    (staging / "autograded").mkdir(parents=True)
    (staging / "feedback").mkdir()
    gradebook.record(course, lab, [(r.student, r.tests, r.status != "graded") for r in results],
                     {r.student: r.manual for r in results})
    for result in results:
        saved = journal / "students" / f"{result.student}.ipynb"
        if saved.exists():
            notebook = nbformat.read(saved, as_version=4)
            notebook.cells.insert(0, notes_cell(result))
            target = course / "autograded" / result.student / lab / f"{lab}.ipynb"
            target.parent.mkdir(parents=True)
            nbformat.write(notebook, target)
            shutil.copy(target, staging / "autograded" / f"{result.student}.ipynb")
    rendered = [r.student for r in results if (course / "autograded" / r.student).exists()]
    log = gradebook.generate_feedback(course, lab, rendered, processes=job.workers)
    for result in results:
        feedback = course / "feedback" / result.student / lab / f"{lab}.html"
        if feedback.exists():
            shutil.copy(feedback, staging / "feedback" / f"{result.student}.html")
    write_reports(results, lab, staging)
    (staging / "grading.log").write_text(
        f"seed {job.seed}\n" + (f"resumed: {kept} students kept from an interrupted run\n" if kept else "")
        + "".join(f"{r.student}: {r.seconds:.1f} s, {r.status}\n" for r in results)
        + "\nnbgrader generate_feedback:\n" + log[-20000:], encoding="utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # --force, or an empty folder: the old outputs go with the journal
        os.replace(out, journal / "replaced")
    os.replace(staging, out)
    shutil.rmtree(journal)


def safe_grade_one(job: Job, sub: Submission) -> tuple[StudentResult, nbformat.NotebookNode | None]:
    """grade_one, with any failure of the grader itself confined to this student (marked for review)."""
    try:
        return grade_one(job, sub)
    except Exception as error:  # a grader bug must not cost the rest of the class their grades
        return StudentResult(sub.student, 0.0, sum(job.points.values()), "needs review",
                             [f"the grader failed on this submission: {type(error).__name__}: {error}"],
                             {gid: 0.0 for gid in job.points}, manual=dict.fromkeys(job.manual_points),
                             manual_points=dict(job.manual_points)), None


def notes_cell(result: StudentResult) -> nbformat.NotebookNode:
    """A markdown cell at the top of the graded notebook with the grader's notes for the student. Notes quote
    the submission (grade ids, file names, values), so each is escaped to show as text; the block is outside
    MathJax's reach (tex2jax_ignore), so a "$" in a note stays a dollar sign."""
    manual = f"; written answers ({result.pending_points():g} points): needs manual grading" \
        if result.awaiting() else ""
    lines = ['<div class="tex2jax_ignore">', "",
             f"**Grader notes** (score {result.score:g} / {result.max_score:g}, "
             f"{gradebook.markdown_text(result.status)}{manual})", ""]
    lines += [f"- {gradebook.markdown_text(note)}" for note in result.notes] or ["- nothing to report"]
    return nbformat.v4.new_markdown_cell("\n".join([*lines, "", "</div>"]))


def write_reports(results: list[StudentResult], lab: str, staging: Path) -> None:
    with open(staging / "grades.csv", "w", newline="", encoding="utf-8") as handle:  # ids keep Unicode letters
        writer = csv.writer(handle)
        writer.writerow(["student", "lab", "score", "max_score", "manual_pending", "manual_max", "status", "notes"])
        for r in results:
            writer.writerow([r.student, lab, f"{r.score:g}", f"{r.max_score:g}", f"{r.pending_points():g}",
                             f"{sum(r.manual_points.values()):g}", r.status, " | ".join(r.notes)])
    (staging / "scores.json").write_text(json.dumps([asdict(r) for r in results], indent=1))

