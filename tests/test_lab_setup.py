"""`make lab` as students meet it: it starts for anyone (root included) on loopback with a token and prints the
URL, the student's JupyterLab has nbgrader's instructor tools off (`make instructor` has them on), and saving a
run of the course never dirties the checkout or blocks `git pull` (specdec_lab/course_files.py). Each test works
on a temporary copy of the course, never on this checkout. (The browser suite saves real runs the same way.)"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

import nbformat
import pytest
from lab_server import copy_course, git, start_lab

from specdec_lab.course_files import is_course_notebook, keep_kernel_metadata, strip_run

INSTRUCTOR_PLUGINS = ["@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader",
                      "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:menu"]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return copy_course(tmp_path_factory.mktemp("course") / "specdec-lab")


@pytest.fixture(scope="module")
def server(course):
    server = start_lab(course, "lab")
    yield server
    server.stop()


def fetch(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
    """(status, body) of a request (a JSON body for PUT), errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def disabled_plugins(page: str) -> dict:
    """The `disabledExtensions` of the page config JupyterLab embeds in its HTML page."""
    config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    disabled = json.loads(config.group(1))["disabledExtensions"]
    return dict.fromkeys(disabled, True) if isinstance(disabled, list) else disabled


def test_make_lab_prints_a_url_that_serves_the_lessons(server):
    log = server.log.read_text()
    assert server.url.startswith("http://127.0.0.1:")
    assert "/lab/tree/lessons/00_start_here.ipynb?token=" in server.url  # the course map opens first
    assert f"Or copy and paste one of these URLs:\n        {server.url}" in log
    if os.geteuid() == 0:
        assert "--allow-root" in log  # what lets JupyterLab start as root; the URL proves it started
    status, page = fetch(server.url)
    assert status == 200 and "JupyterLab" in page
    status, listing = fetch(server.page("api/contents/lessons"))
    names = {item["name"] for item in json.loads(listing)["content"]}
    assert status == 200 and {"01_why_decoding_is_slow.ipynb", "02_speculative_sampling.ipynb"} <= names
    assert fetch(f"{server.base}/api/contents/lessons")[0] == 403  # no token, no access
    # the student's JupyterLab: nbgrader's instructor tools are off, validate and the assignment list stay on
    off = disabled_plugins(page)
    assert all(off.get(plugin) for plugin in INSTRUCTOR_PLUGINS)
    assert not off.get("@jupyter/nbgrader:validate-assignment")
    assert not off.get("@jupyter/nbgrader:assignment-list")
    assert fetch(server.page("formgrader"))[0] == 404


def test_the_students_file_browser_shows_course_material_only(server, course):
    (course / "specdec_lab.egg-info").mkdir(exist_ok=True)  # what `pip install -e .` leaves in a real checkout
    status, listing = fetch(server.page("api/contents"))
    top = {item["name"] for item in json.loads(listing)["content"]}
    assert status == 200 and {"lessons", "labs", "README.md"} <= top
    assert not top & {"specdec_lab.egg-info", "solutions", "autograder", "runs"}
    lessons = {item["name"] for item in json.loads(fetch(server.page("api/contents/lessons"))[1])["content"]}
    assert "00_start_here.ipynb" in lessons and "quizzes" not in lessons and "literature_figures.json" not in lessons
    # hidden from the listing only: the lessons still read their question banks
    assert fetch(server.page("api/contents/lessons/quizzes/01_why_decoding_is_slow.json"))[0] == 200


def test_jupyterlab_asks_nothing_about_news(server):
    status, body = fetch(server.page("lab/api/settings/@jupyterlab/apputils-extension:notification"))
    assert status == 200
    settings = json.loads(body)
    assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"  # no "get notified" prompt
    assert settings["schema"]["properties"]["checkForUpdates"]["default"] is False


def test_make_instructor_turns_the_instructor_tools_on(course):
    server = start_lab(course, "instructor")
    try:
        status, page = fetch(server.url)
        assert status == 200
        off = disabled_plugins(page)
        assert not any(off.get(plugin) for plugin in INSTRUCTOR_PLUGINS)
        assert fetch(server.page("formgrader"))[0] != 404
    finally:
        server.stop()


