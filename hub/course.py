"""The trusted side of a class on the hub: preparing the hub's folders, and the instructor's round trip through
nbgrader's exchange (release, close, collect, grade, return feedback), one function (and one command) each.

Every step runs as root on the hub machine, as the grader does (its sandbox needs root): nbgrader's own commands
run in the instructor's course folder (settings.course_dir), grading is `python -m autograder grade`, unchanged,
on the collected notebooks, and the scores go into the course's gradebook from the grader's scores.json, so the
gradebook is written only here. What these steps leave in the course folder is then handed to the instructor.

What a student can do wrong arrives here as data, never as a stop: a submission folder that names someone other
than its owner is refused (moved to refused/<lab>/ in the course folder), one made after the lab closed is set
aside (late/<lab>/), and several submissions of one student give the latest, each said on a line of the report.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hub import exchange
from hub.settings import (
    REPO,
    HubSettings,
    SettingsError,
    course_nbgrader_config,
    instructor_nbgrader_config,
    student_nbgrader_config,
)

# What no student may read on a hub machine, though it lives in the project's checkout that their servers run
# from: the instructor's solutions, the hidden checks, and git's copy of both.
PROTECTED = ("solutions", "autograder/checks", ".git")


class CourseError(Exception):
    """An instructor's mistake (unknown course or lab, nothing to grade), with a message meant for them."""


def check_course(settings: HubSettings, course_id: str | None) -> None:
    if course_id is not None and course_id != settings.course_id:
        raise CourseError(f"unknown course {course_id!r}: this hub's course is {settings.course_id!r}")


def check_lab(lab: str) -> None:
    from autograder.gradebook import GradingError
    from autograder.gradebook import check_lab as known

    try:
        known(lab)
    except GradingError as error:
        raise CourseError(str(error)) from None


def give_to(path: Path, user: str) -> None:
    """Make `user` the owner of `path` and everything under it."""
    entry = pwd.getpwnam(user)
    for folder, _, files in os.walk(path):
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(folder, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def prepare(settings: HubSettings) -> None:
    """The hub's folders, before it starts: its private state (root's), the configuration every server reads,
    the exchange, the instructor's course folder (the instructor's, mode 0700), and the checkout's PROTECTED
    folders closed to other users."""
    for user in settings.users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise SettingsError(f"no system user {user!r}: create it (useradd -m {user} && passwd {user}), or "
                                "let `python -m hub start --create-users` do it") from None
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.state_dir, 0o711)
    private = settings.state_dir / "private"
    private.mkdir(exist_ok=True)
    os.chmod(private, 0o700)
    public = settings.state_dir / "public"
    for role, text in (("student", student_nbgrader_config(settings)),
                       ("instructor", instructor_nbgrader_config(settings))):
        (public / "nbgrader" / role).mkdir(parents=True, exist_ok=True)
        (public / "nbgrader" / role / "nbgrader_config.py").write_text(text)
    python = public / "python"
    python.mkdir(exist_ok=True)
    if not (python / "hub").exists():
        (python / "hub").symlink_to(REPO / "hub")
    for folder, _, files in os.walk(public):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    settings.extra["server_python"] = str(server_python(settings))
    settings.save()
    os.chmod(settings.settings_file, 0o600)
    exchange.prepare(settings.exchange_dir, settings.course_id)
    course = settings.course_dir
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(course_nbgrader_config(settings))
    give_to(course, settings.instructors[0])
    os.chmod(course, 0o700)
    for name in PROTECTED:
        if (REPO / name).exists():
            os.chmod(REPO / name, os.stat(REPO / name).st_mode & ~0o007)


