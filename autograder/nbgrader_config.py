"""nbgrader configuration of the specdec-lab course, used by the grading pipeline (autograder/pipeline.py) for
releases, the gradebook and feedback. nbgrader never executes student notebooks here: the sandbox does."""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "specdec-lab"

# Release: students see this stub where the solution was.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Feedback: pages opened in a browser by instructors and students, showing what a submission wrote; nothing in them
# may run (see the docstring of autograder/gradebook.py). Rich outputs go through nbconvert's sanitiser (and
# JavaScript and widget outputs are dropped); markdown, which nbgrader's feedback template renders itself, goes
# through a filter that renders it and then sanitises the result.
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.filters = {"markdown2html": "autograder.gradebook.feedback_markdown"}