def run_like_jupyter(notebook: dict) -> dict:
    """What JupyterLab sends when it saves a run notebook: outputs, counts, widget state, full kernel details."""
    notebook = json.loads(json.dumps(notebook))
    for count, cell in enumerate((c for c in notebook["cells"] if c["cell_type"] == "code"), 1):
        cell["execution_count"] = count
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"},
                           {"output_type": "display_data", "data": {"text/plain": "VBox()"}, "metadata": {}}]
        cell["metadata"].update(scrolled=True, execution={"iopub.status.idle": "2026-01-01T00:00:00Z"},
                                jupyter={"outputs_hidden": False})
    notebook["metadata"]["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "mimetype": "text/x-python",
        "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3", "version": "3.11.2"}
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    notebook["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"  # the running kernel's own name
    return notebook


def load(server, path: str) -> dict:
    """The notebook at `path` as the server hands it to JupyterLab (cell sources as single strings)."""
    status, body = fetch(server.page(f"api/contents/{path}"))
    assert status == 200, body
    return json.loads(body)["content"]


def save(server, path: str, notebook: dict) -> dict:
    """Save `notebook` at `path` through the server's contents API, as JupyterLab's save does."""
    status, body = fetch(server.page(f"api/contents/{path}"), "PUT",
                         {"type": "notebook", "format": "json", "content": notebook})
    assert status in (200, 201), body
    return json.loads(body)


def test_strip_run_removes_exactly_what_a_run_adds(course):
    path = course / "lessons" / "02_speculative_sampling.ipynb"
    original = json.loads(path.read_text())
    assert keep_kernel_metadata(strip_run(run_like_jupyter(original)), original) == strip_run(original) == original
    edited = json.loads(json.dumps(original))
    edited["cells"][1]["source"] = "print('my own line')"
    assert strip_run(edited) != strip_run(original)  # what a person writes is kept
    assert is_course_notebook("/lessons/02.ipynb") and is_course_notebook("labs/lab01/lab01.ipynb")
    assert not is_course_notebook("scratch.ipynb") and not is_course_notebook("lessons/quizzes/02.json")


def test_saving_runs_leaves_git_clean_and_pull_working(server, course, tmp_path):
    upstream = tmp_path / "upstream"
    git("clone", "-q", str(course), str(upstream), cwd=tmp_path)
    lessons = sorted(f"lessons/{p.name}" for p in (course / "lessons").glob("*.ipynb"))
    for path in lessons:  # every lesson, saved after a run, including the hand-formatted ones
        save(server, path, run_like_jupyter(load(server, path)))
    assert git("status", "--porcelain", cwd=course) == ""

    # a student's own work in a lab is saved, its outputs are not
    lab = "labs/lab01_sampling/lab01_sampling.ipynb"
    notebook = run_like_jupyter(load(server, lab))
    notebook["cells"][1]["source"] = "# my answer"
    save(server, lab, notebook)
    saved = nbformat.read(course / lab, as_version=4)
    assert saved.cells[1].source == "# my answer"
    assert all(c.outputs == [] and c.execution_count is None for c in saved.cells if c.cell_type == "code")
    assert git("status", "--porcelain", cwd=course) == f" M {lab}\n"
    git("checkout", "--", lab, cwd=course)

    # a notebook of the student's own, outside the course folders, keeps its outputs
    with_code = next(p for p in lessons if '"cell_type": "code"' in (course / p).read_text())
    scratch = run_like_jupyter(json.loads((course / with_code).read_text()))
    save(server, "scratch.ipynb", scratch)
    assert "ran" in (course / "scratch.ipynb").read_text()
    (course / "scratch.ipynb").unlink()

    # the course moves on upstream; the student's checkout still pulls
    notebook = nbformat.read(upstream / lessons[1], as_version=4)
    notebook.cells[0].source += "\n\nA course update."
    nbformat.write(notebook, upstream / lessons[1])
    git("commit", "-q", "-am", "update a lesson", cwd=upstream)
    git("pull", "-q", "--no-rebase", str(upstream), "main", cwd=course)
    assert "A course update." in (course / lessons[1]).read_text()
    assert git("status", "--porcelain", cwd=course) == ""
