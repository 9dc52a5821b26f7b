"""JupyterHub configuration of the course hub (loaded by `jupyterhub -f hub/jupyterhub_config.py`, which
`python -m hub start` runs; the settings come from the JSON file named by SPECDEC_HUB_SETTINGS, see
hub/settings.py).

- Loopback only: the hub (and its proxy) listen on 127.0.0.1; the single-user servers on 127.0.0.1 too.
- Authentication: PAM, as a machine's own logins (system users and their passwords); only the course's users are
  allowed, nobody is an admin, and there is no open sign-up.
- Each user's server runs as that user (LocalProcessSpawner), from the project's install, with the JupyterLab
  configuration `make lab` uses for students (jupyter/student) or `make instructor` (jupyter/instructor), and
  nbgrader's exchange for the course on its config path.
"""

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # `hub` importable as a package when JupyterHub loads this file

from hub import settings as hub_settings  # noqa: E402

c = get_config()  # noqa: F821 - provided by traitlets when JupyterHub loads this file
settings = hub_settings.HubSettings.load(Path(os.environ["SPECDEC_HUB_SETTINGS"]))
private = settings.state_dir / "private"
public = settings.state_dir / "public"

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = settings.port
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = settings.extra.get("hub_port", 0) or settings.port + 1
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.extra.get('proxy_api_port', settings.port + 2)}"
c.ConfigurableHTTPProxy.command = [str(settings.proxy_command)]
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = f"sqlite:///{private / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(private / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(private / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True

c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(settings.users)
c.Authenticator.admin_users = set()
c.Authenticator.allow_all = False
c.Authenticator.allow_existing_users = False
c.PAMAuthenticator.open_sessions = False  # no login session (utmp, systemd) per server: containers have none

c.JupyterHub.spawner_class = "localprocess"
SERVER_PYTHON = Path(settings.extra.get("server_python", settings.venv / "bin" / "python"))
c.Spawner.cmd = [str(SERVER_PYTHON), "-m", "jupyterhub.singleuser"]
c.Spawner.ip = "127.0.0.1"
c.Spawner.notebook_dir = "~"
START = hub_settings.REPO / "lessons" / "00_start_here.ipynb"  # the course map, as `make lab` opens it
c.Spawner.default_url = f"/lab/tree/lessons/{START.name}" if START.exists() else "/lab/tree/lessons"
c.Spawner.start_timeout = 180  # a busy 2-core machine needs most of a minute to start JupyterLab
c.Spawner.http_timeout = 180
c.Spawner.args = ["--ServerApp.ip=127.0.0.1"]


def prepare_server(spawner) -> None:
    """Before a user's server starts: their role's JupyterLab and nbgrader configuration on the config path, the
    project's install first on PATH, and (students) a copy of the lessons in their home, owned by them."""
    role = settings.role(spawner.user.name)
    spawner.environment = {
        "JUPYTER_CONFIG_PATH": os.pathsep.join([str(hub_settings.REPO / "jupyter" / role),
                                                str(public / "nbgrader" / role)]),
        "PYTHONPATH": str(public / "python"),  # the `hub` package only: its exchange classes
        # the install's data (JupyterLab's extensions, nbgrader's templates), also when the server's interpreter
        # is the stand-in of course.server_python
        "JUPYTER_PATH": str(settings.venv / "share" / "jupyter"),
        "PATH": os.pathsep.join([str(SERVER_PYTHON.parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "OMP_NUM_THREADS": str(settings.extra.get("threads_per_student", 1)),
    }
    lab_settings = hub_settings.REPO / "jupyter" / role / "lab-settings"  # as `make lab` / `make instructor`
    spawner.args = ["--ServerApp.ip=127.0.0.1",
                    *([f"--LabApp.app_settings_dir={lab_settings}"] if lab_settings.is_dir() else [])]
    import pwd

    user = pwd.getpwnam(spawner.user.name)
    lessons = Path(user.pw_dir) / "lessons"
    if not lessons.exists():
        shutil.copytree(hub_settings.REPO / "lessons", lessons)
        for folder, _, files in os.walk(lessons):
            os.chown(folder, user.pw_uid, user.pw_gid)
            for name in files:
                os.chown(os.path.join(folder, name), user.pw_uid, user.pw_gid)


c.Spawner.pre_spawn_hook = prepare_server
