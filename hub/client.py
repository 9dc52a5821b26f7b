"""A class on loopback, driven as a browser and JupyterLab drive it: a hub of temporary system users on free
ports (PAM logins over HTTP, API tokens made the way the token page makes them, servers started through the REST
API, code run in a user's kernel over its websocket, nbgrader's assignment actions). The class test
(tests/test_hub.py) and the load measurement (`python -m hub load`) use it; everything `running_hub` starts is
stopped and removed when it ends, even on an error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
import requests

from hub import course as course_steps
from hub import users
from hub.settings import REPO, HubSettings

PROXY = HubSettings.__dataclass_fields__["proxy_command"].default
LAB = "lab01_sampling"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Hub:
    """A running hub of temporary users, driven over HTTP like a browser and the REST API."""

    def __init__(self, settings: HubSettings, passwords: dict[str, str], process: subprocess.Popen, log: Path):
        self.settings, self.passwords, self.process, self.log = settings, passwords, process, log
        self.url = f"http://127.0.0.1:{settings.port}"
        self.tokens: dict[str, str] = {}

    def login(self, name: str, password: str | None = None) -> requests.Session:
        session = requests.Session()
        session.get(f"{self.url}/hub/login", timeout=30)
        answer = session.post(f"{self.url}/hub/login?next=", timeout=60, allow_redirects=False, data={
            "username": name, "password": password or self.passwords[name], "_xsrf": session.cookies["_xsrf"]})
        session.login_status = answer.status_code
        return session

    def token(self, name: str) -> str:
        """Log `name` in with their password, then make an API token the way the hub's token page does."""
        session = self.login(name)
        assert session.login_status == 302, f"login of {name} failed: {session.login_status}"
        answer = session.post(f"{self.url}/hub/api/users/{name}/tokens", json={"note": "class test"}, timeout=30,
                              headers={"X-XSRFToken": session.cookies["_xsrf"]})
        answer.raise_for_status()
        self.tokens[name] = answer.json()["token"]
        return self.tokens[name]

    def api(self, name: str, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", timeout=180,
                                headers={"Authorization": f"token {self.tokens[name]}"}, **kwargs)

    def start_server(self, name: str) -> None:
        answer = self.api(name, "POST", f"/hub/api/users/{name}/server")
        assert answer.status_code in (201, 202), answer.text + self.log.read_text()[-3000:]

    def wait_ready(self, name: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.api(name, "GET", f"/hub/api/users/{name}").json()
            server = model.get("servers", {}).get("", {})
            if server.get("ready"):
                return
            time.sleep(1)
        raise AssertionError(f"{name}'s server did not start; hub log:\n{self.log.read_text()[-4000:]}")

    def server(self, name: str, method: str, path: str, **kwargs) -> requests.Response:
        return self.api(name, method, f"/user/{name}{path}", **kwargs)

    def nbgrader_action(self, name: str, action: str, lab: str = LAB) -> dict | list:
        answer = self.server(name, "POST", f"/assignments/{action}",
                             data={"course_id": self.settings.course_id, "assignment_id": lab})
        answer.raise_for_status()
        return answer.json()

    def put_notebook(self, name: str, path: str, notebook) -> None:
        answer = self.server(name, "PUT", f"/api/contents/{path}",
                             json={"type": "notebook", "format": "json", "content": json.loads(
                                 nbformat.writes(notebook))})
        assert answer.status_code in (200, 201), answer.text

    def get_file(self, name: str, path: str) -> requests.Response:
        return self.server(name, "GET", f"/api/contents/{path}", params={"content": 1})

    def run_code(self, name: str, code: str, timeout: float = 120, keep_kernel: bool = False) -> str:
        """Run `code` in a new kernel of `name`'s server (over its websocket, as JupyterLab does); its stdout.
        The kernel is shut down afterwards unless `keep_kernel` (it then lives, as a student's would, until the
        server stops)."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        kernel = self.server(name, "POST", "/api/kernels", json={"name": "python3"}).json()["id"]
        url = f"ws://127.0.0.1:{self.settings.port}/user/{name}/api/kernels/{kernel}/channels"

        async def talk() -> str:
            # A kernel that many students start at once can take minutes to answer on a small machine.
            socket_ = await websocket_connect(HTTPRequest(url, connect_timeout=timeout, request_timeout=timeout,
                                                          headers={"Authorization": f"token {self.tokens[name]}"}))
            msg_id = uuid.uuid4().hex
            socket_.write_message(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": name, "session": msg_id,
                           "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            out = []
            while True:
                message = json.loads(await asyncio.wait_for(socket_.read_message(), timeout))
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = message["header"]["msg_type"]
                if kind == "stream":
                    out.append(message["content"]["text"])
                elif kind == "error":
                    out.append("\n".join(message["content"]["traceback"]))
                elif kind == "status" and message["content"]["execution_state"] == "idle":
                    socket_.close()
                    return "".join(out)

        try:
            return asyncio.run(talk())
        finally:
            if not keep_kernel:
                self.server(name, "DELETE", f"/api/kernels/{kernel}")


def stop_process_group(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)  # JupyterHub stops every server and its proxy on SIGTERM
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@contextlib.contextmanager
def running_hub(students: int):
    """A hub on loopback (free ports) with `students` temporary students and one instructor, a temporary
    exchange; removed with everything it started, even when the caller fails."""
    tag = secrets.token_hex(2)
    names = [f"sdh{tag}s{i}" for i in range(students)]
    teacher = f"sdh{tag}t"
    base = Path(tempfile.mkdtemp(prefix="specdec-hub-"))
    os.chmod(base, 0o755)  # the exchange inside it must be reachable by the students
    ports = [free_port() for _ in range(3)]
    process = None
    created: list[str] = []
    try:
        passwords = {}
        for name in [teacher, *names]:
            passwords[name] = users.create(name)
            created.append(name)
        settings = HubSettings(students=names, instructors=[teacher], state_dir=base / "state",
                               exchange_dir=base / "exchange",
                               course_dir=Path(pwd.getpwnam(teacher).pw_dir) / "course", port=ports[0],
                               proxy_command=PROXY, extra={"hub_port": ports[1], "proxy_api_port": ports[2]})
        course_steps.prepare(settings)
        log = base / "jupyterhub.log"
        with open(log, "w") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(REPO / "hub" / "jupyterhub_config.py")],
                cwd=settings.state_dir / "private", stdout=handle, stderr=subprocess.STDOUT,
                env=dict(os.environ, SPECDEC_HUB_SETTINGS=str(settings.settings_file)), start_new_session=True)
        hub = Hub(settings, passwords, process, log)
        deadline = time.monotonic() + 300  # JupyterHub starts in seconds idle, minutes on a busy 2-core box
        while True:
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{hub.url}/hub/api", timeout=5).status_code == 200:
                    break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        yield hub
    finally:
        if process is not None:
            stop_process_group(process)
            shutil.copy(base / "jupyterhub.log", Path(tempfile.gettempdir()) / "specdec-hub-test.log")
        for name in created:
            users.remove(name)
        shutil.rmtree(base, ignore_errors=True)
        assert all(port_free(p) for p in ports), "a port of the hub is still in use after it stopped"
        assert not any(users.exists(n) for n in created)
