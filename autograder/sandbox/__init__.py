"""The sandbox runner: executes one student's notebook in bubblewrap, as an unprivileged user, without network.

Inside the sandbox the student's kernel sees the system folders (/usr, /etc, ...) and the Python environment,
read-only, a private working folder holding only the notebook, the runner and the lab's probes
(sandbox/inside/), and an empty /tmp; nothing else exists there. The repository (solutions/, the checks, this
code) and any copy of it, the grading folder with the gradebook, the submissions and every home folder are
absent. Limits: wall time (the whole notebook), per-cell time (the
runner), address space, CPU seconds, processes (a user id of its own per concurrent sandbox, so a fork bomb
exhausts only its own quota) and file size. Killing anything inside reaches nothing outside: the sandbox has
its own process namespace.

Requires `bwrap` (Debian/Ubuntu package `bubblewrap`), `setpriv` and `prlimit` (util-linux), and root, to
map the sandbox to its own user ids. `available()` says what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

INSIDE = Path(__file__).resolve().parent / "inside"
FIRST_UID = 61000  # sandbox slot i runs as user id FIRST_UID + i
MOUNT = "/tmp/lab"  # the private working folder, as the student's code sees it


@dataclass
class Limits:
    """Per-submission limits: seconds per cell, seconds for the whole notebook, address space, CPU seconds,
    processes and threads, and the largest file or output the notebook may write."""

    cell_timeout: int = 60
    notebook_timeout: int = 900
    memory_bytes: int = 6 << 30
    cpu_seconds: int = 900
    processes: int = 256
    file_bytes: int = 64 << 20
    output_chars: int = 1_000_000


@dataclass
class Run:
    """What came back from one sandbox: its folder (all untrusted content), exit status, wall seconds, and
    `problem` when the sandbox itself failed (timeout, crash) rather than a cell."""

    folder: Path
    returncode: int
    seconds: float
    problem: str | None = None
    log: str = ""
    report: dict = field(default_factory=dict)


class SandboxUnavailable(RuntimeError):
    """The machine cannot run the sandbox (a missing tool or not root); the message says what to install."""


def available() -> None:
    """Raise SandboxUnavailable naming what is missing, or return when sandboxed grading can run."""
    missing = [tool for tool in ("bwrap", "setpriv", "prlimit") if shutil.which(tool) is None]
    if missing:
        raise SandboxUnavailable(f"sandboxed grading needs {', '.join(missing)}: install them with "
                                 "`apt-get install bubblewrap util-linux` (Debian/Ubuntu)")
    if os.geteuid() != 0:
        raise SandboxUnavailable("sandboxed grading must run as root, so that each sandbox gets a user id of its "
                                 "own (run the grade command with sudo)")


SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys"]


def python_roots() -> list[Path]:
    """The folders the sandbox's Python needs: the environment and the interpreter it was made from."""
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
             Path(os.path.realpath(sys.executable)).parent.parent}
    return sorted(r for r in roots if not any(r.is_relative_to(s) and r != s for s in map(Path, SYSTEM)))


def mount_args() -> list[str]:
    """bwrap arguments for the sandbox's file system: the system folders and the Python environment, read-only,
    and nothing else (no /home, /root, /work, /srv, /var, /mnt: no repository copy, no submissions, no
    gradebook), plus a private /tmp, /dev and /proc. The private /tmp comes first, so that an environment that
    lives under /tmp (a CI clone, say) is mounted on top of it rather than hidden by it."""
    args = ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
    for path in SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    made: set[Path] = set()
    for root in python_roots():
        for parent in reversed(root.parents):
            if parent != Path("/") and parent not in made and not any(parent.is_relative_to(s) for s in SYSTEM):
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        args += ["--ro-bind", str(root), str(root)]
    return args


def environment(limits: Limits) -> dict[str, str]:
    """The complete environment of the sandboxed runner and kernel (nothing is inherited)."""
    return {
        "HOME": f"{MOUNT}/home", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": f"{MOUNT}/grader", "IPYTHONDIR": f"{MOUNT}/grader/ipython",
        "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime", "JUPYTER_PLATFORM_DIRS": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
        "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1", "NBGRADER_EXECUTION": "autograde",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LANG": "C.UTF-8",
        "SPECDEC_GRADER_OUTPUT_CHARS": str(limits.output_chars),
    }


