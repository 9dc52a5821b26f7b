"""Intake never stops a class, and a crash of the grader loses no student already graded (issue 30, items 3-4).

Student ids from any name (Unicode, spaces, Moodle's and Canvas's naming), the notebook graded when a student
uploaded several or a folder holds several, hidden and junk files, zips (entry dates, clashing, unsafe and broken
entries), and the per-student journal of `pipeline.grade` with a crash in the middle of a class. No sandbox runs
here: `grade_one` is replaced by a fake where a whole class is graded.
"""

from __future__ import annotations

import copy
import csv
import gc
import json
import os
import re
import time
import weakref
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder import pipeline

LAB = "lab01_sampling"
SAFE_ID = re.compile(r"[^\W_](?:[\w.-]*[^\W_])?|[^\W_]")  # letters/digits of any script, "." and "-" inside


def notebook_text(tag: str) -> str:
    return nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"# {tag}")]))


def first_source(path: Path) -> str:
    return nbformat.read(path, as_version=4).cells[0].source


def put(path: Path, when: float, text: str | None = None) -> Path:
    """Write a notebook at `path`, modified at `when` (seconds since the epoch)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else notebook_text(path.name))
    os.utime(path, (when, when))
    return path


def by_student(subs: list[pipeline.Submission]) -> dict[str, pipeline.Submission]:
    assert len({s.student for s in subs}) == len(subs), "ids must be unique"
    return {s.student: s for s in subs}


@pytest.mark.parametrize("name, expected", [
    ("李华_lab01_sampling.ipynb", "李华"),
    ("Jane Doe_12345_assignsubmission_file_", "Jane-Doe-12345"),
    ("Jane Doe_12345_assignsubmission_onlinetext_", "Jane-Doe-12345"),
    ("Jane Doe_12345_assignsubmission_file_lab01_sampling.ipynb", "Jane-Doe-12345"),
    ("doe_jane_12345_67890_lab01_sampling.ipynb", "doe-jane-12345"),
    ("doejane_LATE_12345_67891_lab01_sampling-1.ipynb", "doejane-12345"),
    ("lab01_sampling (1).ipynb", "lab01"),
    ("Ελένη Παππά_lab01.ipynb", "Ελένη-Παππά"),
    ("Jose\u0301_lab01.ipynb", "Jos\u00e9"),  # decomposed (macOS) and composed are one student
    ("ＡＢＣ_lab01.ipynb", "ABC"),  # full-width letters
    ("x\u202ey_lab01.ipynb", "x-y"),  # a right-to-left override is not kept
    ("student007_lab01_sampling.ipynb", "student007"),
    (".ana_lab01.ipynb", "ana"),
])
def test_any_name_maps_to_a_safe_id(name, expected):
    assert pipeline.student_id(name) == expected
    assert SAFE_ID.fullmatch(expected)


def test_names_without_letters_get_a_stable_hash_and_long_names_stay_distinct():
    emoji = pipeline.student_id("🙂🙂_lab01_sampling.ipynb")
    assert re.fullmatch(r"student-[0-9a-f]{8}", emoji)
    assert pipeline.student_id("🙂🙂_lab01_sampling (1).ipynb") == emoji, "the same student, the same id"
    assert pipeline.student_id("🙃_lab01_sampling.ipynb") != emoji
    long_a, long_b = (pipeline.student_id("x" * 300 + end + "_lab01.ipynb") for end in "ab")
    assert long_a != long_b and max(len(long_a), len(long_b)) <= pipeline.MAX_ID_CHARS
    assert pipeline.student_id("___.ipynb") and pipeline.student_id("\udcff_lab01.ipynb")  # never an exception


def test_two_uploads_grade_the_latest_by_modification_time(tmp_path):
    old = put(tmp_path / "ana_lab01_sampling.ipynb", 1_700_000_000)
    new = put(tmp_path / "ana_lab01_sampling (1).ipynb", 1_700_000_500)
    put(tmp_path / "李华_lab01_sampling.ipynb", 1_700_000_000)
    put(tmp_path / "doe_jane_12345_67890_lab01_sampling.ipynb", 1_700_000_000)
    put(tmp_path / "doe_john_12399_67891_lab01_sampling.ipynb", 1_700_000_000)
    subs = by_student(pipeline.find_submissions(tmp_path, LAB))
    assert set(subs) == {"ana", "李华", "doe-jane-12345", "doe-john-12399"}
    assert subs["ana"].path == new
    [note] = [n for n in subs["ana"].notes if "uploads" in n]
    assert note.startswith("2 uploads") and "graded 'ana_lab01_sampling (1).ipynb'" in note
    assert "ignored: 'ana_lab01_sampling.ipynb" in note
    assert not subs["李华"].notes
    os.utime(old, (1_700_009_000, 1_700_009_000))  # now the plain name is the later upload
    assert by_student(pipeline.find_submissions(tmp_path, LAB))["ana"].path == old


def test_a_folder_of_notebooks_grades_the_labs_and_notes_the_rest(tmp_path):
    jane = tmp_path / "Jane Doe_12345_assignsubmission_file_"
    put(jane / "lab01_sampling.ipynb", 1_700_000_000)
    put(jane / "lab01_sampling-Copy1.ipynb", 1_700_000_100)
    put(jane / "Untitled.ipynb", 1_700_000_200)
    put(jane / ".secret.ipynb", 1_700_000_300)
    put(jane / ".ipynb_checkpoints" / "lab01_sampling-checkpoint.ipynb", 1_700_000_400)
    (jane / "report.pdf").write_bytes(b"%PDF")
    bo = tmp_path / "Bo_7_assignsubmission_file_"
    put(bo / "scratch.ipynb", 1_700_000_000)
    put(bo / "work" / "homework.ipynb", 1_700_000_900)
    (tmp_path / "Cy_8_assignsubmission_file_").mkdir()
    (tmp_path / "Di_9_assignsubmission_file_").mkdir()
    (tmp_path / "Di_9_assignsubmission_file_" / "notes.txt").write_text("forgot the notebook")
    subs = by_student(pipeline.find_submissions(tmp_path, LAB))
    assert set(subs) == {"Jane-Doe-12345", "Bo-7", "Cy-8", "Di-9"}

    assert subs["Jane-Doe-12345"].path == jane / "lab01_sampling.ipynb"
    notes = " | ".join(subs["Jane-Doe-12345"].notes)
    assert "holds 3 notebooks" in notes and "named for the lab" in notes
    assert "lab01_sampling-Copy1.ipynb" in notes and "Untitled.ipynb" in notes
    assert "hidden" in notes and ".secret.ipynb" in notes and "report.pdf" in notes
    assert "checkpoint" not in notes, "Jupyter's checkpoints are litter, not a student's upload"

    assert subs["Bo-7"].path == bo / "work" / "homework.ipynb"
    assert "the most recently modified" in " ".join(subs["Bo-7"].notes)
    assert subs["Cy-8"].path is None and any("holds no notebook (it is empty)" in n for n in subs["Cy-8"].notes)
    assert subs["Di-9"].path is None and any("notes.txt" in n for n in subs["Di-9"].notes)
    assert any("holds no notebook" in n and "empty" not in n for n in subs["Di-9"].notes)


def test_hidden_files_are_noted_and_junk_is_ignored(tmp_path):
    ana = put(tmp_path / "ana_lab01.ipynb", 1_700_000_000)
    put(tmp_path / ".ana_lab01.ipynb", 1_700_000_900)
    put(tmp_path / ".zed_lab01.ipynb", 1_700_000_000)
    put(tmp_path / "__MACOSX" / "._ana_lab01.ipynb", 1_700_000_000)
    put(tmp_path / "._ana_lab01.ipynb", 1_700_000_000, "\0\x05\x16\x07")  # macOS metadata, not a notebook
    (tmp_path / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    subs = by_student(pipeline.find_submissions(tmp_path, LAB))
    assert set(subs) == {"ana", "zed"}
    assert subs["ana"].path == ana, "a hidden notebook is never graded, even when it is newer"
    assert any("hidden" in n and ".ana_lab01.ipynb" in n for n in subs["ana"].notes)
    assert subs["zed"].path is None and any(".zed_lab01.ipynb" in n for n in subs["zed"].notes)
    assert not any("MACOSX" in n or "._ana" in n or "DS_Store" in n for s in subs.values() for n in s.notes)


def test_names_that_would_share_an_id_are_told_apart(tmp_path):
    put(tmp_path / "ana lee_lab01.ipynb", 1_700_000_000)
    put(tmp_path / "ana-lee_lab01.ipynb", 1_700_000_000)
    put(tmp_path / "Bob_lab01.ipynb", 1_700_000_000)
    put(tmp_path / "bob_lab01.ipynb", 1_700_000_000)
    subs = by_student(pipeline.find_submissions(tmp_path, LAB))
    assert len(subs) == 4 and all(s.path is not None for s in subs.values())
    assert all(any("each got a hash" in n for n in s.notes) for s in subs.values())
    assert len({s.student.casefold() for s in subs.values()}) == 4, "distinct even where case is ignored"


def dated(name: str, when: tuple[int, ...]) -> zipfile.ZipInfo:
    return zipfile.ZipInfo(name, date_time=when)


def test_zip_keeps_entry_dates_and_notes_what_it_cannot_extract(tmp_path, monkeypatch):
    archive = tmp_path / "class.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        # the newer upload comes first: extraction order alone would make the other one look newer
        handle.writestr(dated("ann_lab01_sampling_v2.ipynb", (2024, 3, 9, 10, 0, 0)), notebook_text("v2"))
        handle.writestr(dated("ann_lab01_sampling.ipynb", (2024, 3, 1, 10, 0, 0)), notebook_text("v1"))
        handle.writestr(dated("bo_lab01.ipynb", (2024, 3, 1, 10, 0, 0)), notebook_text("bo first"))
        with pytest.warns(UserWarning, match="Duplicate name"):  # an LMS zip may hold one name twice
            handle.writestr(dated("bo_lab01.ipynb", (2024, 3, 2, 10, 0, 0)), notebook_text("bo again"))
        handle.writestr("../../cy_lab01.ipynb", notebook_text("cy"))
        handle.writestr("Di Ng_4_assignsubmission_file_/report.pdf", b"%PDF")
        handle.writestr("Di Ng_4_assignsubmission_file_/lab01_sampling.ipynb", "x" * 5000)
        handle.writestr("__MACOSX/._bo_lab01.ipynb", b"\0\5")
        handle.writestr("eve_lab01.ipynb", notebook_text("eve"), compress_type=zipfile.ZIP_STORED)
    data = archive.read_bytes()
    at = data.index(b"# eve")
    archive.write_bytes(data[:at] + b"# EVE" + data[at + 5:])  # a bad CRC in one entry only
    monkeypatch.setattr(pipeline, "MAX_EXTRACTED_BYTES", 4000)

    folder, skipped = pipeline.unpack(archive, tmp_path / "work")
    assert folder.resolve().is_relative_to((tmp_path / "work").resolve())
    assert (folder / "cy_lab01.ipynb").exists() and not (tmp_path / "cy_lab01.ipynb").exists()
    subs = by_student(pipeline.find_submissions(folder, LAB, skipped))
    assert set(subs) == {"ann", "bo", "cy", "Di-Ng-4", "eve"}
    assert first_source(subs["ann"].path) == "# v2"
    assert "ann_lab01_sampling_v2.ipynb" in subs["ann"].notes[0] and "2024-03-09 10:00" in subs["ann"].notes[0]
    assert first_source(subs["bo"].path) == "# bo again", "both copies are kept, the later one graded"
    assert subs["Di-Ng-4"].path is None
    di = " | ".join(subs["Di-Ng-4"].notes)
    assert "report.pdf" in di and "larger than" in di and "needs review" in di
    assert subs["eve"].path is None and "could not be extracted" in " ".join(subs["eve"].notes)
    assert not any("MACOSX" in n for s in subs.values() for n in s.notes)


def test_a_wrapper_folder_is_opened_but_one_students_folder_is_not(tmp_path):
    archive = tmp_path / "zipped-folder.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in ["ana", "bo", "李华"]:
            handle.writestr(f"submissions/{name}_lab01_sampling.ipynb", notebook_text(name))
    folder, skipped = pipeline.unpack(archive, tmp_path / "work")
    assert set(by_student(pipeline.find_submissions(folder, LAB, skipped))) == {"ana", "bo", "李华"}
    single = tmp_path / "single"
    put(single / "jane" / "lab01_sampling.ipynb", 1_700_000_000)
    put(single / "jane" / "scratch.ipynb", 1_700_000_900)
    [jane] = pipeline.find_submissions(single, LAB)
    assert jane.student == "jane" and jane.path.name == "lab01_sampling.ipynb"


def test_only_the_instructors_mistakes_stop_intake(tmp_path):
    with pytest.raises(pipeline.GradingError, match="does not exist"):
        pipeline.unpack(tmp_path / "missing.zip", tmp_path / "work")
    (tmp_path / "grades.txt").write_text("not a zip")
    with pytest.raises(pipeline.GradingError, match="neither a folder nor a valid zip"):
        pipeline.unpack(tmp_path / "grades.txt", tmp_path / "work")
    (tmp_path / "empty").mkdir()
    with pytest.raises(pipeline.GradingError, match="no submissions"):
        pipeline.find_submissions(tmp_path / "empty", LAB)


def quick_course(workdir: Path, lab: str) -> Path:
    """A course folder holding only the committed release: enough to grade with a fake grade_one, without
    nbgrader's seconds of generate_assignment (the finishing step needs the real one)."""
    release = workdir / "course" / "release" / lab / f"{lab}.ipynb"
    release.parent.mkdir(parents=True)
    release.write_bytes((pipeline.LABS / lab / f"{lab}.ipynb").read_bytes())
    return workdir / "course"


