"""nbgrader's file-system exchange as the course hub uses it: the same classes, with clear messages for the
mistakes students make and permissions that keep one student's submission from every other student.

Layout of a course in the exchange (made by `prepare`, run as root when the hub starts):

    <exchange>/                      0755  root
    <exchange>/<course>/             0755  root
        outbound/<lab>/              0755  releases: every student reads, only root writes
        inbound/                     2733  submissions: every student writes, no student lists
            <user>+<lab>+<time>+<random>/   2770, files 0660: the submitting student and root only
        feedback/                    0711  feedback pages, named by a hash of the submission's secret: a student
                                           opens their own (fetch_feedback) and cannot list the others
        closed/<lab>                 0755  a lab's closing time (python -m hub close LAB)

The checks in these classes run in the student's own server, so they help honest students (a message instead of
a lost submission); they are not what keeps the class honest. That is the trusted collect (hub/course.py): it
refuses a submission whose folder is not owned by the student it names, and sets aside (never deletes) those
made after the lab closed, using the folder's change time, which a student cannot set back.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from nbgrader.exchange.default.fetch_assignment import ExchangeFetchAssignment
from nbgrader.exchange.default.fetch_feedback import ExchangeFetchFeedback
from nbgrader.exchange.default.list import ExchangeList
from nbgrader.exchange.default.release_assignment import ExchangeReleaseAssignment
from nbgrader.exchange.default.submit import ExchangeSubmit
from nbgrader.utils import get_username

SUBMISSION_DIR_MODE = 0o2770
SUBMISSION_FILE_MODE = 0o660
EXCHANGE_MODES = {"": 0o755, "outbound": 0o755, "inbound": 0o2733, "feedback": 0o711, "closed": 0o755}


def prepare(exchange_root: Path, course_id: str) -> Path:
    """Create (or repair) the exchange root and the course's folders with the modes above, owned by the caller
    (root on a hub); returns the course's folder."""
    exchange_root.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange_root, 0o755)
    course = exchange_root / course_id
    for sub, mode in EXCHANGE_MODES.items():
        folder = course / sub if sub else course
        folder.mkdir(exist_ok=True)
        os.chmod(folder, mode)
    return course


def closed_at(course_exchange: Path, lab: str) -> datetime | None:
    """When `lab` was closed (python -m hub close), or None while it is open."""
    marker = course_exchange / "closed" / lab
    if not marker.is_file():
        return None
    return datetime.fromisoformat(marker.read_text().strip())


def released_labs(course_exchange: Path) -> list[str]:
    outbound = course_exchange / "outbound"
    return sorted(p.name for p in outbound.iterdir() if p.is_dir()) if outbound.is_dir() else []


class CourseMessages:
    """Checks shared by the student-side classes, run before nbgrader's own: the course exists in this
    exchange, and the lab was released."""

    def ensure_root(self):
        """The exchange root must exist and be enterable; nbgrader's own check also wants it writable by every
        user (0777), which would let any student create folders at the top of the exchange."""
        if not os.path.isdir(self.root) or not os.access(self.root, os.X_OK):
            self.fail(f"the exchange {self.root} is missing or closed to you: ask your instructor")

    def check_course(self) -> Path:
        root = Path(self.root)
        course = root / self.coursedir.course_id
        if not self.coursedir.course_id or not (course / "outbound").is_dir():
            known = sorted(p.name for p in root.iterdir() if (p / "outbound").is_dir()) if root.is_dir() else []
            self.fail(f"unknown course {self.coursedir.course_id!r}: the courses in this exchange are "
                      f"{', '.join(map(repr, known)) or 'none'}")
        return course

    def check_released(self, course: Path, lab: str) -> None:
        if not (course / "outbound" / lab).is_dir():
            released = released_labs(course)
            self.fail(f"{lab!r} has not been released in {self.coursedir.course_id!r}; released so far: "
                      f"{', '.join(released) or 'nothing'}")


class CourseFetchAssignment(CourseMessages, ExchangeFetchAssignment):
    """nbgrader fetch_assignment with clear messages for an unknown course or a lab not (yet) released."""

    def init_src(self):
        self.check_released(self.check_course(), self.coursedir.assignment_id)
        super().init_src()


class CourseSubmit(CourseMessages, ExchangeSubmit):
    """nbgrader submit that refuses what the trusted collect would refuse (submitting as someone else, after the
    lab closed) with a message saying the work is still in the student's folder, and that makes the submission
    readable by its author and root only."""

    def init_dest(self):
        course = self.check_course()
        lab = self.coursedir.assignment_id
        self.check_released(course, lab)
        me = get_username()
        if self.coursedir.student_id not in ("*", me):
            self.fail(f"you can submit only as yourself ({me!r}), not as {self.coursedir.student_id!r}")
        closed = closed_at(course, lab)
        if closed is not None:
            self.fail(f"{lab!r} closed at {closed.isoformat(timespec='seconds')}: this submission was not sent. "
                      f"Your notebook is still in your folder ({lab}/); ask your instructor about late work")
        super().init_dest()

    def copy_files(self):
        super().copy_files()
        dest = Path(self.inbound_path) / self.assignment_filename
        for folder, _, files in os.walk(dest):
            os.chmod(folder, SUBMISSION_DIR_MODE)
            for name in files:
                os.chmod(os.path.join(folder, name), SUBMISSION_FILE_MODE)


class CourseFetchFeedback(CourseMessages, ExchangeFetchFeedback):
    """nbgrader fetch_feedback with a clear message for an unknown course."""

    def init_src(self):
        self.check_course()
        super().init_src()


class CourseList(CourseMessages, ExchangeList):
    """nbgrader list (the Assignments tab) on an exchange root that students cannot write."""


class CourseReleaseAssignment(ExchangeReleaseAssignment):
    """nbgrader release_assignment that keeps the exchange root at 0755 (nbgrader would make it 0777, letting
    any student create folders there); `prepare` has made it."""

    def ensure_root(self):
        if not os.path.isdir(self.root):
            self.fail(f"the exchange {self.root} does not exist: start the hub (make hub), which prepares it")
