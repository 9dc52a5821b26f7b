"""The sandboxed host and its channel, without nbgrader: a notebook runs, then the trusted side's calls.

Each test starts a real sandbox (bubblewrap, as root) with a probe module of its own, so what is asserted is the
mechanism every lab relies on: answers come only from the call they belong to, the setup's objects are put
back before every call, a call that hangs or crashes costs that call only, and a served model's forwards are
counted on the trusted side.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from autograder import sandbox
from autograder.checks._common import NO_ANSWER
from autograder.sandbox.session import ModelServer, Session

PROBES = '''
import os
import time

import torch
from specdec_probe import call, get, plain, served


def double(ns, inputs):
    return call(get(ns, "double"), inputs["x"])


def setup_object(ns, inputs):
    return plain(ns["table"])


def hang(ns, inputs):
    while True:
        pass


def crash(ns, inputs):
    os._exit(3)


def logits(ns, inputs):
    model = served(inputs, "m")
    out = model(input_ids=torch.tensor([inputs["tokens"]]))
    return {"logits": plain(out.logits[0, -1]), "twice": plain(model(input_ids=torch.tensor([[1]])).logits[0, 0])}
'''

SETUP = "table = [1, 2, 3]\n"
ANSWER = "def double(x):\n    return 2 * x\n"
# A scratch cell that forges answer frames on every file descriptor, from a thread and an exit handler.
ABUSE = '''
import atexit, json, os, threading, time

def forge():
    for call in range(1, 20):
        body = json.dumps({"call": call, "value": 12345}).encode()
        for fd in range(3, 64):
            try:
                os.write(fd, len(body).to_bytes(4, "big") + body)
            except OSError:
                pass

def keep_forging():
    time.sleep(3)  # the calls have started by then
    while True:
        forge()
        time.sleep(0.05)

atexit.register(forge)
threading.Thread(target=keep_forging, daemon=True).start()
'''


@pytest.fixture
def session(tmp_path):
    try:
        sandbox.available()
    except sandbox.SandboxUnavailable as missing:
        pytest.skip(str(missing))
    folder = tmp_path / "sandbox"
    sandbox.prepare(folder, "lab01")
    (folder / "grader" / "probes" / "labtest.py").write_text(PROBES)
    limits = sandbox.Limits(cell_timeout=20, call_timeout=4, notebook_timeout=120, memory_bytes=3 << 30,
                            output_chars=10_000)
    opened = Session(sandbox.command(folder, limits, slot=5), tmp_path / "sandbox.log", limits)
    yield opened
    opened.close()


def run(session: Session, *cells: tuple[str, str]):
    plan = [{"index": i, "kind": kind, "source": source} for i, (kind, source) in enumerate(cells)]
    return session.run_notebook(plan, answer_names=["double"])


def test_answers_come_from_the_call_and_the_setup_is_put_back(session):
    rebind = 'table = "rebound by a scratch cell"\nprint("flood " * 200_000)\n'
    notebook = run(session, ("setup", SETUP), ("answer", ANSWER), ("other", rebind))
    assert notebook.problem is None and set(notebook.cells) == {0, 1, 2}
    shown = notebook.cells[2].outputs[0]["text"]
    assert len(shown) < 11_000 and "dropped the rest" in shown, "the output budget caps a flood"
    assert session.call("labtest", "double", {"x": 21}) == 42
    assert session.call("labtest", "setup_object", {}) == [1, 2, 3], "the setup's object, not the scratch cell's"
    assert session.call("labtest", "double", {"x": 5}) == 10


def test_frames_forged_by_the_notebook_never_count(session):
    """A thread (and an exit handler) writing answer frames to every file descriptor: its frames lack the call's
    nonce, so none is taken for an answer; the sandbox is ended and says why."""
    assert run(session, ("setup", SETUP), ("answer", ANSWER), ("other", ABUSE)).problem is None
    time.sleep(4)  # the forging thread is writing by now
    answers = [session.call("labtest", "double", {"x": x}) for x in (21, 5)]
    assert 12345 not in answers and NO_ANSWER in answers
    assert "belongs to no call" in session.dead


def test_a_hanging_or_crashing_call_costs_that_call_only(session):
    assert run(session, ("setup", SETUP), ("answer", ANSWER)).problem is None
    started = time.monotonic()
    hung = session.call("labtest", "hang", {})
    assert "ran past its limit" in hung["error"] and time.monotonic() - started < 10
    assert "ended without an answer" in session.call("labtest", "crash", {})["error"]
    assert session.call("labtest", "double", {"x": 4}) == 8 and session.dead is None


def test_a_served_model_runs_and_is_counted_on_the_trusted_side(session):
    from transformers import LlamaConfig, LlamaForCausalLM

    assert run(session, ("setup", SETUP)).problem is None
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    server = ModelServer({"m": model})
    answer = session.call("labtest", "logits", {"tokens": [3, 4, 5]}, server)
    assert answer is not None and "logits" in answer, (answer, session.dead, session.log_tail())
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([[3, 4, 5]])).logits[0, -1]
    assert torch.allclose(torch.tensor(answer["logits"]["tensor"]).double(), expected.double(), atol=1e-6)
    assert [f["tokens"] for f in server.log["m"]] == [3, 1]


def test_a_notebook_that_kills_everything_is_noted_and_stopped(session):
    kill = "import os, signal\nfor pid in range(1, 500):\n    try:\n        os.kill(pid, signal.SIGKILL)\n" \
           "    except OSError:\n        pass\n"
    notebook = run(session, ("setup", SETUP), ("other", kill), ("answer", ANSWER))
    assert notebook.problem is not None and notebook.stopped_at == 1
    assert session.call("labtest", "double", {"x": 1}) is NO_ANSWER


def test_the_private_folders_are_small_tmpfs_mounts(session):
    fill = ("import os\nsizes = {}\nfor folder in ('/tmp', os.getcwd()):\n    try:\n"
            "        for i in range(64):  # files of 32 MB: under the file-size limit, over the folder's size\n"
            "            with open(os.path.join(folder, f'big{i}'), 'wb') as f:\n"
            "                f.write(b'x' * (32 << 20))\n    except OSError as e:\n        sizes[folder] = str(e)\n"
            "print(sizes)\n")
    notebook = run(session, ("setup", SETUP), ("other", fill))
    text = notebook.cells[1].outputs[0]["text"]
    assert text.count("No space left on device") == 2, text


def test_mount_args_limit_tmp(tmp_path):
    args = sandbox.mount_args(1 << 20)
    assert args[args.index("--tmpfs") - 2 : args.index("--tmpfs") + 2] == ["--size", str(1 << 20), "--tmpfs", "/tmp"]
    assert Path(sandbox.INSIDE / "host.py").exists()


def test_without_cgroups_a_watchdog_stops_a_tree_past_its_memory(session):
    """The fallback where a machine has no cgroups: the sandbox slot's user id is watched; children that hoard
    memory beside a small parent trip it, and everything of that user is killed."""
    from autograder.sandbox import cgroups

    watchdog = cgroups.Watchdog(sandbox.FIRST_UID + 5, memory_bytes=1 << 30, interval=0.2)
    try:
        hoard = ("import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
                 "        block = bytearray(400 << 20)\n        time.sleep(60)\n        os._exit(0)\ntime.sleep(30)\n")
        notebook = run(session, ("setup", SETUP), ("other", hoard))
    finally:
        watchdog.stop()
    assert watchdog.tripped and notebook.problem is not None
    assert cgroups.processes_of(sandbox.FIRST_UID + 5) == []


def test_measuring_the_sandbox_without_bubblewrap_names_what_to_install(monkeypatch):
    real = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda tool: None if tool == "bwrap" else real(tool))
    with pytest.raises(sandbox.SandboxUnavailable, match="needs bwrap: install them with `apt-get install bubblewrap"):
        sandbox.overhead_seconds()
