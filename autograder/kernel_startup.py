"""Runs inside every grading kernel before the first cell (installed as an IPython startup file by the pipeline).

It makes the kernel a safe place to run one student's notebook:

- resource limits: address space (a memory bomb gets a MemoryError instead of starving the machine) and
  total CPU seconds (a kernel that outlives every per-cell timeout is killed);
- stderr goes to stdout: nbgrader gives 0 to a test cell that writes anything to stderr, and a library
  warning must not cost a passing test its points (errors still fail: they are sent as error messages);
- output is capped, so a flood of prints cannot exhaust the grader's memory;
- warnings are silenced and the hidden checks are imported now, before any student code runs, so they
  hold the original torch functions even if a submission patches them later.
"""


def _prepare_grading_kernel() -> None:
    import io
    import os
    import resource
    import sys
    import warnings

    memory = int(os.environ.get("SPECDEC_GRADER_MEMORY_BYTES", "0"))
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(os.environ.get("SPECDEC_GRADER_CPU_SECONDS", "0"))
    if cpu > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
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
    sys.stderr = sys.stdout
    try:
        import checks  # noqa: F401 - imported early on purpose (see the module docstring)
    except ImportError:
        pass


_prepare_grading_kernel()
del _prepare_grading_kernel
