"""The sandbox: one student's notebook runs in bubblewrap, as an unprivileged user, without network.

The process inside is the grading host (inside/host.py), driven over two pipes by the trusted side (session.py): it
runs the notebook's cells, then the checker's calls. It sees the system folders (/usr, /etc, ...) and the Python
environment, read-only, a private working folder holding only the host, the probe helpers and the lab's probes
(sandbox/inside/), and an empty /tmp; nothing else exists there. The repository (solutions/, the checks, this code)
and any copy of it, the grading folder with the gradebook, the submissions and every home folder are absent.
Limits: wall time (the whole notebook), per-cell time (the runner), address space, CPU seconds, processes (a user
id of its own per concurrent sandbox, so a fork bomb exhausts only its own quota) and file size. Killing anything
inside reaches nothing outside: the sandbox has its own process namespace.

Requires `bwrap` (Debian/Ubuntu package `bubblewrap`), `setpriv` and `prlimit` (util-linux), and root, to map the
sandbox to its own user ids. `available()` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

INSIDE = Path(__file__).resolve().parent / "inside"
FIRST_UID = 61000  # sandbox slot i runs as user id FIRST_UID + i
MOUNT = "/tmp/lab"  # the private working folder, as the student's code sees it


@dataclass
class Limits:
    """Per-submission limits: seconds per cell, per checker call and for the whole notebook, address space, CPU
    seconds, processes and threads, and the largest file or output the notebook may write."""

    cell_timeout: int = 60
    call_timeout: int = 60
    notebook_timeout: int = 900
    memory_bytes: int = 6 << 30
    cpu_seconds: int = 900
    processes: int = 256
    file_bytes: int = 64 << 20
    output_chars: int = 1_000_000
    # Each of the two writable folders (/tmp and the private folder) is a tmpfs of this size; what it holds counts
    # against the memory limit too.
    tmp_bytes: int = 256 << 20
    # CPU cores the sandbox's whole process tree may use (cgroups; where the machine has them).
    cpus: float = 1.0


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


def mount_args(tmp_bytes: int = Limits.tmp_bytes) -> list[str]:
    """bwrap arguments for the sandbox's file system: the system folders and the Python environment, read-only,
    and nothing else (no /home, /root, /work, /srv, /var, /mnt: no repository copy, no submissions, no
    gradebook), plus a private /tmp of `tmp_bytes`, /dev and /proc. The private /tmp comes first, so that an
    environment that lives under /tmp (a CI clone, say) is mounted on top of it rather than hidden by it."""
    args = ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
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
    """The complete environment of the sandboxed host (nothing is inherited)."""
    return {
        "HOME": f"{MOUNT}/home", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": f"{MOUNT}/grader", "IPYTHONDIR": f"{MOUNT}/home/.ipython",
        "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime", "JUPYTER_PLATFORM_DIRS": "1",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
        "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1", "NBGRADER_EXECUTION": "autograde",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LANG": "C.UTF-8",
        # plotly's figures become a mime bundle (no browser is started in the sandbox).
        "PLOTLY_RENDERER": "plotly_mimetype",
    }


def prepare(folder: Path, lab: str) -> None:
    """Lay out the files one sandbox reads: the host, the probe helpers and this lab's probes (no notebook and
    no inputs: the cells and every call's inputs arrive over the pipe). The sandbox sees them read-only."""
    folder.mkdir(parents=True)
    grader = folder / "grader"
    shutil.copytree(INSIDE, grader, ignore=shutil.ignore_patterns("__pycache__"))
    for other in (grader / "probes").glob("lab*.py"):
        if other.stem != lab.split("_")[0]:
            other.unlink()  # only this lab's probes go in
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def command(folder: Path, limits: Limits, slot: int) -> list[str]:
    """The sandboxed host's command line; the session appends the numbers of the two pipes it passes in.

    The private folder (MOUNT) is a tmpfs of its own size, with the grader's files bound into it read-only:
    nothing the notebook writes reaches the grader's disk, and nothing is read back from it."""
    uid = str(FIRST_UID + slot)
    private = ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", MOUNT,
               "--ro-bind", str(folder / "grader"), f"{MOUNT}/grader", "--perms", "1777", "--dir", f"{MOUNT}/home"]
    bwrap = ["bwrap", *mount_args(limits.tmp_bytes), *private, "--chdir", MOUNT,
             "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in environment(limits).items():
        bwrap += ["--setenv", key, value]
    limit = ["prlimit", f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
             f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}", "--core=0"]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]
    return [*bwrap, "--", *limit, "--", *drop, sys.executable, f"{MOUNT}/grader/host.py"]


def overhead_seconds(repeats: int = 5) -> float:
    """Median extra seconds that starting Python inside a sandbox costs over starting it directly (raises
    SandboxUnavailable, naming what is missing, where no sandbox can start)."""
    import statistics
    import tempfile

    available()
    def timed(cmd: list[str]) -> float:
        started = time.monotonic()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.monotonic() - started

    with tempfile.TemporaryDirectory(prefix="specdec-overhead-") as tmp:
        folder = Path(tmp) / "sandbox"
        prepare(folder, "lab01")
        inside = command(folder, Limits(), 0)
        inside[-1:] = ["-c", "import torch"]
        direct = [sys.executable, "-c", "import torch"]
        gaps = [timed(inside) - timed(direct) for _ in range(repeats)]
    return statistics.median(gaps)
