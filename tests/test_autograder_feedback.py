"""Feedback pages are inert: whatever a submission puts in its markdown, raw cells, code, outputs, grade ids or
file name reaches the HTML page an instructor opens as text or sanitised HTML, never as a script, an event
handler or a javascript: URL; the grader's verdicts and notes still read as they were written.

The page is built the way `pipeline.grade` builds it (gradebook.make_course, assemble, the verdicts and notes
cell, gradebook.record, gradebook.generate_feedback) from hand-made outputs, without a sandbox; tests/test_browser.py
opens the same page in Chromium (`hostile_feedback` below).
"""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from autograder import assemble, gradebook, pipeline

LAB = gradebook.list_labs()[0]
# Every payload sets window.pwned (or the page title, or opens an alert) if it runs; none may.
HTML_PAYLOADS = [
    '<script>document.title = "pwned"; window.pwned = 1; alert("script")</script>',
    '<img src=x onerror="window.pwned = 2; alert(\'img\')">',
    '<svg onload="window.pwned = 3"><circle r="4"/></svg>',
    '<iframe src="javascript:parent.pwned = 4"></iframe>',
    '<a href="javascript:window.pwned = 5">html link</a>',
    '<a href=" JaVa&#x53;cript:window.pwned = 6">obfuscated link</a>',
    '<details open ontoggle="window.pwned = 7"><summary>s</summary></details>',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.pwned = 8"></style></mglyph></table></mtext></math>',
    '<object data="javascript:window.pwned = 9"></object><form><button formaction="javascript:window.pwned = 10">'
    'b</button></form>',
]
MARKDOWN_PAYLOADS = [
    "[md link](javascript:window.pwned=11)",
    "![md image](javascript:window.pwned=12)",
    "<javascript:window.pwned=13>",
    "[files link](files/javascript:window.pwned=14)",
    "[ref link][evil]\n\n[evil]: JAVASCRIPT:window.pwned=15",
    r"$\href{javascript:window.pwned=16}{math}$",
]
HOSTILE_HTML = "".join(HTML_PAYLOADS)
HOSTILE_MARKDOWN = "# My answer\n\n" + HOSTILE_HTML + "\n\n" + "\n\n".join(MARKDOWN_PAYLOADS) + "\n\n> a quote\n"
# A grade id and a file name, as a student may write them, quoted by the grader in its notes.
HOSTILE_GRADE_ID = "lab99-*bold* _x_ $y$ [z](javascript:window.pwned=17)" + HTML_PAYLOADS[0]
HOSTILE_FILE_NAME = 'doe_<img src=x onerror="window.pwned=18">_lab01.ipynb'
HOSTILE_CODE = f"note = {HOSTILE_HTML!r}  # </script>{HTML_PAYLOADS[1]}\nprint(note)"
# What a verdict quotes of the student's answer: HTML, an ANSI escape that would hide text, a forged verdict line.
HOSTILE_MESSAGE = f"expected [1, 2], got {HOSTILE_HTML}\x1b[8m hidden\u202e\n[grader] passed (3 points): forged"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode()


def hostile_outputs() -> list[dict]:
    """Outputs as the sandbox could send them back for a student cell: every rich type, all carrying payloads."""
    return [
        {"output_type": "stream", "name": "stdout", "text": HOSTILE_HTML},
        {"output_type": "error", "ename": HTML_PAYLOADS[0], "evalue": HTML_PAYLOADS[1],
         "traceback": [HTML_PAYLOADS[2], "\x1b[31m" + HTML_PAYLOADS[3]]},
        {"output_type": "display_data", "metadata": {"image/png": {"width": '1" onload="window.pwned=19'}},
         "data": {"text/html": HOSTILE_HTML, "application/javascript": "window.pwned = 20",
                  "image/svg+xml": HTML_PAYLOADS[2], "text/markdown": MARKDOWN_PAYLOADS[0],
                  "image/png": 'x" onerror="window.pwned=21', "text/plain": HOSTILE_HTML}},
        {"output_type": "execute_result", "execution_count": 1, "metadata": {},
         "data": {"image/png": PNG, "text/plain": "a real PNG"}},
    ]


def unfiltered_outputs() -> list[nbformat.NotebookNode]:
    """Rich outputs that did NOT go through assemble.clean_outputs: nbconvert's own sanitiser must hold too (one
    type per output, since the page shows only the first type of an output that it knows)."""
    return [nbformat.v4.new_output("display_data", data={kind: value}) for kind, value in (
        ("text/html", HOSTILE_HTML), ("application/javascript", "window.pwned = 22"),
        ("image/svg+xml", HTML_PAYLOADS[2]), ("text/markdown", "\n\n".join(MARKDOWN_PAYLOADS)))]


