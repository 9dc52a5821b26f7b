"""Command line of the course hub (run from the repository root, as root: PAM and the per-user servers need it).

    python -m hub start --students alice bob --instructors teacher [--port 8000] [--create-users]
    python -m hub stop                      # stop the hub and every user's server
    python -m hub release LAB [--force]     # the lab's student version into the exchange
    python -m hub close LAB                 # no more submissions of LAB
    python -m hub collect LAB               # the latest submission of each student into the course's submitted/
    python -m hub grade LAB                 # python -m autograder grade on them; scores into the gradebook
    python -m hub feedback LAB              # the feedback pages through nbgrader's feedback exchange
    python -m hub nbgrader-config --exchange DIR   # a server's nbgrader configuration (the Kubernetes image)
    python -m hub load --students 20 [--out F]     # measure: N temporary students running lesson 1 at once

Every command but start reads the hub's settings from HUB_DIR (default /srv/specdec-lab-hub); --course ID
checks that the hub serves that course.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hub import course as course_steps
from hub import users
from hub.settings import COURSE_ID, HUB, HubSettings, SettingsError, exchange_config, exchange_file

DEFAULT_HUB_DIR = Path(os.environ.get("HUB_DIR", "/srv/specdec-lab-hub"))


def settings_from(hub_dir: Path) -> HubSettings:
    return HubSettings.load(hub_dir / "state" / "settings.json")


def new_settings(args: argparse.Namespace) -> HubSettings:
    import pwd

    first = args.instructors[0] if args.instructors else ""
    try:
        home = Path(pwd.getpwnam(first).pw_dir)
    except KeyError:
        home = Path("/home") / first
    return HubSettings(students=args.students, instructors=args.instructors, state_dir=args.hub_dir / "state",
                       exchange_dir=args.hub_dir / "exchange", course_dir=args.course_dir or home / "course",
                       port=args.port, course_id=args.course or "specdec-lab",
                       **({"proxy_command": args.proxy} if args.proxy else {}))


def start(args: argparse.Namespace) -> int:
    settings = new_settings(args)
    if os.geteuid() != 0:
        raise SettingsError("the hub runs as root: PAM reads the password database and each server runs as its "
                            "user (sudo make hub ...)")
    if not os.access(settings.proxy_command, os.X_OK):
        raise SettingsError(f"configurable-http-proxy not found at {settings.proxy_command}: `make hub-proxy` "
                            "installs it with npm")
    if args.create_users:
        for name in settings.users:
            if not users.exists(name):
                print(f"created system user {name} with password {users.create(name)}")
    course_steps.prepare(settings)
    env = dict(os.environ, SPECDEC_HUB_SETTINGS=str(settings.settings_file))
    print(f"the course hub: log in at http://127.0.0.1:{settings.port}/hub/login as one of "
          f"{', '.join(settings.users)} (system passwords); Ctrl-C or `make hub-stop` stops it", flush=True)
    hub = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(HUB / "jupyterhub_config.py")],
                           cwd=settings.state_dir / "private", env=env)
    try:
        return hub.wait()
    except KeyboardInterrupt:
        hub.send_signal(signal.SIGTERM)
        return hub.wait()


def stop(hub_dir: Path) -> int:
    pid_file = settings_from(hub_dir).state_dir / "private" / "jupyterhub.pid"
    if not pid_file.is_file():
        print("the hub is not running")
        return 0
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print("the hub is not running")
        return 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print("the hub stopped (with every user's server)")
            return 0
        time.sleep(0.2)
    print(f"the hub (pid {pid}) did not stop in 30 s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hub", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub-dir", type=Path, default=DEFAULT_HUB_DIR, help="the hub's state and exchange")
    parser.add_argument("--course", help="the course id (default: the hub's, specdec-lab)")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("start", help="start the hub on 127.0.0.1 (foreground)")
    st.add_argument("--students", nargs="+", default=[])
    st.add_argument("--instructors", nargs="+", default=[])
    st.add_argument("--port", type=int, default=8000)
    st.add_argument("--course-dir", type=Path, help="the instructor's course folder (default ~INSTRUCTOR/course)")
    st.add_argument("--proxy", type=Path, help="configurable-http-proxy executable")
    st.add_argument("--create-users", action="store_true", help="create missing system users (random passwords)")
    sub.add_parser("stop", help="stop the hub")
    nbc = sub.add_parser("nbgrader-config", help="print the nbgrader configuration of a server (the k8s image)")
    nbc.add_argument("--exchange", type=Path, required=True, help="the exchange root as the server sees it")
    load = sub.add_parser("load", help="how many students this machine holds (temporary users, a hub of its own)")
    load.add_argument("--students", type=int, default=20)
    load.add_argument("--cells", type=int, default=2, help="lesson 1's first code cells to run (default 2)")
    load.add_argument("--out", type=Path, help="write the figures as JSON")
    for name in ("release", "close", "collect", "grade", "feedback"):
        step = sub.add_parser(name)
        step.add_argument("lab")
        if name == "release":
            step.add_argument("--force", action="store_true", help="replace an earlier release")
        if name == "grade":
            step.add_argument("--workers", type=int, default=2, help="sandboxes at once (default 2)")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return start(args)
        if args.command == "stop":
            return stop(args.hub_dir)
        if args.command == "load":
            from hub import load as class_load

            if os.geteuid() != 0 or args.students < 1:
                raise SettingsError("load needs root (temporary system users, one server each) and --students >= 1")
            return class_load.main(args.students, args.out, args.cells)
        if args.command == "nbgrader-config":
            print(exchange_file(exchange_config(args.exchange, args.course or COURSE_ID)), end="")
            return 0
        settings = settings_from(args.hub_dir)
        course_steps.check_course(settings, args.course)
        if args.command == "release":
            print(course_steps.release(settings, args.lab, args.force))
        elif args.command == "close":
            print(course_steps.close(settings, args.lab))
        elif args.command == "collect":
            print("\n".join(course_steps.collect(settings, args.lab)))
        elif args.command == "grade":
            for g in course_steps.grade(settings, args.lab, args.workers):
                print(f"{g.student:>24}  {g.score:5g} / {g.max_score:g}  {g.status}")
            print(f"recorded in {settings.course_dir / 'gradebook.db'}; `python -m hub feedback {args.lab}` "
                  "returns the feedback")
        elif args.command == "feedback":
            print("\n".join(course_steps.return_feedback(settings, args.lab)))
    except (SettingsError, course_steps.CourseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
