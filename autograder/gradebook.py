"""The nbgrader glue (trusted side): the course folder, releases, the gradebook and the feedback pages.

nbgrader does what it does well here: it generates the student version of a lab (hidden tests and solutions
removed, cell ids and checksums), keeps the gradebook, and renders feedback. It does not execute student
notebooks: the sandbox does (sandbox/), and the grades it records come from the trusted checks (checks/).

Feedback pages are inert: instructors and students open them in a browser, and everything a submission wrote
(its markdown, code, outputs, grade ids, file name) is shown as text or as sanitised HTML, never as a script.
nbgrader's feedback template renders markdown without nbconvert's `sanitize_html` (it overrides that block), and
nbconvert's markdown renderer lets `[x](javascript:...)` through; so nbgrader_config.py replaces the template's
`markdown2html` filter by `feedback_markdown` (render, then sanitise with bleach) and turns `sanitize_html` on for
outputs. The grader's own text about a submission is escaped where it is written (`markdown_text`, `plain_text`).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
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
    # nbgrader_config.py names this module's feedback filter: nbgrader must be able to import it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    return env


# nbgrader's command line, started through this package (see autograder/nbgrader_main.py: 3 s less per start).
NBGRADER = [sys.executable, "-m", "autograder.nbgrader_main"]


def run_nbgrader(course: Path, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one nbgrader command in `course`; with `check`, a failure raises GradingError with nbgrader's log."""
    done = subprocess.run([*NBGRADER, *args], cwd=course, env=nbgrader_environment(), capture_output=True,
                          text=True)
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


def record(course: Path, lab: str, grades: list[tuple[str, dict[str, float], bool]],
           manual: dict[str, dict[str, float | None]] | None = None) -> None:
    """Write the trusted scores into the gradebook, in one session (opening it costs most of a second).

    grades: per student, (student id, grade id -> points, whether the submission needs a person's review);
    manual: per student, each written answer's score: None while it awaits manual grading (no score, marked
    for manual grading, as nbgrader's own autograder leaves an answered written cell), 0.0 for no answer.
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
            for grade_id, score in (manual or {}).get(student, {}).items():
                grade = gradebook.find_grade(grade_id, lab, lab, student)
                grade.auto_score = score
                grade.needs_manual_grade = score is None or needs_review
        gradebook.db.commit()


def max_score(course: Path, lab: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        return float(gradebook.find_assignment(lab).max_score)


def generate_feedback(course: Path, lab: str, students: list[str], processes: int = 2) -> str:
    """nbgrader's HTML feedback for `students`' recorded notebooks in course/autograded (course: a folder made by
    `make_course`, lab: its lab id), sanitised as the module docstring says; returns nbgrader's log.

    nbgrader renders one notebook at a time (most of a second each for a lab here: nbconvert re-parses every page
    with BeautifulSoup), so `processes` nbgrader processes share the students out, each told to leave out every
    other student in course/autograded (student ids hold no commas: see pipeline.safe_id)."""
    shares = [share for share in (students[i::processes] for i in range(max(processes, 1))) if share]
    recorded = sorted(p.name for p in (course / "autograded").iterdir()) if (course / "autograded").exists() else []

    def render(share: list[str]) -> str:
        mine = set(share)
        others = ",".join(student for student in recorded if student not in mine)
        return run_nbgrader(course, ["generate_feedback", lab, "--force",
                                     f"--CourseDirectory.student_id_exclude={others}"], check=False).stderr

    with ThreadPoolExecutor(max_workers=max(len(shares), 1)) as pool:
        return "\n".join(pool.map(render, shares))


# What a rendered markdown cell may hold on a feedback page: the elements nbconvert's markdown renderer makes of
# the labs' and lessons' markdown (headings with anchors, lists, tables, code, <details>), nothing that acts.
FEEDBACK_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em", "h1", "h2",
    "h3", "h4", "h5", "h6", "hr", "i", "img", "input", "kbd", "li", "ol", "p", "pre", "s", "span", "strong",
    "sub", "summary", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
FEEDBACK_ATTRIBUTES = {
    "a": {"href", "title", "class"}, "img": {"src", "alt", "title"}, "input": {"type", "checked", "disabled"},
    "div": {"class"}, "span": {"class"}, "code": {"class"}, "pre": {"class"}, "th": {"style"}, "td": {"style"},
    **{f"h{level}": {"id"} for level in range(1, 7)}}
FEEDBACK_PROTOCOLS = frozenset({"http", "https", "mailto"})


def feedback_attribute(tag: str, name: str, value: str) -> bool:
    """Whether the attribute `name`="`value`" of a `tag` element may stay on a feedback page (bleach's callback;
    bleach itself then removes URLs whose scheme is not in FEEDBACK_PROTOCOLS)."""
    if name not in FEEDBACK_ATTRIBUTES.get(tag, ()):
        return False
    if name in ("href", "src"):
        # The template applies nbconvert's strip_files_prefix after this filter, and it would turn the harmless
        # relative "files/javascript:..." into "javascript:...": no such URL is kept.
        return not re.match(r"\s*/?files/", value, re.IGNORECASE)
    return name != "type" or value == "checkbox"  # a task list's box, never a text field or a button


def feedback_markdown(source: str) -> str:
    """Markdown `source` as HTML for a feedback page: nbconvert's own rendering (math left to MathJax, which
    nbconvert loads with its Safe extension), harmful link schemes refused, then bleach keeps only FEEDBACK_TAGS
    with the attributes feedback_attribute allows; any other tag is shown as text, so the instructor sees what
    was submitted. Registered as the template's `markdown2html` filter in nbgrader_config.py."""
    import bleach
    from bleach.css_sanitizer import CSSSanitizer
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    rendered = MarkdownWithMath(renderer=IPythonRenderer(escape=False, allow_harmful_protocols=False)).render(
        str(source))
    return bleach.clean(rendered, tags=FEEDBACK_TAGS, attributes=feedback_attribute, protocols=FEEDBACK_PROTOCOLS,
                        css_sanitizer=CSSSanitizer(allowed_css_properties=["text-align"]), strip=False,
                        strip_comments=True)


# Characters that mean something in markdown, written as backslash escapes; &, <, >, " and ' become entities.
MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|~$=^:@])")


def plain_text(text: object) -> str:
    """`text` (any value, often quoting a submission) with every control or format character (ANSI escapes,
    bidirectional overrides, NUL) written as a Python escape such as \\x1b, so that it shows as what it is;
    line breaks and tabs are kept."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co")
                   else ascii(ch)[1:-1] for ch in str(text))


def markdown_text(text: object) -> str:
    """`text` as markdown that renders as exactly these characters, on one line (it is one list item or one
    sentence of the grader's): markdown punctuation backslash-escaped, HTML's special characters as entities."""
    one_line = " ".join(plain_text(line) for line in str(text).splitlines())
    return html.escape(MARKDOWN_PUNCTUATION.sub(r"\\\1", one_line), quote=True)