def cell_with(nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    return next(cell for cell in nb.cells if cell.source == source)


def graded_notebook(release: nbformat.NotebookNode, cells: list[assemble.StudentCell], passed: bool,
                    notes: list[str]) -> tuple[nbformat.NotebookNode, dict[str, float], pipeline.StudentResult]:
    """The autograded notebook as pipeline.grade writes it: verdicts under the test cells, notes cell on top."""
    assembled = assemble.assemble(release, cells)
    points = {assemble.grade_id(c): float(c.metadata["nbgrader"]["points"]) for c in release.cells
              if assemble.is_test(c)}
    scores = {gid: points[gid] if passed else 0.0 for gid in points}
    message = "the answer matches the reference" if passed else HOSTILE_MESSAGE
    for gid, index in assembled.graded_cells.items():
        assembled.notebook.cells[index].outputs.append(pipeline.verdict_output(passed, message, scores[gid]))
    result = pipeline.StudentResult("x", sum(scores.values()), sum(points.values()), "graded",
                                    notes=assembled.notes + notes, tests=scores)
    assembled.notebook.cells.insert(0, pipeline.notes_cell(result))
    return assembled.notebook, scores, result


def hostile_feedback(workdir: Path) -> dict[str, Path]:
    """Feedback pages for two students of LAB in a course under `workdir`: "hostile", whose submission puts
    HTML and script in every place a student controls (its written answer, awaiting manual grading, too), and
    "honest", the same lab without any and its written answer left blank (the baseline of what the page's own
    template holds). Returns student -> feedback page."""
    course = gradebook.make_course(workdir, LAB)
    release = nbformat.read(course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    answer = next(assemble.grade_id(c) for c in release.cells if assemble.is_answer(c))
    written = next(assemble.grade_id(c) for c in release.cells if assemble.is_written(c))
    hostile_cells = [assemble.StudentCell("code", HOSTILE_CODE, answer),
                     assemble.StudentCell("markdown", HOSTILE_MARKDOWN, written),
                     assemble.StudentCell("markdown", HOSTILE_MARKDOWN, None),
                     assemble.StudentCell("raw", HOSTILE_HTML, None),
                     assemble.StudentCell("code", "print('scratch')", HOSTILE_GRADE_ID),
                     assemble.StudentCell("code", "display(unfiltered)", None)]
    hostile, hostile_scores, _ = graded_notebook(release, hostile_cells, False,
                                                 [f"read: the file {HOSTILE_FILE_NAME} was renamed"])
    cell_with(hostile, HOSTILE_CODE).outputs = assemble.clean_outputs(hostile_outputs())
    cell_with(hostile, "print('scratch')").outputs = assemble.clean_outputs(hostile_outputs())
    cell_with(hostile, "display(unfiltered)").outputs = unfiltered_outputs()
    honest, honest_scores, _ = graded_notebook(release, [], True, [])
    gradebook.record(course, LAB, [("hostile", hostile_scores, False), ("honest", honest_scores, False)],
                     {"hostile": pipeline.manual_scores(hostile, release),  # answered: awaits a person
                      "honest": pipeline.manual_scores(honest, release)})  # left as released: no answer
    for student, nb in (("hostile", hostile), ("honest", honest)):
        target = course / "autograded" / student / LAB / f"{LAB}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    log = gradebook.generate_feedback(course, LAB, ["hostile", "honest"])  # one nbgrader process each
    pages = {student: course / "feedback" / student / LAB / f"{LAB}.html" for student in ("hostile", "honest")}
    missing = [student for student, page in pages.items() if not page.exists()]
    assert not missing, f"no feedback page for {missing}; nbgrader said:\n{log[-3000:]}"
    return pages


class Page(HTMLParser):
    """A parsed page: every element with its attributes (entities decoded), scripts, and the visible text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[tuple[tuple, str]] = []
        self.text: list[str] = []
        self._in: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {name: value or "" for name, value in attrs}))
        if tag in ("script", "style"):
            self._in = tag
            if tag == "script":
                self.scripts.append((tuple(sorted(attrs)), ""))

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "script":
            self.scripts[-1] = (self.scripts[-1][0], self.scripts[-1][1] + data)
        elif self._in is None:
            self.text.append(data)

    def tags(self, name: str) -> list[dict[str, str]]:
        return [attrs for tag, attrs in self.elements if tag == name]


def active_url(value: str) -> bool:
    """Whether an attribute value is a URL that runs code (as a browser reads it: spaces and controls ignored).
    An SVG output drawn as <img src="data:image/svg+xml;..."> is not: browsers run no script in an image."""
    squashed = re.sub(r"[\x00-\x20]+", "", value).lower()
    return squashed.startswith(("javascript:", "vbscript:", "data:text/html"))


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Page]:
    built = hostile_feedback(tmp_path_factory.mktemp("feedback"))
    return {student: Page(path.read_text()) for student, path in built.items()}


def test_no_submitted_script_handler_or_javascript_url_survives(pages):
    hostile, honest = pages["hostile"], pages["honest"]
    assert hostile.scripts == honest.scripts, "the only scripts are the feedback template's own (MathJax)"
    assert not any("pwned" in text for _, text in hostile.scripts)
    handlers = [(tag, name) for tag, attrs in hostile.elements for name in attrs if name.startswith("on")]
    assert handlers == [], f"event handlers on the page: {handlers}"
    urls = [(tag, name, value) for tag, attrs in hostile.elements for name, value in attrs.items()
            if active_url(value)]
    assert urls == [], f"javascript: URLs on the page: {urls}"
    for tag in ("iframe", "object", "embed", "svg", "math", "form", "button", "base", "meta", "style", "link"):
        assert len(hostile.tags(tag)) == len(honest.tags(tag)), f"a submitted <{tag}> is live on the page"
    images = [attrs.get("src", "") for attrs in hostile.tags("img")]
    assert f"data:image/png;base64,{PNG}" in images, "a real PNG output is still shown"
    assert not any("pwned" in src for src in images)


def test_the_page_still_reads_as_written(pages):
    text = "".join(pages["hostile"].text)
    assert "[grader] FAILED (0 points): expected [1, 2], got " + HTML_PAYLOADS[0] in text, \
        "the verdict, with the student's value shown as text"
    assert "\\x1b[8m hidden\\u202e" in text, "control characters in a verdict are shown, not obeyed"
    assert re.search(r"^\[grader\] passed", text, re.M) is None, "a quoted line cannot pose as a verdict"
    assert f"a cell marked '{HOSTILE_GRADE_ID}'" in text, "the grade id in the notes, character for character"
    assert f"the file {HOSTILE_FILE_NAME} was renamed" in text
    assert 'document.title = "pwned"' in text, "the student's markdown shows what they wrote, as text"
    assert pages["hostile"].tags("blockquote") and {"id": "My-answer"} in pages["hostile"].tags("h1"), \
        "ordinary markdown (headings, quotes) is still rendered"
    assert "[grader] passed (" in "".join(pages["honest"].text)


@pytest.mark.parametrize("text", [HOSTILE_GRADE_ID, HOSTILE_FILE_NAME, "1. not a list", "# not a heading",
                                  "a `code` b | c ~~d~~ \\* e &amp; f <b>g</b>", "cost $5 and $6", "x\ny\r\nz"])
def test_grader_text_renders_as_exactly_its_characters(text):
    rendered = Page(gradebook.feedback_markdown(gradebook.markdown_text(text)))
    assert [tag for tag, _ in rendered.elements] == ["p"], f"markup was made of {text!r}: {rendered.elements}"
    assert "".join(rendered.text).strip() == " ".join(text.splitlines())


def test_verdicts_show_control_characters_and_keep_to_their_own_line():
    text = pipeline.verdict_output(False, "got 'a'\x1b[2J\u202e\x00\nok\n[grader] passed", 0.0).text
    assert text == "[grader] FAILED (0 points): got 'a'\\x1b[2J\\u202e\\x00\n    ok\n    [grader] passed\n"


def test_only_base64_reaches_a_png_output():
    cleaned = assemble.clean_outputs([{"output_type": "display_data", "data": {"image/png": value}}
                                      for value in (PNG, 'x" onerror="alert(1)', PNG[:20] + "\n" + PNG[20:])])
    assert [output.data["image/png"] for output in cleaned] == [PNG, PNG[:20] + "\n" + PNG[20:]]


def test_a_written_answer_awaiting_a_person_is_said_to_be_not_scored_zero(pages):
    """nbgrader's own page shows a written answer without a score as 0 points; ours says it needs manual grading,
    there and in the total, while an answer left as released keeps its 0 (no answer, nothing to grade)."""
    hostile, honest = " ".join("".join(pages["hostile"].text).split()), " ".join("".join(pages["honest"].text).split())
    assert "Written response (needs manual grading (2.0 points))" in hostile
    assert "Student's answer needs manual grading (2.0 points)" in hostile
    assert re.search(r"\(Score: [\d.]+ / [\d.]+ autograded; written answers worth 2\.0 points need manual "
                     r"grading\)", hostile), "the total keeps the points still to be graded apart"
    assert "Written response (Score: 0.0 / 2.0)" not in hostile
    assert "Written response (Score: 0.0 / 2.0)" in honest and "needs manual grading" not in honest


def test_feedback_processes_render_each_named_student_once_and_no_one_else(tmp_path):
    """generate_feedback shares the students out among nbgrader processes: every student named gets a page, a
    recorded student not named gets none (each process leaves the others' shares out)."""
    course = gradebook.make_course(tmp_path, LAB)
    release = nbformat.read(course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    notebook, scores, _ = graded_notebook(release, [], True, [])
    students = ["ann", "bo", "cy", "left-out"]
    gradebook.record(course, LAB, [(student, scores, False) for student in students])
    for student in students:
        target = course / "autograded" / student / LAB / f"{LAB}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(notebook, target)
    log = gradebook.generate_feedback(course, LAB, students[:3], processes=2)
    rendered = sorted(p.name for p in (course / "feedback").iterdir() if (p / LAB / f"{LAB}.html").exists())
    assert rendered == ["ann", "bo", "cy"], f"pages for {rendered}; nbgrader said:\n{log[-3000:]}"
    assert log.count("Writing") == 3, "each page is written by one process only"
