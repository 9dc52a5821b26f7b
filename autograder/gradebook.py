"""The nbgrader glue (trusted side): the course folder, releases, the gradebook and the feedback pages.

nbgrader does what it does well here: it generates the student version of a lab (hidden tests and solutions
removed, cell ids and checksums), keeps the gradebook, and renders feedback. It does not execute student
notebooks: the sandbox does (sandbox/), and the grades it records come from the trusted checks (checks/).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

AUTOGRADER = Path(__file__).resolve().parent
REPO = AUTOGRADER.parent
SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"
COURSE_ID = "specdec-lab"


class GradingError(Exception):
    """Bad input or a failed nbgrader step, with a message meant for the instructor."""


def list_labs() -> list[str]:
    """The lab ids (folder names in solutions/), in order."""
    return sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and re.fullmatch(r"lab\d\d_\w+", p.name))


def check_lab(lab: str) -> None:
    if lab not in list_labs():
        raise GradingError(f"unknown lab {lab!r}; the labs are: {', '.join(list_labs())}")


def nbgrader_environment() -> dict[str, str]:
    env = dict(os.environ)
    # nbgrader runs `alembic` (installed next to the interpreter) to check its database schema.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_nbgrader(course: Path, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one nbgrader command in `course`; with `check`, a failure raises GradingError with nbgrader's log."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=nbgrader_environment(),
                          capture_output=True, text=True)
    if check and done.returncode != 0:
        raise GradingError(f"nbgrader {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done


def make_course(workdir: Path, lab: str) -> Path:
    """An nbgrader course folder under `workdir` with `lab` generated (gradebook and release)."""
    course = workdir / "course"
    (course / "source" / lab).mkdir(parents=True)
    shutil.copy(SOLUTIONS / lab / f"{lab}.ipynb", course / "source" / lab / f"{lab}.ipynb")
    config = (AUTOGRADER / "nbgrader_config.py").read_text()
    (course / "nbgrader_config.py").write_text(config + f"\nc.CourseDirectory.root = {str(course)!r}\n")
    run_nbgrader(course, ["generate_assignment", lab, "--force"])
    return course


def release(lab: str, dest: Path) -> Path:
    """Generate the student version of `lab` with nbgrader into `dest`/<lab>.ipynb; returns that path."""
    check_lab(lab)
    with tempfile.TemporaryDirectory(prefix="specdec-release-") as tmp:
        course = make_course(Path(tmp), lab)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / f"{lab}.ipynb"
        shutil.copy(course / "release" / lab / f"{lab}.ipynb", target)
    return target


def record(course: Path, lab: str, grades: list[tuple[str, dict[str, float], bool]]) -> None:
    """Write the trusted scores into the gradebook, in one session (opening it costs most of a second).

    grades: per student, (student id, grade id -> points, whether the submission needs a person's review).
    """
    from nbgrader.api import Gradebook

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gradebook:
        warnings.simplefilter("ignore")  # SQLAlchemy 2 warns inside nbgrader's own submission code
        for student, scores, needs_review in grades:
            gradebook.update_or_create_student(student)
            gradebook.update_or_create_submission(lab, student)
            for grade_id, score in scores.items():
                grade = gradebook.find_grade(grade_id, lab, lab, student)
                grade.auto_score = score
                grade.needs_manual_grade = needs_review
        gradebook.db.commit()


def max_score(course: Path, lab: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        return float(gradebook.find_assignment(lab).max_score)


def generate_feedback(course: Path, lab: str) -> str:
    """nbgrader's HTML feedback for every recorded notebook in course/autograded; returns nbgrader's log."""
    return run_nbgrader(course, ["generate_feedback", lab, "--force"], check=False).stderr
