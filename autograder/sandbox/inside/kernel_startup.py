"""Runs inside every grading kernel before the first cell (installed as an IPython startup file).

It keeps one notebook's output bounded: stdout and stderr are capped (a flood of prints cannot exhaust the
runner's memory) and warnings are silenced. It is a courtesy to the runner, not a defence: the student's code
can undo it, and then only its own sandbox pays (limits are set outside, by the sandbox).
"""


def _cap_output() -> None:
    import io
    import os
    import sys
    import warnings

    warnings.simplefilter("ignore")

    class CappedStream(io.TextIOBase):
        """Forwards writes to `target` until `budget` characters have passed, then drops them (said once)."""

        def __init__(self, target, budget: int):
            self.target = target
            self.budget = budget

        def write(self, text: str) -> int:
            if self.budget > 0:
                self.target.write(text[: self.budget])
                if len(text) > self.budget:
                    self.target.write("\n[the grader dropped the rest of this notebook's output]\n")
                self.budget -= len(text)
            return len(text)

        def flush(self) -> None:
            self.target.flush()

        def isatty(self) -> bool:
            return False

        def __getattr__(self, name: str):
            # ipykernel calls set_parent() and friends on sys.stdout to route output to the running cell.
            return getattr(self.target, name)

    budget = int(os.environ.get("SPECDEC_GRADER_OUTPUT_CHARS", "1000000"))
    sys.stdout = CappedStream(sys.stdout, budget)
    sys.stderr = CappedStream(sys.stderr, budget)


_cap_output()
del _cap_output
