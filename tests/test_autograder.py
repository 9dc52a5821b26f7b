"""The autograder: simulated classes graded end to end (sandbox, trusted checks, nbgrader's gradebook and
feedback), the lenient assembly of submitted files, the lab rules as warnings, and bad input.

The end-to-end tests are slow (every notebook runs in its own sandboxed kernel): a lab's fixtures are graded
in ONE batch, which is also what shows that no submission changes anyone else's grade. Attacks on the kernel
itself (loops, exits, floods, bombs, killing processes, reading the disk, patching the probes) and the intake's
cases (edited or deleted cells, pasted helpers, odd metadata) do not depend on the lab, so they run in lab 1's
batch. `make test` grades a representative batch of every lab: the solution, a blank, the lab's own attacks,
objects that lie to its checks, its first classic mistake and two broken files; lab 1's batch also holds every
lab-independent attack, intake case and honest habit, and the files that once stopped a class. The whole classes
(every classic mistake and honest habit of every lab) are marked `whole_class` and run under `make test-grading`,
which keeps the suite within its time on 2 cores.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import re
import resource
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import assemble, fixtures, gradebook, pipeline
from specdec_lab import lab_rules

LIMITS = pipeline.Limits(cell_timeout=60, memory_bytes=3 << 30, cpu_seconds=300)
# Lab 1's cells run in a few seconds; its batch holds the infinite loop, which waits out the whole cell limit.
LAB01_LIMITS = dataclasses.replace(LIMITS, cell_timeout=30)
# Attacks that do not depend on the lab run in lab 1's batch only (they take the most time).
LAB_INDEPENDENT_ATTACKS = {"infinite_loop", "sys_exit", "raise_system_exit", "os_exit", "stdout_flood",
                           "memory_bomb", "fork_bomb", "kills_grader", "reads_solutions", "interpreter_tricks",
                           "patches_probes", "monkeypatch_module", "writes_gradebook",
                           "forges_channel", "cpu_hogs", "disk_filler", "huge_shape", "big_saved_outputs"}
LABS = pipeline.list_labs()


def release_of(lab: str) -> nbformat.NotebookNode:
    """The committed student version (tests/test_labs.py checks it equals a fresh nbgrader generation)."""
    return nbformat.read(pipeline.LABS / lab / f"{lab}.ipynb", as_version=4)


def student(name: str) -> str:
    return name.replace("_", "-")


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("lab", LABS)
def test_every_test_cell_has_a_trusted_check(lab):
    release = release_of(lab)
    tests = {assemble.grade_id(c) for c in release.cells if assemble.is_test(c)}
    assert tests == set(pipeline.lab_checks(lab)), "every test cell needs a check in autograder/checks/"
    hidden = [c for c in release.cells if assemble.is_test(c) and "hidden" in assemble.grade_id(c)]
    assert hidden and all("run here when your lab is graded" in c.source for c in hidden)


@pytest.mark.parametrize("lab", LABS)
def test_reference_passes_its_own_checks_and_a_wrong_answer_fails(lab, monkeypatch):
    """The probes, run here on the reference's namespace, give answers that every check accepts, also when four
    threads judge at once (as the grader's workers do: reference helpers seed torch's global generator, so
    unsynchronised judges once built different models than their seeds say and failed the reference). On
    garbage the judges fail with a message. This is the checker alone, without a sandbox."""
    import importlib
    from concurrent.futures import ThreadPoolExecutor

    from autograder.checks._common import NO_ANSWER, judge

    monkeypatch.syspath_prepend(str(pipeline.AUTOGRADER / "sandbox" / "inside"))
    probes = importlib.import_module(f"probes.{lab.split('_')[0]}")
    ref, checks = pipeline.reference(lab), pipeline.lab_checks(lab)
    inputs = pipeline.check_inputs(lab, seed=5, student="solution")
    answers = {gid: call_here(probes, check, inputs[gid], ref) for gid, check in checks.items()}
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(lambda gid: (gid, pipeline.judged(checks[gid], inputs[gid], answers[gid], ref)),
                                 [gid for _ in range(2) for gid in checks]))
    assert [(gid, v.message) for gid, v in verdicts if not v.passed] == []
    for gid, check in checks.items():
        verdict = judge(check, inputs[gid], {"error": "NotImplementedError"}, ref)
        assert not verdict.passed and "NotImplementedError" in verdict.message, gid
        verdict = judge(check, inputs[gid], NO_ANSWER, ref)
        assert not verdict.passed and "no answer came back" in verdict.message, gid


class LocalChannel:
    """A served model's channel without a sandbox: its forwards go straight to the trusted side's server."""

    def __init__(self, server):
        self.server = server

    def request(self, message: dict) -> dict:
        return json.loads(json.dumps(self.server.forward(message["forward"])))


def call_here(probes, check, inputs: dict, ref: dict):
    """One check's call made in this process on the reference namespace, as the sandbox would make it: without
    the secret inputs, with the served models answered (and counted) here; the answer as JSON round-trips it."""
    import specdec_probe

    from autograder.sandbox.session import ModelServer

    server = ModelServer(check.serve(inputs, ref)) if check.serve else None
    public = {k: v for k, v in inputs.items() if k != "secret"}
    if server is not None:
        public["served"] = server.public()
        specdec_probe.CHANNEL = LocalChannel(server)
    try:
        answer = json.loads(json.dumps(getattr(probes, check.probe)(ref, public)))
    finally:
        specdec_probe.CHANNEL = None
    if server is not None:
        inputs["measured"] = {"forwards": server.log}
    return answer


def test_lab_rules_warn_without_flagging_honest_code():
    honest = ("from __future__ import annotations\nimport math\n\nout = torch.zeros(2, 3)\n"
              "out[0, int(torch.argmax(x))] = 1.0\np, q = 1, 2\ncounts, alpha = [0], 0.5\n"
              "dec.tokens += [3]\n\n\n@dataclass\nclass Mine:\n    n: int = 0\n\n\nm = Mine()\nm.n = 3\n")
    assert lab_rules.check_cell(honest, provided={"verify", "start"}) == []
    cheating = ("import specdec_lab.sampling\ntorch.allclose = None\nt = torch\nt.nn.functional.x = 1\n"
                "def verify(*a):\n    pass\nimport sys\nsys.exit(0)\n")
    messages = " ".join(w.message for w in lab_rules.check_cell(cheating, provided={"verify"}))
    for expected in ["imports specdec_lab", "patches the library: `torch.allclose", "`t.nn.functional.x",
                     "redefines `verify`", "sys.exit()"]:
        assert expected in messages, (expected, messages)


def write_notebook(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nb.ipynb"
    path.write_text(text)
    return path


def test_assembly_repairs_what_students_do_to_notebooks(tmp_path):
    lab = "lab01_sampling"
    release = release_of(lab)
    nb = fixtures.solved(release, lab)
    target = next(i for i, c in enumerate(nb.cells) if assemble.grade_id(c) == "residual")
    nb.cells.insert(target + 1, nbformat.v4.new_code_cell("scratch = 1"))
    nb.cells = [c for c in nb.cells if assemble.grade_id(c) != "test_residual"]  # a deleted test cell
    nb.cells.append(nbformat.v4.new_code_cell("x = 2", metadata={"nbgrader": {"grade_id": "residual"}}))
    text = nbformat.writes(nb).replace('"nbformat_minor": 5', '"nbformat_minor": 99')
    cells, notes = assemble.read_cells(write_notebook(tmp_path, text))
    assembled = assemble.assemble(release, cells)
    sources = [c.source for c in assembled.notebook.cells]
    ids = [assemble.grade_id(c) for c in assembled.notebook.cells]
    assert [i for i in ids if i] == [assemble.grade_id(c) for c in release.cells if assemble.grade_id(c)]
    assert sources[ids.index("residual") + 1] == "scratch = 1", "an added cell stays after the cell it followed"
    assert "x = 2" in sources and any("second copy" in n for n in assembled.notes)
    assert any("'test_residual' was missing" in n for n in assembled.notes)
    assert set(assembled.graded_cells) == {assemble.grade_id(c) for c in release.cells if assemble.is_test(c)}
    for bad, reason in [("{", "not valid JSON"), ('{"a": 1}', "not a Jupyter notebook")]:
        with pytest.raises(assemble.Unreadable, match=reason):
            assemble.read_cells(write_notebook(tmp_path, bad))


def written_ids(lab: str) -> set[str]:
    """The written answers of `lab` (manually graded answer cells)."""
    return {assemble.grade_id(c) for c in release_of(lab).cells if assemble.is_written(c)}


def test_written_answers_await_a_person_unless_left_as_released():
    """A written answer is never scored by the grader: None (awaiting manual grading) as soon as the student
    wrote something, 0 when the cell is as released, or deleted (it is put back, unanswered, with a note)."""
    lab = "lab01_sampling"
    release, written = release_of(lab), written_ids(lab)
    assert written, "lab 1 has a written question"

    def scored(nb: nbformat.NotebookNode) -> tuple[dict, list[str]]:
        cells = [assemble.StudentCell(c.cell_type, c.source, assemble.grade_id(c)) for c in nb.cells]
        assembled = assemble.assemble(release, cells)
        return pipeline.manual_scores(assembled.notebook, release), assembled.notes

    assert scored(fixtures.solved(release, lab))[0] == dict.fromkeys(written)
    assert scored(release)[0] == dict.fromkeys(written, 0.0)
    blanked = fixtures.solved(release, lab, dict.fromkeys(written, "  YOUR ANSWER HERE\n"))
    assert scored(blanked)[0] == dict.fromkeys(written, 0.0), "the stub with stray blanks is still no answer"
    deleted = fixtures.solved(release, lab)
    deleted.cells = [c for c in deleted.cells if assemble.grade_id(c) not in written]
    scores, notes = scored(deleted)
    assert scores == dict.fromkeys(written, 0.0) and any("counts as no answer" in n for n in notes), notes
    result = pipeline.StudentResult("x", 11.0, 11.0, "graded", manual=dict.fromkeys(written),
                                    manual_points=dict.fromkeys(written, 2.0))
    assert result.awaiting() == sorted(written) and result.pending_points() == 2.0 * len(written)
    assert "needs manual grading" in pipeline.manual_note(result)
    assert "needs manual grading" in pipeline.notes_cell(result).source


def test_a_python_environment_under_tmp_stays_visible_in_the_sandbox(monkeypatch):
    """A clone under /tmp (as CI makes) keeps its virtual environment inside the sandbox: the sandbox's private
    /tmp must not hide it."""
    import subprocess
    import tempfile

    from autograder import sandbox

    try:
        sandbox.available()
    except sandbox.SandboxUnavailable as missing:
        pytest.skip(str(missing))
    with tempfile.TemporaryDirectory(dir="/tmp") as env:
        (Path(env) / "marker").write_text("the environment")
        monkeypatch.setattr(sandbox, "python_roots", lambda: [Path(env)])
        seen = subprocess.run(["bwrap", *sandbox.mount_args(), "--", "cat", f"{env}/marker"],
                              capture_output=True, text=True, timeout=60)
        listed = subprocess.run(["bwrap", *sandbox.mount_args(), "--", "ls", "-A", "/tmp"],
                                capture_output=True, text=True, timeout=60)
    assert seen.stdout == "the environment", seen.stderr
    assert listed.stdout.split() == [Path(env).parts[2]], "only the environment's own folder appears in /tmp"


def test_outputs_from_the_sandbox_are_reduced_to_text():
    cleaned = assemble.clean_outputs([
        {"output_type": "display_data", "data": {"text/html": "<script>x</script>", "text/plain": "ok"}},
        {"output_type": "stream", "name": "stderr", "text": "e" * 50_000},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": "not a list"}, "junk", 5])
    assert cleaned[0]["data"] == {"text/plain": "ok"}
    assert len(cleaned[1]["text"]) == assemble.MAX_TEXT and cleaned[2]["traceback"] == []
    assert len(cleaned) == 3


@pytest.mark.parametrize("name, expected", [
    ("doe_123_456_lab01_sampling.ipynb", "doe-123"),
    ("Jane Doe_81_assignsubmission_file_", "Jane-Doe-81"),
    ("ana.lima", "ana.lima"),
])
def test_student_ids_from_lms_names(name, expected):
    assert pipeline.student_id(name) == expected


def test_bad_input_gets_a_clear_message_and_writes_nothing(tmp_path):
    corrupt = tmp_path / "class.zip"
    corrupt.write_bytes(b"PK\x03\x04 this is not really a zip")
    out = tmp_path / "out"
    with pytest.raises(pipeline.GradingError, match="zip"):
        pipeline.grade("lab01_sampling", corrupt, out)
    with pytest.raises(pipeline.GradingError, match="does not exist"):
        pipeline.grade("lab01_sampling", tmp_path / "missing", out)
    with pytest.raises(pipeline.GradingError, match="unknown lab"):
        pipeline.grade("lab99_nothing", tmp_path, out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(pipeline.GradingError, match="no submissions"):
        pipeline.grade("lab01_sampling", tmp_path / "empty", out)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("instructor notes")
    with pytest.raises(pipeline.GradingError, match="not empty"):
        pipeline.grade("lab01_sampling", tmp_path / "empty", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def add_class_stopping_names(folder: Path, lab: str) -> None:
    """Files that once stopped a whole class: a name without ASCII letters, one student's two uploads (the
    later one is the solution), and a hidden notebook."""
    import os

    solution = nbformat.writes(fixtures.solved(release_of(lab), lab))
    (folder / f"李华_{lab}.ipynb").write_text(solution)
    (folder / "ana_lab01_v1.ipynb").write_text(nbformat.writes(release_of(lab)))
    (folder / "ana_lab01_v2.ipynb").write_text(solution)
    os.utime(folder / "ana_lab01_v1.ipynb", (1_700_000_000, 1_700_000_000))
    (folder / ".hidden_lab01.ipynb").write_text(solution)


# The fixtures the representative batch of labs 2 to 6 always holds (the test's assertions name them).
BATCH_ALWAYS = {"solution", "blank", "lying_objects", "corrupt_file", "newer_schema"}


def chosen_fixtures(lab: str, scope: str = "class") -> list[fixtures.Fixture]:
    """The simulated submissions graded for `lab`: scope "class" is every one (lab 1) or every one but the
    lab-independent cases (the other labs); "batch" is the representative batch described above."""
    every = fixtures.fixtures(lab, release_of(lab))
    if lab != "lab01_sampling":
        every = [f for f in every if f.name not in LAB_INDEPENDENT_ATTACKS]
    if scope == "class":
        return every
    first_mistake = next(iter(fixtures.LABS[lab].mistakes))
    later_mistakes = set(fixtures.LABS[lab].mistakes) - {first_mistake}
    if lab == "lab01_sampling":
        return [f for f in every if f.name not in later_mistakes]
    own_attacks = {f.name for f in every if f.kind == "attack" and f.name != "imports_reference"}
    return [f for f in every if f.name in BATCH_ALWAYS | own_attacks | {first_mistake}]


GRADED_BATCHES = [*(pytest.param(lab, "batch", id=f"{lab}-batch", marks=pytest.mark.representative)
                    for lab in LABS),
                  *(pytest.param(lab, "class", id=lab, marks=pytest.mark.whole_class) for lab in LABS)]


@pytest.mark.grading
@pytest.mark.parametrize(("lab", "scope"), GRADED_BATCHES)
def test_end_to_end_grading_of_simulated_class(lab, scope, tmp_path):
    """Honest work loses nothing it should not, each classic mistake loses exactly its tests, attacks earn
    nothing, and the reference is intact after the schema-breaking and grader-killing submissions."""
    chosen = chosen_fixtures(lab, scope)
    submissions = tmp_path / "submissions"
    fixtures.write(chosen, submissions)
    if lab == "lab01_sampling":
        add_class_stopping_names(submissions, lab)
    before = digest(submissions)
    limits = LAB01_LIMITS if lab == "lab01_sampling" else LIMITS
    results = {r.student: r for r in pipeline.grade(lab, submissions, tmp_path / "out", limits, seed=7)}
    assert digest(submissions) == before, "the submitted files must be left untouched"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    print(f"{lab}: the grader's peak memory over the batch {peak / 2**30:.2f} GiB")
    assert peak < 2 << 30, "the grader's own memory stays bounded whatever the submissions"

    every_test = fixtures.test_ids(lab)
    full = results[student("solution")]
    assert full.status == "graded" and set(full.tests) == every_test
    lost_by_reference = {t: full.messages.get(t) for t, score in full.tests.items() if score == 0}
    assert full.score == full.max_score > 0 and not lost_by_reference, (lost_by_reference, full.notes)
    problems = []
    for fixture in chosen:
        result = results[student(fixture.name)]
        lost = {test for test, score in result.tests.items() if score == 0}
        unearned = {t for t, s in result.tests.items() if s > full.tests[t]}
        expected = every_test if fixture.lost is None else fixture.lost
        if unearned or set(result.tests) != every_test:
            problems.append(f"{fixture.name}: unearned {sorted(unearned)}")
        elif fixture.exact and lost != expected:
            problems.append(f"{fixture.name} ({fixture.kind}): lost {sorted(lost)}, expected {sorted(expected)}; "
                            f"{[result.messages[t] for t in sorted(lost ^ expected)]} {result.notes}")
        elif not fixture.exact and not expected <= lost:
            problems.append(f"{fixture.name}: lost {sorted(lost)}, expected at least {sorted(expected)}")
    assert not problems, "\n".join(problems)
    written = written_ids(lab)
    assert full.manual == dict.fromkeys(written) and full.pending_points() == sum(full.manual_points.values()), \
        "the reference's written answers await a person: neither 0 nor full marks"
    blank = results[student("blank")]
    assert blank.manual == dict.fromkeys(written, 0.0) and blank.pending_points() == 0, "no answer: 0 points"
    assert results[student("corrupt_file")].status == "needs review"
    assert results[student("newer_schema")].status == "graded"

    out = tmp_path / "out"
    with open(out / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert set(rows) == set(results) and float(rows[student("solution")]["score"]) == full.max_score
    assert float(rows[student("solution")]["manual_pending"]) == float(rows[student("solution")]["manual_max"])
    assert float(rows[student("blank")]["manual_pending"]) == 0
    graded = [name for name, r in results.items() if r.status == "graded"]
    assert all((out / "feedback" / f"{name}.html").exists() for name in graded)
    feedback = (out / "feedback" / "solution.html").read_text()
    assert "[grader] passed" in feedback
    if written:
        assert "needs manual grading" in feedback, "the page says the written answers await a person"
        assert "needs manual grading" not in (out / "feedback" / "blank.html").read_text()
    assert not any(secret in feedback for secret in ("autograder", "checks/", "specdec_probe", "probes/")), \
        "the feedback names no part of the grader"
    if lab == "lab06_train_drafter":  # its demo runs are not run while grading, and the page says why
        assert feedback.count("Not run while grading") == 5 and not re.search(r"EAGLE: loss \d", feedback)
    scores = json.loads((out / "scores.json").read_text())
    assert all(set(s["messages"]) == every_test for s in scores if s["status"] == "graded")
    if lab == "lab01_sampling":
        assert results[student("kills_grader")].status == "needs review"
        assert (out / "autograded" / "stdout-flood.ipynb").stat().st_size < 2_000_000
        notes = " ".join(results[student("imports_reference")].notes)
        assert "imports specdec_lab" in notes, "the notes should warn about the lab rules"
        assert any(n.startswith("timeout:") for n in results[student("infinite_loop")].notes)
        assert any(n.startswith("crash:") for n in results[student("os_exit")].notes)
        assert results["李华"].score == full.max_score, "a name without ASCII letters is a student like any other"
        twice = results["ana"]
        assert twice.score == full.max_score and any("ana_lab01_v1" in n for n in twice.notes), twice.notes
        assert any(".hidden" in n for r in results.values() for n in r.notes)


@pytest.mark.grading
def test_the_command_line_lists_submissions_that_need_review(tmp_path, capsys):
    """A broken file needs review (exit status 1); the solution is graded at full autograded marks and is
    listed apart as needing manual grading of its written answers, which are neither 0 nor full marks."""
    from autograder.__main__ import main

    chosen = {f.name: f for f in fixtures.fixtures("lab01_sampling", release_of("lab01_sampling"))}
    archive = tmp_path / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ["solution", "corrupt_file"]:
            folder = f"{name.replace('_', ' ')}_4{len(name)}_assignsubmission_file_"
            fixture = chosen[name]
            text = fixture.raw if fixture.notebook is None else nbformat.writes(fixture.notebook)
            handle.writestr(f"{folder}/lab01_sampling.ipynb", text)
    code = main(["grade", "lab01_sampling", str(archive), "--out", str(tmp_path / "out")])
    assert code == 1
    with open(tmp_path / "out" / "grades.csv") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    corrupt = rows["corrupt-file-412"]
    assert corrupt["status"] == "needs review" and "not valid JSON" in corrupt["notes"]
    assert float(rows["solution-48"]["score"]) == float(rows["solution-48"]["max_score"]) > 0
    solution = rows["solution-48"]
    assert float(solution["manual_pending"]) == float(solution["manual_max"]) > 0
    assert solution["status"] == "graded" and "needs manual grading" in solution["notes"]
    printed = capsys.readouterr()
    assert "needs manual grading (1): solution-48" in printed.out
    assert "needs review (1): corrupt-file-412" in printed.err


def test_gradebook_module_names_the_labs():
    assert gradebook.list_labs() == LABS


def test_lab_rules_warn_under_the_cell_in_ipython(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import torch\ndef verify(x):\n    return x\n")
    lab_rules.watch(shell)
    lab_rules.watch(shell)  # the setup cell run twice registers one hook, not two
    capsys.readouterr()
    shell.run_cell("result = verify(3)\nscratch = [1, 2]\nscratch[0] += 1")
    assert capsys.readouterr().out == "", "ordinary code gets no warning"
    shell.run_cell("def verify(x):\n    return 0\n")
    out = capsys.readouterr().out
    assert out.count("redefines `verify`") == 1 and shell.user_ns["verify"](5) == 0, "a warning, never a block"