def runnable_by_all(path: Path) -> bool:
    """Whether any user can run `path`: it and every folder above it have the others' execute bit."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def server_python(settings: HubSettings) -> Path:
    """The interpreter the users' servers run: the project's own when every user can run it; else (a Python
    installed in root's home, say) the system's Python of the same version, in a bare virtual environment in
    the hub's public folder that sees the project's installed packages."""
    own = settings.venv / "bin" / "python"
    if runnable_by_all(own):
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = next((Path(p) for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}")
                   if Path(p).exists() and runnable_by_all(Path(p))), None)
    if system is None:
        raise SettingsError(f"the users cannot run {own.resolve()} (a folder above it is closed to them) and "
                            f"there is no /usr/bin/{version} to use instead: install the project with a Python "
                            "every user can run")
    env = settings.state_dir / "public" / "server-env"
    if not (env / "bin" / "python").exists():
        subprocess.run([str(system), "-m", "venv", "--without-pip", str(env)], check=True)
    packages = next((settings.venv / "lib").glob("python3*/site-packages"))
    (env / "lib" / version / "site-packages" / "specdec-lab.pth").write_text(
        f"import site; site.addsitedir({str(packages)!r})\n")
    return env / "bin" / "python"


def nbgrader(settings: HubSettings, *args: str) -> str:
    """Run one nbgrader command in the course folder; its log, or CourseError with it."""
    from autograder.gradebook import NBGRADER, nbgrader_environment

    done = subprocess.run([*NBGRADER, *args], cwd=settings.course_dir, env=nbgrader_environment(),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise CourseError(f"nbgrader {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stderr


def release(settings: HubSettings, lab: str, force: bool = False) -> str:
    """Put `lab` (its solutions/ source) into the course and its student version into the exchange, where every
    student can fetch it. force: replace a release that students may already have fetched."""
    check_lab(lab)
    if (settings.course_exchange / "outbound" / lab).exists() and not force:
        raise CourseError(f"{lab} is already released; `--force` replaces the release (students who fetched it "
                          "keep their copy)")
    source = settings.course_dir / "source" / lab
    source.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "solutions" / lab / f"{lab}.ipynb", source / f"{lab}.ipynb")
    try:
        nbgrader(settings, "generate_assignment", lab, "--force")
        nbgrader(settings, "release_assignment", lab, "--force")
    finally:
        give_to(settings.course_dir, settings.instructors[0])
    return f"released {lab} to {settings.course_exchange / 'outbound' / lab}"


def close(settings: HubSettings, lab: str) -> str:
    """Close `lab`: later submissions are refused by the students' servers and set aside by collect."""
    check_lab(lab)
    marker = settings.course_exchange / "closed" / lab
    marker.write_text(datetime.now(UTC).isoformat())
    os.chmod(marker, 0o644)
    return f"closed {lab} at {marker.read_text()}"


@dataclass
class Entry:
    """One folder in the exchange's inbound: who it says submitted it, who wrote it, when."""

    path: Path
    claimed: str
    lab: str
    timestamp: str
    owner: str
    changed: datetime


def inbound_entries(settings: HubSettings) -> list[Entry]:
    entries = []
    for path in sorted((settings.course_exchange / "inbound").iterdir()):
        parts = path.name.rsplit("+", 3)
        stat = path.lstat()
        try:
            owner = pwd.getpwuid(stat.st_uid).pw_name
        except KeyError:
            owner = f"uid {stat.st_uid}"
        claimed, lab, timestamp = (parts[0], parts[1], parts[2]) if len(parts) >= 3 else (path.name, "", "")
        entries.append(Entry(path, claimed, lab, timestamp, owner, datetime.fromtimestamp(stat.st_ctime, UTC)))
    return entries


def set_aside(entry: Entry, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / entry.path.name
    shutil.move(entry.path, target)
    return target


def collect(settings: HubSettings, lab: str) -> list[str]:
    """Collect the latest submission of `lab` of each student into the course's submitted/ (nbgrader collect
    --update), after refusing forged and late submissions (see the module docstring). Returns the report, one
    line per student and per refused or late folder."""
    check_lab(lab)
    lines = []
    closed = exchange.closed_at(settings.course_exchange, lab)
    counts: dict[str, int] = {}
    for entry in inbound_entries(settings):
        if entry.lab != lab and entry.claimed != entry.path.name:
            continue
        if entry.claimed != entry.owner or entry.claimed not in settings.students or entry.path.is_symlink():
            kept = set_aside(entry, settings.course_dir / "refused" / lab)
            lines.append(f"refused: {entry.path.name!r} names {entry.claimed!r} but was written by {entry.owner!r} "
                         f"(kept in {kept})")
        elif closed is not None and entry.changed > closed:
            kept = set_aside(entry, settings.course_dir / "late" / lab)
            lines.append(f"late: {entry.claimed} submitted at {entry.changed.isoformat(timespec='seconds')}, "
                         f"after {lab} closed at {closed.isoformat(timespec='seconds')}; not collected (kept in "
                         f"{kept})")
        else:
            counts[entry.claimed] = counts.get(entry.claimed, 0) + 1
    try:
        if counts:
            nbgrader(settings, "collect", lab, "--update")
    finally:
        give_to(settings.course_dir, settings.instructors[0])
    for student in settings.students:
        stamp = settings.course_dir / "submitted" / student / lab / "timestamp.txt"
        if student not in counts:
            lines.append(f"{student}: no submission")
        else:
            many = f"{counts[student]} submissions, collected the latest" if counts[student] > 1 else "collected"
            lines.append(f"{student}: {many}, submitted at {stamp.read_text().strip()}")
    return lines


@dataclass
class Grade:
    """One student's grade as recorded in the course's gradebook."""

    student: str
    score: float
    max_score: float
    status: str
    notes: list[str]


def grade(settings: HubSettings, lab: str, workers: int = 2, extra_args: tuple[str, ...] = ()) -> list[Grade]:
    """Grade the collected submissions of `lab` with the sandboxed grader (`python -m autograder grade`, as
    shipped), then record its scores in the course's gradebook and put its feedback pages where nbgrader's
    release_feedback looks for them (feedback/<student>/<lab>/<lab>.html with the submission's timestamp and
    secret)."""
    from autograder.pipeline import student_id

    check_lab(lab)
    course = settings.course_dir
    submitted = {p.name: p / lab for p in sorted((course / "submitted").glob("*"))
                 if (p / lab / f"{lab}.ipynb").is_file()}
    if not submitted:
        raise CourseError(f"nothing collected for {lab}: run `python -m hub collect {lab}` first")
    work = course / "autograder" / lab
    shutil.rmtree(work, ignore_errors=True)
    for student, folder in submitted.items():
        (work / "submissions" / student).mkdir(parents=True)
        shutil.copy(folder / f"{lab}.ipynb", work / "submissions" / student / f"{lab}.ipynb")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", lab, str(work / "submissions"), "--out",
                           str(work / "out"), "--workers", str(workers), *extra_args], cwd=REPO)
    if done.returncode not in (0, 1):  # 1: graded, with rows that need review
        give_to(course, settings.instructors[0])
        raise CourseError(f"python -m autograder grade {lab} failed (exit {done.returncode}); see above")
    by_id = {student_id(name, is_file=False): name for name in submitted}
    rows = json.loads((work / "out" / "scores.json").read_text())
    grades = []
    for row in rows:
        student = by_id[row["student"]]
        grades.append(Grade(student, row["score"], row["max_score"], row["status"], row["notes"]))
        page = work / "out" / "feedback" / f"{row['student']}.html"
        target = course / "feedback" / student / lab
        shutil.rmtree(target, ignore_errors=True)
        if page.is_file():
            target.mkdir(parents=True)
            shutil.copy(page, target / f"{lab}.html")
            for name in ("timestamp.txt", "submission_secret.txt"):
                shutil.copy(submitted[student] / name, target / name)
    record(course, settings.course_id, lab, [(by_id[r["student"]], r["tests"], r["status"] != "graded")
                                             for r in rows], {by_id[r["student"]]: r.get("manual", {}) for r in rows})
    give_to(course, settings.instructors[0])
    return grades


