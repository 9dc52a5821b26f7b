"""nbgrader configuration of the specdec-lab course, used by the headless grading pipeline (autograder/pipeline.py).

The pipeline copies this file into a throw-away course directory and appends per-run settings (timeout, paths).
Everything here is chosen for unattended grading of untrusted notebooks.
"""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "specdec-lab"

# Release: students see this stub where the solution was.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Autograde. Explicit per-cell timeout (nbgrader's default is 30 s); a cell that runs past it is interrupted and
# the rest of the notebook still runs. The pipeline may lower it (tests) with --timeout.
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True
c.Execute.allow_errors = True
# Students may delete or edit test cells: nbgrader restores their source from the database and re-adds
# deleted ones, so every test runs in every submission.
c.OverwriteCells.add_missing_cells = True
c.Autograde.create_student = True
# A flood of output must not bloat the graded notebook or the feedback.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 60
