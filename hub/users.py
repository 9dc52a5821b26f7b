"""System users for a hub: created with a home of their own (mode 0700) and a password PAM checks, and removed
with everything they own. `python -m hub start --create-users` and the class test use it; a real class uses the
machine's existing accounts."""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import subprocess
import time


def exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def create(name: str, password: str | None = None) -> str:
    """Create the system user `name` with a home and `password` (default: a fresh random one); returns the
    password. Refuses a name that exists (it may be someone's account)."""
    if exists(name):
        raise ValueError(f"system user {name!r} already exists; pick another name")
    password = password or secrets.token_urlsafe(12)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True)
    subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    return password


def processes(name: str) -> list[int]:
    """Process ids running as the user `name`."""
    uid = pwd.getpwnam(name).pw_uid
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except FileNotFoundError:
                continue
    return pids


def remove(name: str) -> None:
    """End every process of the user `name`, then delete the user, its group and its home."""
    if not exists(name):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while processes(name) and time.monotonic() < deadline:
            time.sleep(0.1)
    subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
