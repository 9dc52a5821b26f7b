"""`python -m autograder.nbgrader_main ARGS`: nbgrader's own command line, started as a module of this package
so that `autograder/__init__.py` runs first and the process skips the import it skips (about 3 s of every
nbgrader start)."""

import sys

from nbgrader.apps.nbgraderapp import main

if __name__ == "__main__":
    sys.exit(main())
