"""The course in a real browser: JupyterLab started by `make lab` on a temporary copy of the course, driven in
Debian's Chromium by Playwright (`make test-browser`; excluded from `make test` by the `browser` marker).

Checks: the URL `make lab` prints opens the start notebook (the course map) with no Jupyter-news prompt and a file
browser that lists course material only; every lesson runs to the end with Run All, and no output shows "Loading
widget", "Error displaying widget" or a widget's text repr; in lesson 02 a plotly figure is drawn, the quiz's
options are not cut, a quiz question answered wrong then right shows the matching feedback, and the step-through's
"next" changes the step shown and re-running shows a busy state; lesson 05's tree view redraws when its step slider
moves; a lab opened as a student fails its first visible test with the stub's NotImplementedError, passes it once a
solution is typed in, and nbgrader's Validate button reports; the benchmark's HTML report draws its charts with the
network off; the grader's feedback page for a submission that puts scripts everywhere runs none of them. After every
lesson was run and saved, `git status` in the copy is clean.
Screenshots of each check go to runs/browser-<UTC time>/ (or $SPECDEC_BROWSER_SHOTS).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from lab_server import REPO, LabServer, copy_course, git, start_lab

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
START = "00_start_here.ipynb"  # the course map: what `make lab` opens first
LESSONS = sorted(p.name for p in (REPO / "lessons").glob("[0-9][0-9]_*.ipynb") if p.name != START)
LESSON_02, LESSON_05 = "02_speculative_sampling.ipynb", "05_eagle.ipynb"
LAB = "labs/lab01_sampling/lab01_sampling.ipynb"
RUN_TIMEOUT_MS = 300_000  # one lesson's Run All on a busy 2-core machine
WIDGET_REPR = re.compile(r"\b[A-Z]\w*\((children|value|layout|description|options)=|<specdec_lab\.\w+.* object at ")
ran: set[str] = set()  # lessons run and saved in this session's copy


def plain_fragment(text: str) -> str:
    """A stretch of plain words from a feedback string (no HTML, no math), to look for on the page."""
    words = re.findall(r"[A-Za-z][A-Za-z ,'-]{11,}", re.sub(r"<[^>]+>|\$[^$]*\$", " ", text))
    return max(words, key=len).strip()


@pytest.fixture(scope="module")
def shots(request) -> Path:
    folder = Path(os.environ.get("SPECDEC_BROWSER_SHOTS")
                  or REPO / "runs" / f"browser-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    folder.mkdir(parents=True, exist_ok=True)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(f"\nbrowser screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    return copy_course(tmp_path_factory.mktemp("browser") / "specdec-lab")


@pytest.fixture(scope="module")
def server(course) -> LabServer:
    # Kernels leave a core to the browser. The course opens as a default install has it, without `make
    # production`'s engines (lesson 7 then says how to add them): their cells run headless in `make test`
    # (tests/test_lessons.py), and here they would only add minutes of engine start-up to the browser suite.
    absent = course.parent / "no-production-engines"
    server = start_lab(course, "lab", env={"OMP_NUM_THREADS": "1", "SPECDEC_LLAMACPP_HOME": str(absent / "llama.cpp"),
                                           "SPECDEC_VLLM_VENV": str(absent / "vllm-venv")})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM.exists(), "the browser suite drives Debian's chromium: apt-get install chromium (make test-browser)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, shots, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    page.screenshot(path=shots / f"end-{re.sub(r'[^A-Za-z0-9_.-]+', '_', request.node.name)}.png")
    context.close()


def open_notebook(page, server: LabServer, path: str):
    """Open `path` in a fresh workspace (?reset) and wait for its kernel to be idle."""
    page.goto(server.page(f"lab/tree/{path}", reset=""))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=120_000)
    deadline = time.monotonic() + 120
    while kernel_state(server, path) != "idle":  # the kernel has started and answered
        assert time.monotonic() < deadline, f"no idle kernel for {path}"
        time.sleep(0.5)
    page.locator(".jp-StatusBar-Widget", has_text=re.compile(r"\| Idle")).first.wait_for(timeout=120_000)
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook").first


def sessions(server: LabServer) -> list[dict]:
    """The server's notebook sessions (path, kernel id and state)."""
    with urllib.request.urlopen(server.page("api/sessions"), timeout=30) as response:
        return json.loads(response.read())


