"""What one hub of the course is: its users, ports, folders and course id, validated, stored as JSON beside the
hub's state, and read by hub/jupyterhub_config.py (which JupyterHub loads) and by the instructor's commands.

Nothing here starts anything: `HubSettings` is plain data, and `nbgrader_config` writes the nbgrader
configuration each side loads (students: the exchange only; the instructor's course: the autograder's course
configuration plus the exchange).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HUB = REPO / "hub"
COURSE_ID = "specdec-lab"  # the autograder's course id (autograder/nbgrader_config.py)
# A POSIX-portable user name as useradd accepts it, without the characters nbgrader's exchange gives a meaning
# to ('+' separates the fields of a submission's folder name, '*' is a glob).
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
COURSE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class SettingsError(ValueError):
    """A hub setting that cannot work, with a message naming it."""


@dataclass
class HubSettings:
    """One hub of the course.

    students, instructors: system user names (PAM logs them in; each gets a single-user server running as that
    user); state_dir: the hub's own files (database, cookie secret, logs, settings.json), root's only;
    exchange_dir: nbgrader's exchange root (the course's folder inside it: outbound, inbound, feedback);
    course_dir: the instructor's nbgrader course folder (source/, release/, submitted/, gradebook.db), owned by
    the first instructor and readable by no student; port: where the hub listens on 127.0.0.1;
    proxy_command: the configurable-http-proxy executable (npm); venv: the interpreter folder every
    single-user server runs from (the project's install).
    """

    students: list[str]
    instructors: list[str]
    state_dir: Path
    exchange_dir: Path
    course_dir: Path
    port: int = 8000
    course_id: str = COURSE_ID
    proxy_command: Path = Path.home() / ".cache/specdec-lab/hub-proxy/node_modules/.bin/configurable-http-proxy"
    venv: Path = REPO / ".venv"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("state_dir", "exchange_dir", "course_dir", "proxy_command", "venv"):
            setattr(self, name, Path(getattr(self, name)))
        self.validate()

    def validate(self) -> None:
        if not self.students:
            raise SettingsError("a hub needs at least one student (USERS=...)")
        if not self.instructors:
            raise SettingsError("a hub needs at least one instructor (INSTRUCTORS=...)")
        for name in [*self.students, *self.instructors]:
            if not USER_NAME.fullmatch(name):
                raise SettingsError(f"user name {name!r} is not a system user name (lower-case letters, digits, "
                                    "'_' and '-', starting with a letter or '_', at most 32 characters)")
        both = sorted(set(self.students) & set(self.instructors))
        if both:
            raise SettingsError(f"{', '.join(both)}: a user is a student or an instructor, not both")
        if len(set(self.students)) != len(self.students):
            raise SettingsError("a student is listed twice")
        if not COURSE_NAME.fullmatch(self.course_id):
            raise SettingsError(f"course id {self.course_id!r}: letters, digits, '_', '.', '-' only")
        if not 1024 <= self.port <= 65535:
            raise SettingsError(f"port {self.port} is not an unprivileged port (1024-65535)")
        for name in ("state_dir", "exchange_dir", "course_dir"):
            if not getattr(self, name).is_absolute():
                raise SettingsError(f"{name} must be an absolute path, not {getattr(self, name)}")

    @property
    def users(self) -> list[str]:
        return [*self.instructors, *self.students]

    @property
    def course_exchange(self) -> Path:
        """The course's folder in the exchange (outbound/, inbound/, feedback/, closed/)."""
        return self.exchange_dir / self.course_id

    @property
    def settings_file(self) -> Path:
        return self.state_dir / "settings.json"

    def role(self, user: str) -> str:
        """'instructor' or 'student'; any other name is refused (it is not on this hub)."""
        if user in self.instructors:
            return "instructor"
        if user in self.students:
            return "student"
        raise SettingsError(f"{user!r} is not a user of this hub")

    def save(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        self.settings_file.write_text(json.dumps(data, indent=1))
        return self.settings_file

    @classmethod
    def load(cls, path: Path) -> HubSettings:
        """The settings saved at `path` (a settings.json written by `save`)."""
        if not Path(path).is_file():
            raise SettingsError(f"no hub settings at {path}: start the hub first (make hub USERS=...)")
        return cls(**json.loads(Path(path).read_text()))


def exchange_lines(settings: HubSettings) -> list[str]:
    """nbgrader configuration lines shared by both sides: the course id, the exchange root and the course's
    exchange classes (hub/exchange.py)."""
    return exchange_config(settings.exchange_dir, settings.course_id)


def exchange_config(exchange_dir: Path, course_id: str = COURSE_ID) -> list[str]:
    """The exchange lines for a course `course_id` whose exchange root is `exchange_dir` (also what the
    Kubernetes image writes, hub/Dockerfile)."""
    if not COURSE_NAME.fullmatch(course_id):
        raise SettingsError(f"course id {course_id!r}: letters, digits, '_', '.', '-' only")
    return [
        f"c.CourseDirectory.course_id = {course_id!r}",
        f"c.Exchange.root = {str(exchange_dir)!r}",
        "c.Exchange.path_includes_course = False",
        "c.ExchangeFactory.fetch_assignment = 'hub.exchange.CourseFetchAssignment'",
        "c.ExchangeFactory.submit = 'hub.exchange.CourseSubmit'",
        "c.ExchangeFactory.fetch_feedback = 'hub.exchange.CourseFetchFeedback'",
        "c.ExchangeFactory.list = 'hub.exchange.CourseList'",
        "c.ExchangeFactory.release_assignment = 'hub.exchange.CourseReleaseAssignment'",
    ]


def student_nbgrader_config(settings: HubSettings) -> str:
    """The nbgrader_config.py every single-user server finds on its JUPYTER_CONFIG_PATH: the exchange, nothing
    of the instructor's (no course root, no gradebook)."""
    return exchange_file(exchange_lines(settings))


def exchange_file(lines: list[str]) -> str:
    return ('"""nbgrader on the course hub (written by hub/settings.py): the exchange of the course."""\n'
            "c = get_config()  # noqa: F821\n" + "\n".join(lines) + "\n")


def course_nbgrader_config(settings: HubSettings) -> str:
    """The instructor's course folder's nbgrader_config.py: the autograder's course configuration (release
    stubs, sanitised feedback) with the course root and the exchange."""
    base = (REPO / "autograder" / "nbgrader_config.py").read_text()
    return (base + "\n# The course hub (hub/settings.py): this folder and the exchange.\n"
            + f"c.CourseDirectory.root = {str(settings.course_dir)!r}\n" + "\n".join(exchange_lines(settings))
            + "\n")


def instructor_nbgrader_config(settings: HubSettings) -> str:
    """The instructor's server's nbgrader configuration: the exchange and the course folder (the formgrader's
    view of the gradebook); grading itself runs from the command line (python -m hub grade)."""
    return student_nbgrader_config(settings) + f"c.CourseDirectory.root = {str(settings.course_dir)!r}\n"
