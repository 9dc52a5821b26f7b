"""The specdec-lab autograder: nbgrader configuration, lab rules, hidden checks and the grading pipeline.

Run it as `python -m autograder --help` from the repository root.
"""