def prepare(folder: Path, lab: str, notebook, probes: dict[int, list[dict]], limits: Limits, slot: int) -> None:
    """Lay out one sandbox's private folder: the notebook, the job, the runner and this lab's probes."""
    import nbformat

    folder.mkdir(parents=True)
    (folder / "home").mkdir()
    grader = folder / "grader"
    shutil.copytree(INSIDE, grader, ignore=shutil.ignore_patterns("__pycache__"))
    startup = grader / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    shutil.move(grader / "kernel_startup.py", startup / "00-specdec-grading.py")
    for other in (grader / "probes").glob("lab*.py"):
        if other.stem != lab.split("_")[0]:
            other.unlink()  # only this lab's probes go in
    nbformat.write(notebook, folder / "notebook.ipynb")
    job = {"notebook": "notebook.ipynb", "cell_timeout": limits.cell_timeout,
           "probes": {str(index): plist for index, plist in probes.items()}}
    (folder / "job.json").write_text(json.dumps(job))
    uid = FIRST_UID + slot
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)


def command(folder: Path, limits: Limits, slot: int) -> list[str]:
    uid = str(FIRST_UID + slot)
    bwrap = ["bwrap", *mount_args(), "--bind", str(folder), MOUNT, "--chdir", MOUNT,
             "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in environment(limits).items():
        bwrap += ["--setenv", key, value]
    limit = ["prlimit", f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
             f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}", "--core=0"]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]
    return [*bwrap, "--", *limit, "--", *drop, sys.executable, f"{MOUNT}/grader/runner.py", f"{MOUNT}/job.json"]


def run(folder: Path, limits: Limits, slot: int) -> Run:
    """Run the prepared sandbox in `folder`; never raises for anything the notebook does."""
    started = time.monotonic()
    process = subprocess.Popen(command(folder, limits, slot), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    problem = None
    try:
        log, _ = process.communicate(timeout=limits.notebook_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        log, _ = process.communicate()
        problem = f"the notebook ran past the grader's limit of {limits.notebook_timeout} s and was stopped"
    text = log.decode(errors="replace")[-4000:]
    report = read_json(folder, folder / "report.json", 1 << 20)
    if problem is None and (process.returncode != 0 or not isinstance(report, dict)):
        problem = (f"the sandbox stopped with exit status {process.returncode} before the notebook finished "
                   "(a memory, process or CPU limit, or the runner was killed)")
    return Run(folder, process.returncode, time.monotonic() - started, problem, text,
               report if isinstance(report, dict) else {})


def inside(folder: Path, path: Path) -> bool:
    """True when `path` is a plain file really inside `folder` (no link leads out of it)."""
    try:
        return (not path.is_symlink() and path.is_file()
                and path.resolve().is_relative_to(folder.resolve()))
    except OSError:
        return False


def read_text(folder: Path, path: Path, max_bytes: int) -> str | None:
    """An untrusted file written inside the sandbox: None when missing, too large, or a link out of `folder`."""
    try:
        if not inside(folder, path) or path.stat().st_size > max_bytes:
            return None
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_json(folder: Path, path: Path, max_bytes: int):
    """Untrusted JSON from the sandbox (see read_text); None when it does not parse."""
    text = read_text(folder, path, max_bytes)
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return None


def overhead_seconds(repeats: int = 5) -> float:
    """Median extra seconds that starting Python inside a sandbox costs over starting it directly."""
    import statistics
    import tempfile

    def timed(cmd: list[str]) -> float:
        started = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.monotonic() - started

    with tempfile.TemporaryDirectory(prefix="specdec-overhead-") as tmp:
        folder = Path(tmp) / "sandbox"
        folder.mkdir()
        os.chown(folder, FIRST_UID, FIRST_UID)
        inside = command(folder, Limits(), 0)
        inside[-2:] = ["-c", "import torch"]
        direct = [sys.executable, "-c", "import torch"]
        gaps = [timed(inside) - timed(direct) for _ in range(repeats)]
    return statistics.median(gaps)
