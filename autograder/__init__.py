"""The specdec-lab autograder: nbgrader configuration, lab rules, hidden checks and the grading pipeline.

Run it as `python -m autograder --help` from the repository root.
"""

import sys

# jsonschema (under nbformat, which the grader and every nbgrader process import) imports `rfc3987_syntax` when
# it is installed, to check a string format that notebooks never use; building its grammar costs about 3 s of CPU
# on this course's 2-core machines, once per process. Without it jsonschema simply does not check that format.
sys.modules.setdefault("rfc3987_syntax", None)
