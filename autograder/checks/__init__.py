"""Hidden checks of the graded labs: the logic behind the `### BEGIN HIDDEN TESTS` cells.

Only the grading environment has this package on its path (the pipeline adds autograder/ to the kernel's
PYTHONPATH); students receive the lab notebooks, never this code. Each hidden test cell calls one function
here; a failed check raises AssertionError with a message that says what is wrong, not how to fix the code.
The grading kernel imports this package before any student code runs (kernel_startup.py), so the torch
functions captured in `_common` are the originals even if a submission patches torch later.
"""

from checks import lab01, lab02, lab03, lab04

__all__ = ["lab01", "lab02", "lab03", "lab04"]