def record(course: Path, course_id: str, lab: str, grades: list[tuple[str, dict[str, float], bool]],
           manual: dict[str, dict[str, float | None]] | None = None) -> None:
    """Write the grader's scores into the course's gradebook (grades: student, grade id -> points, whether a
    person must review the submission; manual: student -> each written answer's score, None while it awaits
    manual grading, which the formgrader then lists, 0.0 for no answer). A grader's manual score is kept."""
    import warnings

    from nbgrader.api import Gradebook

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gradebook:
        warnings.simplefilter("ignore")  # SQLAlchemy 2 warns inside nbgrader's own submission code
        for student, scores, needs_review in grades:
            gradebook.update_or_create_student(student)
            gradebook.update_or_create_submission(lab, student)
            for grade_id, score in scores.items():
                cell = gradebook.find_grade(grade_id, lab, lab, student)
                cell.auto_score = score
                cell.needs_manual_grade = needs_review
            for grade_id, score in (manual or {}).get(student, {}).items():
                cell = gradebook.find_grade(grade_id, lab, lab, student)
                cell.auto_score = score
                cell.needs_manual_grade = score is None or needs_review
        gradebook.db.commit()


def return_feedback(settings: HubSettings, lab: str) -> list[str]:
    """Release the feedback pages of `lab` through nbgrader's feedback exchange; each student then fetches
    their own (and can open no one else's: the pages are named by a hash of their submission's secret)."""
    check_lab(lab)
    students = sorted(p.parent.name for p in (settings.course_dir / "feedback").glob(f"*/{lab}"))
    if not students:
        raise CourseError(f"no feedback for {lab}: run `python -m hub grade {lab}` first")
    try:
        nbgrader(settings, "release_feedback", lab)
    finally:
        give_to(settings.course_dir, settings.instructors[0])
    return [f"feedback of {lab} released for {', '.join(students)}"]