def kernel_state(server: LabServer, path: str) -> str | None:
    """The execution state of the kernel of the notebook at `path` (None before it has one)."""
    return next((s["kernel"]["execution_state"] for s in sessions(server) if s["path"].endswith(path)), None)


def menu(page, top: str, item: str) -> None:
    """Click a main-menu entry, e.g. menu(page, "Run", "Run All Cells")."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def run_all(page, notebook) -> None:
    """Run All Cells and wait until nothing is queued any more (JupyterLab stops the queue at an error)."""
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
                .map(p => p.textContent.trim());
            return prompts.length && /^\\[\\d+\\]:$/.test(prompts[0]) && !prompts.includes('[*]:');
        }""", timeout=RUN_TIMEOUT_MS, polling=500)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=RUN_TIMEOUT_MS)


def tracebacks(where):
    """The outputs under `where` that show a raised exception (JupyterLab draws them as stderr)."""
    return where.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]',
                         has_text="Traceback (most recent call last)")


def assert_ran_cleanly(page, notebook, name: str) -> None:
    """No cell raised, every code cell ran, every widget drew (no loading / error message, no text repr)."""
    from playwright.sync_api import expect

    errors = tracebacks(notebook)
    assert errors.count() == 0, f"{name}: a cell raised:\n{errors.first.inner_text()}"
    prompts = notebook.locator(".jp-CodeCell .jp-InputPrompt").evaluate_all("ps => ps.map(p => p.textContent)")
    assert prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts), f"{name}: not run: {prompts}"
    outputs = notebook.locator(".jp-OutputArea-output")
    expect(outputs.filter(has_text="Loading widget")).to_have_count(0, timeout=30_000)
    expect(outputs.filter(has_text="Error displaying widget")).to_have_count(0)
    text = "\n".join(outputs.evaluate_all("os => os.map(o => o.textContent)"))
    assert not WIDGET_REPR.search(text), f"{name}: a widget shows as text: {WIDGET_REPR.search(text).group(0)}"


