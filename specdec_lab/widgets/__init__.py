"""Interactive widgets for the lessons (ipywidgets 8): step-through, speedup explorer, draft tree view, quiz.

Each keeps its state in plain Python attributes, so tests and graded labs drive it by setting a control's
`.value`; headless (nbgrader, or `static=True`) displaying one prints a text summary instead.
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
