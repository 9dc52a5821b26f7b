"""Limits for a sandbox's whole process tree, not per process: memory, processes and CPU (cgroup v1).

A process limit (prlimit) binds each process alone: a notebook that starts children multiplies its memory, and
CPU spinners started in sessions of their own slow a neighbour graded at the same time. A control group holds
the sandbox's every process: its memory is counted together (tmpfs pages it writes included), its process
count is capped, and its CPU time is capped at `Limits.cpus` cores with an equal share beside the others, so an
abuser cannot take a neighbour's core. When grading ends, every process still in the group is killed.

These machines mount the v1 controllers `memory`, `pids` and `cpu` under /sys/fs/cgroup, writable as root.
Where they are missing or not writable, `create` returns None and a `Watchdog` takes their place: every
sandbox slot runs as a user id of its own, so the watchdog sums the memory of that user's processes twice a
second and kills them all past the limit, and kills whatever is left when grading ends. It cannot share the
CPU out; the row's notes say that this machine had no cgroups.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "specdec-grading"
CPU_PERIOD_US = 100_000


@dataclass
class Group:
    """One sandbox's control group, a folder under each controller."""

    folders: list[Path]

    def wrap(self, command: list[str]) -> list[str]:
        """`command`, started inside the group (a shell puts itself in, then becomes the command)."""
        enter = "; ".join(f"echo $$ > {folder / 'cgroup.procs'}" for folder in self.folders)
        return ["sh", "-c", f'{enter} && exec "$@"', "sh", *command]

    def memory_limit_hit(self) -> bool:
        """Whether the tree reached its memory limit (the kernel then reclaims or kills inside the group)."""
        try:
            return int((self.folders[0] / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def remove(self) -> None:
        """Kill every process left in the group, then remove its folders."""
        for _ in range(100):
            pids = {int(p) for folder in self.folders for p in read_lines(folder / "cgroup.procs")}
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for folder in self.folders:
            try:
                folder.rmdir()
            except OSError:
                pass


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def create(name: str, memory_bytes: int, processes: int, cpus: float) -> Group | None:
    """A group `name` with these limits under every controller, or None where the machine cannot make one."""
    settings = {
        "memory": {"memory.limit_in_bytes": memory_bytes, "memory.swappiness": 0},
        "pids": {"pids.max": processes},
        "cpu": {"cpu.shares": 1024, "cpu.cfs_period_us": CPU_PERIOD_US,
                "cpu.cfs_quota_us": int(cpus * CPU_PERIOD_US)},
    }
    group = Group([])
    try:
        for controller in CONTROLLERS:
            folder = ROOT / controller / PARENT / name
            folder.mkdir(parents=True, exist_ok=True)
            group.folders.append(folder)
            for key, value in settings[controller].items():
                (folder / key).write_text(str(value))
    except OSError:
        group.remove()
        return None
    return group


def processes_of(uid: int) -> list[tuple[int, int]]:
    """(pid, proportional memory in bytes) of every process running as `uid`. The proportional set size
    shares each page among the processes that map it, so a forked child is not counted twice."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            rollup = Path(f"/proc/{entry}/smaps_rollup").read_text()
        except OSError:
            continue
        pss = next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
        found.append((int(entry), pss << 10))
    return found


class Watchdog:
    """Limits on a sandbox's whole process tree without cgroups: the processes of its user id, measured."""

    def __init__(self, uid: int, memory_bytes: int, interval: float = 0.5):
        self.uid, self.memory_bytes, self.interval = uid, memory_bytes, interval
        self.tripped = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.done.wait(self.interval):
            if sum(rss for _, rss in processes_of(self.uid)) > self.memory_bytes:
                self.tripped = True
                self.kill_all()

    def kill_all(self) -> None:
        for pid, _ in processes_of(self.uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop watching and kill whatever the sandbox left running."""
        self.done.set()
        self.thread.join()
        self.kill_all()