class Crash(BaseException):
    """The grader dying mid-class (not an Exception: safe_grade_one would confine one to its student)."""


def test_the_journal_keeps_graded_students_across_a_crash_and_a_rerun_finishes(tmp_path, monkeypatch):
    submissions = tmp_path / "class"
    for i, name in enumerate(["ana", "bob", "cy", "di"]):
        put(submissions / f"{name}_lab01_sampling.ipynb", 1_700_000_000 + i)
    put(submissions / "ana_lab01_sampling (1).ipynb", 1_700_000_100)
    (submissions / "Eve_9_assignsubmission_file_").mkdir()
    out = tmp_path / "grades"
    journal = pipeline.journal_folder(out)
    graded: list[str] = []
    alive: list[weakref.ref] = []

    def fake_grade_one(job, sub, crash_at=None, score=1.0):
        gc.collect()
        assert all(ref() is None for ref in alive), "graded notebooks must not pile up in memory"
        if len(graded) == crash_at:
            raise Crash
        graded.append(sub.student)
        notebook = copy.deepcopy(job.release)
        alive.append(weakref.ref(notebook))
        result = pipeline.StudentResult(sub.student, score, sum(job.points.values()), "graded",
                                        tests={gid: 0.0 for gid in job.points})
        return result, notebook

    monkeypatch.setattr(pipeline.sandbox, "available", lambda: None)
    monkeypatch.setattr(pipeline, "grade_one", lambda job, sub: fake_grade_one(job, sub, crash_at=2))
    with monkeypatch.context() as quick:
        quick.setattr(pipeline.gradebook, "make_course", quick_course)
        with pytest.raises(Crash):
            pipeline.grade(LAB, submissions, out, seed=11, workers=1)
    assert graded == ["ana", "bob"] and not out.exists()
    kept = {p.stem: json.loads(p.read_text()) for p in (journal / "students").glob("*.json")}
    assert set(kept) == {"Eve-9", "ana", "bob"}, "everyone graded before the crash is on disk"
    assert kept["ana"]["result"]["score"] == 1.0 and (journal / "students" / "ana.ipynb").exists()
    assert kept["Eve-9"]["result"]["status"] == "needs review"

    with pytest.raises(pipeline.GradingError, match="--resume"):
        pipeline.grade(LAB, submissions, out, workers=1)

    from autograder.__main__ import main

    graded.clear()
    alive.clear()
    monkeypatch.setattr(pipeline, "grade_one", lambda job, sub: fake_grade_one(job, sub, score=2.0))
    code = main(["grade", LAB, str(submissions), "--out", str(out), "--resume", "--workers", "1"])
    assert code == 1, "Eve's empty folder needs review"
    assert graded == ["cy", "di"], "the rerun grades only the students the crash left"
    with open(out / "grades.csv", encoding="utf-8") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert {s: float(r["score"]) for s, r in rows.items()} == {"Eve-9": 0, "ana": 1, "bob": 1, "cy": 2, "di": 2}
    assert "2 uploads" in rows["ana"]["notes"] and "ana_lab01_sampling (1).ipynb" in rows["ana"]["notes"]
    assert rows["Eve-9"]["status"] == "needs review" and "empty" in rows["Eve-9"]["notes"]
    assert (out / "grading.log").read_text().startswith("seed 11\nresumed: 3 students")
    top = nbformat.read(out / "autograded" / "ana.ipynb", as_version=4).cells[0].source
    assert "Grader notes" in top and "2 uploads" in top
    assert not journal.exists(), "the journal goes once the outputs are in place"


