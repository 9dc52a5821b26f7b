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

# Written answers awaiting manual grading are said to be on the page, not shown as 0 points (autograder/feedback.py):
# nbgrader's preprocessors with one added after GetGrades, and nbgrader's feedback template extended. Setting the
# template's base folders replaces nbgrader's default, so its own templates folder is named here too. Where the
# autograder cannot be imported (an nbgrader run outside the repository), nbgrader's own page stays.
try:
    from autograder import feedback
except ImportError:
    feedback = None
if feedback is not None:
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import GetGrades

    c.GenerateFeedback.preprocessors = [GetGrades, feedback.PendingGrades, CSSHTMLHeaderPreprocessor]
    c.HTMLExporter.template_name = feedback.TEMPLATE_NAME
    c.HTMLExporter.template_file = feedback.TEMPLATE_FILE
    c.HTMLExporter.extra_template_basedirs = [str(feedback.TEMPLATES), str(feedback.NBGRADER_TEMPLATES)]
