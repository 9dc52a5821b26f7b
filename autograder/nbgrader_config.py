"""nbgrader configuration of the specdec-lab course, used by the grading pipeline (autograder/pipeline.py) for
releases, the gradebook and feedback. nbgrader never executes student notebooks here: the sandbox does."""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "specdec-lab"

# Release: students see this stub where the solution was.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