def test_a_changed_file_is_graded_again_on_resume(tmp_path, monkeypatch):
    submissions = tmp_path / "class"
    for name in ["ana", "bob"]:
        put(submissions / f"{name}_lab01.ipynb", time.time())
    out = tmp_path / "grades"
    graded: list[str] = []

    def fake_grade_one(job, sub):
        if graded == ["ana"]:
            raise Crash
        graded.append(sub.student)
        return pipeline.StudentResult(sub.student, 0.0, 1.0, "graded"), None

    monkeypatch.setattr(pipeline.sandbox, "available", lambda: None)
    monkeypatch.setattr(pipeline, "grade_one", fake_grade_one)
    monkeypatch.setattr(pipeline, "finish", lambda *args: None)  # nbgrader's part is tested above
    monkeypatch.setattr(pipeline.gradebook, "make_course", quick_course)
    with pytest.raises(Crash):
        pipeline.grade(LAB, submissions, out, workers=1)
    put(submissions / "ana_lab01.ipynb", time.time(), notebook_text("fixed"))
    graded.clear()
    graded.append("-")  # no crash this time
    pipeline.grade(LAB, submissions, out, workers=1, resume=True)
    assert graded == ["-", "ana", "bob"], "ana's file changed after she was graded, so she is graded again"
