"""The course's additions to nbgrader's feedback page, loaded by nbgrader_config.py in nbgrader's own process.

A written answer (a manually graded answer cell) that awaits a person has neither an autograder's nor a grader's
score, and nbgrader's page would show it as 0 points. `PendingGrades` reads the gradebook after nbgrader's
`GetGrades` and marks such cells "pending", with their points in the page's resources; the template
templates/specdec_feedback (nbgrader's "feedback" template, extended) then says "needs manual grading" for each
and gives the autograded total apart from the points still to be graded.
"""

from __future__ import annotations

from pathlib import Path

import nbgrader
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor

TEMPLATES = Path(__file__).resolve().parent / "templates"
NBGRADER_TEMPLATES = Path(nbgrader.__file__).resolve().parent / "server_extensions" / "formgrader" / "templates"
TEMPLATE_NAME = "specdec_feedback"
TEMPLATE_FILE = "specdec.html.j2"


def awaits_a_person(grade) -> bool:
    """Whether a gradebook grade is still to be given by hand: marked for manual grading, and no score yet."""
    return bool(grade.needs_manual_grade) and grade.manual_score is None and grade.auto_score is None


class PendingGrades(NbGraderPreprocessor):
    """Marks each written answer awaiting manual grading (cell metadata nbgrader.pending) and totals their points
    (resources["nbgrader"]["pending_points"]), from the gradebook."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        pending = 0.0
        with Gradebook(info["db_url"]) as gradebook:
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if not (meta.get("solution") and meta.get("grade")):
                    continue
                grade = gradebook.find_grade(meta["grade_id"], info["notebook"], info["assignment"],
                                             info["student"])
                meta["pending"] = awaits_a_person(grade)
                pending += float(grade.max_score) if meta["pending"] else 0.0
        info["pending_points"] = pending
        return nb, resources
