"""Interactive widgets for the lessons (ipywidgets 8): step-through, speedup explorer, draft tree view, quiz.

Each keeps its state in plain Python attributes, so tests and graded labs drive it by setting a control's
`.value`. In a kernel, displaying one shows the live widget with its text summary as the fallback (what nbconvert
and papermill store); headless (outside a kernel, under nbgrader, or `static=True`) it prints the summary.
"""

from specdec_lab.widgets.base import CourseWidget, headless
from specdec_lab.widgets.explorer import SpeedupExplorer
from specdec_lab.widgets.quiz import Feedback, Question, Quiz, QuizBank, load_bank
from specdec_lab.widgets.step_through import StepThrough, StepView, TokenVerdict
from specdec_lab.widgets.tree_view import TreeView, toy_tree, trees_from_records

__all__ = [
    "CourseWidget", "Feedback", "Question", "Quiz", "QuizBank", "SpeedupExplorer", "StepThrough",
    "StepView", "TokenVerdict", "TreeView", "headless", "load_bank", "toy_tree", "trees_from_records",
]
