"""A JupyterLab started the way a student starts it (`make lab`), on a temporary copy of the course.

`copy_course` copies this checkout's files (tracked and new, not ignored) into a fresh git repository;
`start_lab` runs `make lab` (or `make instructor`) in that copy with this environment's Jupyter, on a free
loopback port, and reads the URL with its token from the log.
Jupyter's own user folders (settings, workspaces, runtime files) are redirected into the copy's temporary
parent so a test run never touches the developer's.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)  # the environment running the tests: its jupyter, its kernels
URL = re.compile(r"(http://127\.0\.0\.1:(\d+)/\S*\?token=[0-9a-f]+)")


def git(*args: str, cwd: Path) -> str:
    """Run git in `cwd` (a throwaway identity for commits) and return its output."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
           "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make(target: str, cwd: Path, *variables: str, **popen) -> subprocess.Popen:
    """Start `make TARGET` in `cwd` with this environment as the course's venv (its install stamp taken as made)."""
    command = ["make", "--no-print-directory", "-o", str(VENV / ".installed-stamp"), target, f"VENV={VENV}",
               *variables]
    return subprocess.Popen(command, cwd=cwd, **popen)


def copy_course(dest: Path, skip: tuple[str, ...] = ("specdec_lab/zoo/",)) -> Path:
    """Copy the checkout's files into `dest`, a new git repository with one commit. skip: path prefixes left out
    (the kernels import the installed package, so the shipped weights are not needed twice). Returns `dest`."""
    files = git("ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=REPO).split("\0")
    for name in files:
        source = REPO / name
        if name and source.is_file() and not name.startswith(skip):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git("init", "-q", "-b", "main", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", "course", cwd=dest)
    return dest


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LabServer:
    """A running JupyterLab: its process, the URL it printed, the server's base address and token."""

    process: subprocess.Popen
    url: str
    base: str
    token: str
    log: Path

    def page(self, path: str, **query: str) -> str:
        """The address of `path` (e.g. "lab/tree/lessons/x.ipynb") with the token and extra query flags."""
        flags = "".join(f"&{key}" if value == "" else f"&{key}={value}" for key, value in query.items())
        return f"{self.base}/{path}?token={self.token}{flags}"

    def stop(self) -> None:
        """Stop the server: SIGTERM to its process group (make and jupyter; Jupyter then shuts its kernels
        down), wait until the group is gone, SIGKILL after 30 s."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.process.poll()
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_lab(course: Path, target: str = "lab", timeout: float = 300.0, env: dict | None = None) -> LabServer:
    """Run `make TARGET` (lab or instructor) in `course` on a free port and wait until it prints its URL.

    env: extra environment variables (the kernels inherit them). The log goes to `course/../TARGET.log`; raises
    RuntimeError with the log's tail when no URL comes in time.
    """
    home = course.parent / f"jupyter-home-{target}"
    news = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false"}')  # no "official Jupyter news?" toast over the page
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), **(env or {})}
    log = course.parent / f"{target}.log"
    with log.open("w") as sink:
        process = make(target, course, f"LAB_ARGS=--port={free_port()} --ServerApp.port_retries=0 --no-browser",
                       env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = URL.search(log.read_text())
        if found:
            url = found.group(1)
            parts = urlparse(url)
            return LabServer(process, url, f"{parts.scheme}://{parts.netloc}", parse_qs(parts.query)["token"][0], log)
        if process.poll() is not None:
            break
        time.sleep(0.5)
    LabServer(process, "", "", "", log).stop()
    raise RuntimeError(f"`make {target}` printed no URL within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
