"""Runs ONE student's notebook inside the grading sandbox (this file is copied into the sandbox; it imports
nothing from the repository, which the sandbox cannot see).

    python runner.py JOB.json

The job names the notebook, the per-cell timeout and, for each graded cell, the probes to run right after it:
small programs (probes/<lab>.py) that call the student's functions on the trusted checker's inputs and write
plain data (numbers, lists, raw tensor values) to `io/<grade_id>.json`. The runner writes the executed
notebook and `report.json` (where it stopped and why). Everything it writes is untrusted: the student's code
runs in the same sandbox and may have changed any of it. The trusted checker outside decides the grades.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# jsonschema (under nbformat) imports `rfc3987_syntax` when installed, for one string format that notebooks
# never use; building its grammar costs about a second of CPU in every sandbox, a tenth of a whole lab's run.
# A None entry makes that optional import fail, and jsonschema goes on without the format.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbclient.exceptions import DeadKernelError  # noqa: E402


def probe_source(probe: dict, out: Path) -> str:
    """The code a probe cell runs: the probe module reads its inputs and writes its plain-data answer."""
    return f"import specdec_probe as _specdec_probe\n_specdec_probe.run({json.dumps(probe)!r}, {str(out)!r})\n"


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    workdir = Path(job_path).parent
    io = workdir / "io"
    io.mkdir(exist_ok=True)
    nb = nbformat.read(workdir / job["notebook"], as_version=4)
    probes_after = {int(index): probes for index, probes in job["probes"].items()}
    client = NotebookClient(nb, timeout=job["cell_timeout"], kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, record_timing=False,
                            resources={"metadata": {"path": str(workdir)}})
    report: dict = {"stopped_at": None, "reason": None, "timeouts": [], "seconds": {}}
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            started = time.monotonic()
            try:
                client.execute_cell(cell, index)
                for probe in probes_after.get(index, []):
                    scratch = nbformat.v4.new_code_cell(probe_source(probe, io / f"{probe['grade_id']}.json"))
                    client.execute_cell(scratch, index)
            except DeadKernelError:
                report.update(stopped_at=index, reason="kernel died")
                break
            except Exception as error:  # nbclient gives up on this kernel (it stopped answering)
                report.update(stopped_at=index, reason=f"kernel stopped responding ({type(error).__name__})")
                break
            finally:
                report["seconds"][index] = round(time.monotonic() - started, 2)
            if any(o.get("ename") == "KeyboardInterrupt" for o in cell.get("outputs", [])):
                report["timeouts"].append(index)
    nbformat.write(nb, workdir / "executed.ipynb")
    (workdir / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