def save_and_close(page, server: LabServer, path: str) -> None:
    """Save the notebook as a student would (File > Save), then shut its kernel down."""
    menu(page, "File", "Save Notebook")
    page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel .jp-mod-dirty')", timeout=30_000)
    for session in sessions(server):
        if session["path"].endswith(path):
            request = urllib.request.Request(server.page(f"api/kernels/{session['kernel']['id']}"), method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()
    ran.add(Path(path).name)


def mutation_seen(page, selector: str) -> None:
    """Start recording whether an element matching `selector` ever appears (read with `seen(page)`)."""
    page.evaluate("""selector => {
        window.__seen = false;
        new MutationObserver(() => { if (document.querySelector(selector)) window.__seen = true; })
            .observe(document.body, {subtree: true, childList: true, characterData: true});
    }""", selector)


def test_make_lab_opens_the_course_map_first(page, server, course, shots):
    from playwright.sync_api import expect

    (course / "specdec_lab.egg-info").mkdir(exist_ok=True)  # what `pip install -e .` leaves in a real checkout
    page.goto(server.url)  # exactly the address `make lab` printed, in a browser that never saw this server
    notebook = page.locator(".jp-NotebookPanel:visible .jp-Notebook").first
    expect(notebook.locator(".jp-RenderedMarkdown h1").first).to_contain_text("Start here", timeout=120_000)
    expect(page.locator(".lm-TabBar-tab.lm-mod-current").filter(has_text=START).first).to_be_visible()
    expect(notebook.locator("table").first).to_contain_text("Speculative sampling")
    expect(notebook.locator("a[href*='lab01_sampling.ipynb']").first).to_be_visible()
    names = page.locator(".jp-DirListing-item .jp-DirListing-itemText").all_inner_texts()
    assert START in names and "01_why_decoding_is_slow.ipynb" in names, names  # the browser is in lessons/
    assert not {"quizzes", "literature_figures.json"} & set(names), names
    page.wait_for_timeout(8_000)  # JupyterLab asks about news a few seconds after it starts, when it asks
    assert page.get_by_text("official Jupyter news").count() == 0
    page.screenshot(path=shots / "00-start-here.png", full_page=True)
    for session in sessions(server):  # the start notebook's kernel: not needed by the checks that follow
        if session["path"].endswith(START):
            request = urllib.request.Request(server.page(f"api/kernels/{session['kernel']['id']}"), method="DELETE")
            urllib.request.urlopen(request, timeout=30).close()
    # one level up, the repository root hides what is not course material
    page.locator(".jp-BreadCrumbs-home").first.click()
    expect(page.locator(".jp-DirListing-item .jp-DirListing-itemText", has_text="labs").first).to_be_visible()
    root = page.locator(".jp-DirListing-item .jp-DirListing-itemText").all_inner_texts()
    assert "lessons" in root and not {"specdec_lab.egg-info", "solutions", "autograder"} & set(root), root


def test_lesson_02_widgets_plots_quiz_and_step_through(page, server, shots):
    from playwright.sync_api import expect

    notebook = open_notebook(page, server, f"lessons/{LESSON_02}")
    run_all(page, notebook)
    assert_ran_cleanly(page, notebook, LESSON_02)
    page.screenshot(path=shots / "02-ran.png")

    plot = notebook.locator(".js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    expect(plot.locator(".main-svg").first).to_be_visible()
    assert plot.locator("g.trace").count() > 0, "the plotly figure has no marks"
    plot.screenshot(path=shots / "02-plotly.png")

    # the quiz: options whole, then a single-choice question answered wrong, then right
    bank = json.loads((REPO / "lessons" / "quizzes" / "02_speculative_sampling.json").read_text())
    quiz = notebook.locator(".specdec-quiz").first
    quiz.scroll_into_view_if_needed()
    cut = quiz.evaluate("""quiz => {
        const right = quiz.getBoundingClientRect().right + 1;
        return [...quiz.querySelectorAll('.widget-radio-box label, .widget-checkbox .widget-label-basic')]
            .filter(l => l.scrollWidth > l.clientWidth + 1 || l.getBoundingClientRect().right > right)
            .map(l => l.textContent);
    }""")
    assert cut == [], f"quiz options cut or past the cell edge: {cut}"
    number, question = next((n, q) for n, q in enumerate(bank["questions"]) if q["kind"] == "single")
    box = quiz.locator(":scope > .widget-vbox").nth(number)
    right = next(i for i, option in enumerate(question["options"]) if option["correct"])
    wrong = next(i for i, option in enumerate(question["options"]) if not option["correct"])
    for choice, verdict in ((wrong, "Not yet."), (right, "Correct.")):
        box.locator(".widget-radio-box label").nth(choice).click()
        box.get_by_role("button", name="check").click()
        feedback = box.locator(".widget-html").last
        expect(feedback).to_contain_text(verdict)
        expect(feedback).to_contain_text(plain_fragment(question["options"][choice]["feedback"]))
        box.screenshot(path=shots / f"02-quiz-{verdict.rstrip('.').lower().replace(' ', '-')}.png")

    # the step-through: labels whole, "next" moves on, a re-run shows that it is busy
    step_view = notebook.locator(".widget-html", has_text=re.compile(r"step 1 / \d+")).first
    step_view.scroll_into_view_if_needed()
    label = notebook.locator(".widget-label", has_text=re.compile("^temperature$")).first
    assert label.evaluate("l => l.scrollWidth <= l.clientWidth + 1"), "the temperature label is cut"
    total = re.search(r"step 1 / (\d+)", step_view.inner_text()).group(1)
    notebook.get_by_role("button", name="next ▶").first.click()
    expect(notebook.locator(".widget-html", has_text=f"step 2 / {total}").first).to_be_visible()
    page.screenshot(path=shots / "02-step-through-next.png")
    mutation_seen(page, ".specdec-busy")
    seed = notebook.locator(".widget-text", has=page.locator(".widget-label", has_text="seed")).locator("input").first
    seed.fill("7")
    seed.blur()  # a text box commits when it loses focus
    expect(notebook.locator(".widget-html", has_text=re.compile(r"step 1 / \d+")).first).to_be_visible(
        timeout=120_000)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    assert page.evaluate("window.__seen"), "no busy state was shown while the step-through re-ran"
    save_and_close(page, server, f"lessons/{LESSON_02}")


def test_lesson_05_tree_view_redraws_with_its_slider(page, server, shots):
    from playwright.sync_api import expect

    notebook = open_notebook(page, server, f"lessons/{LESSON_05}")
    run_all(page, notebook)
    assert_ran_cleanly(page, notebook, LESSON_05)
    view = notebook.locator(".widget-vbox", has=page.locator(".widget-dropdown")).filter(
        has=page.locator(".js-plotly-plot")).last  # the tree view: step slider, path drop-down, figure
    title = view.locator(".js-plotly-plot .gtitle", has_text=re.compile(r"^Step \d+:")).first
    title.scroll_into_view_if_needed()
    before = title.text_content()
    chosen = view.locator(".widget-dropdown select").first.evaluate("s => s.selectedIndex >= 0 ? s.value : ''")
    assert chosen != "", "the tree view's path drop-down is blank"
    page.screenshot(path=shots / "05-tree-before.png")
    handle = view.locator(".widget-slider .noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")
    expect(title).not_to_have_text(before, timeout=60_000)
    assert re.match(r"Step \d+:", title.text_content())
    page.screenshot(path=shots / "05-tree-after.png")
    save_and_close(page, server, f"lessons/{LESSON_05}")


@pytest.mark.parametrize("lesson", [name for name in LESSONS if name not in (LESSON_02, LESSON_05)])
def test_lesson_runs_and_draws_its_widgets(page, server, shots, lesson):
    notebook = open_notebook(page, server, f"lessons/{lesson}")
    run_all(page, notebook)
    assert_ran_cleanly(page, notebook, lesson)
    page.screenshot(path=shots / f"{lesson[:2]}-ran.png", full_page=True)
    save_and_close(page, server, f"lessons/{lesson}")


def solution_of(grade_id: str) -> str:
    """The instructors' solution of a lab cell, without nbgrader's markers."""
    import nbformat

    source = nbformat.read(REPO / LAB.replace("labs/", "solutions/"), as_version=4)
    cell = next(c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(line for line in cell.source.splitlines() if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line)


def test_lab_as_a_student(page, server, course, shots):
    from playwright.sync_api import expect

    notebook = open_notebook(page, server, LAB)
    run_all(page, notebook)  # stops at the first visible test: the stub raises
    cells = notebook.locator(".jp-Cell")
    # The first exercise, found in the file: JupyterLab does not lay out cells outside the view, so their text
    # cannot be searched on the page.
    stored = json.loads((course / LAB).read_text())["cells"]
    index = next(i for i, cell in enumerate(stored)
                 if cell["cell_type"] == "code" and "raise NotImplementedError()" in "".join(cell["source"]))
    stub, test = cells.nth(index), cells.nth(index + 1)
    test.scroll_into_view_if_needed()
    expect(tracebacks(test)).to_contain_text("NotImplementedError")
    test.screenshot(path=shots / "lab-visible-test-fails.png")

    grade_id = stored[index]["metadata"]["nbgrader"]["grade_id"]
    stub.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(solution_of(grade_id))
    page.keyboard.press("Shift+Enter")  # run the solution, move to its test
    page.keyboard.press("Shift+Enter")  # run the visible test
    expect(test.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]:"), timeout=60_000)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
    assert tracebacks(test).count() == 0
    assert test.locator(".jp-OutputArea-output").count() >= 1
    test.screenshot(path=shots / "lab-visible-test-passes.png")

    menu(page, "File", "Save Notebook")
    page.get_by_role("button", name="Validate").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible(timeout=180_000)
    expect(dialog).not_to_contain_text("Validating", timeout=180_000)
    report = dialog.inner_text()
    # it reports the exercises still stubbed, not the one solved above
    assert "The following cell failed" in report and "NotImplementedError" in report, report
    assert test.locator(".cm-content").inner_text().strip().splitlines()[-1] not in report, report
    dialog.screenshot(path=shots / "lab-validate.png")
    page.keyboard.press("Escape")
    git("checkout", "--", LAB, cwd=course)  # leave the copy as the lessons left it


def test_bench_report_draws_its_charts_offline(browser, llama_factory, tmp_path, shots):
    from playwright.sync_api import expect
    from transformers import AutoTokenizer

    from specdec_lab.cli import main
    from specdec_lab.models import zoo_path

    tokenizer = AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))
    for name, seed, layers in (("target", 0, 2), ("draft", 1, 1)):
        model = llama_factory(vocab_size=len(tokenizer), hidden_size=32, num_layers=layers, seed=seed,
                              max_positions=1024, logit_scale=4.0)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    report = tmp_path / "bench.html"
    main(["bench", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompts", "2",
          "--max-new-tokens", "8", "--repeats", "1", "--threads", "1", "--html", str(report)])

    context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    requests = []
    context.route(re.compile(r"^https?://"), lambda route: (requests.append(route.request.url), route.abort()))
    page = context.new_page()
    page.set_default_timeout(120_000)  # the page inlines plotly.js (several MB): slow to parse on a busy machine
    page.goto(report.as_uri(), wait_until="domcontentloaded")
    charts = page.locator(".js-plotly-plot")
    expect(charts).to_have_count(4, timeout=120_000)
    for n in range(4):
        chart = charts.nth(n)
        chart.scroll_into_view_if_needed()
        assert chart.locator("g.trace").count() > 0, f"chart {n + 1} drew nothing"
    page.screenshot(path=shots / "bench-report-offline.png", full_page=True)
    context.close()
    assert requests == [], f"the report fetched from the network: {requests}"


def test_feedback_page_runs_no_script_from_a_submission(browser, tmp_path, shots):
    """The feedback page nbgrader made for a submission with scripts, handlers and javascript: links in its
    markdown, raw cells, code, outputs, grade ids and file name (tests/test_autograder_feedback.py) is opened
    offline: no alert, no global set, the title unchanged, no frame, and clicking its links runs nothing; the
    same payload on a bare page does run, so the probe can see a script that ran."""
    from test_autograder_feedback import HOSTILE_HTML, LAB, hostile_feedback

    feedback = hostile_feedback(tmp_path)["hostile"]
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    context.route(re.compile(r"^https?://"), lambda route: route.abort())  # MathJax's CDN: not reachable
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    ran = "() => [typeof window.pwned, String(window.pwned), document.title, window.frames.length]"

    page.set_content(f"<title>bare</title>{HOSTILE_HTML}")
    page.wait_for_timeout(500)
    kind, _, title, _ = page.evaluate(ran)
    assert (kind, title) == ("number", "pwned") and dialogs, "the payload runs on a bare page"
    dialogs.clear()

    page.goto(feedback.as_uri(), wait_until="load")
    page.wait_for_timeout(1000)  # onload, onerror and ontoggle handlers would have fired by now
    assert page.get_by_text("[grader] FAILED (0 points): expected [1, 2], got").first.is_visible()
    assert page.get_by_text('document.title = "pwned"').first.is_visible(), "the student's markdown, as text"
    for label in ("md link", "html link", "obfuscated link", "ref link", "files link"):
        link = page.locator("#notebook-container a", has_text=label).first
        link.scroll_into_view_if_needed()
        link.click()
    page.wait_for_timeout(500)
    page.screenshot(path=shots / "feedback-hostile-submission.png", full_page=True)
    assert page.evaluate(ran) == ["undefined", "undefined", LAB, 0], "a script from the submission ran"
    assert dialogs == [], f"the page opened dialogs: {dialogs}"
    assert page.url.startswith(feedback.as_uri()), f"a link led away to {page.url}"
    context.close()


def test_running_every_lesson_left_the_copy_clean(course):
    assert ran == set(LESSONS), f"lessons not run in this session: {sorted(set(LESSONS) - ran)}"
    time.sleep(1)  # the last save is on disk
    assert git("status", "--porcelain", "--untracked-files=all", cwd=course) == ""
