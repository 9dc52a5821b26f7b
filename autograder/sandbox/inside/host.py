"""The grading host: ONE student's notebook, then the trusted checker's calls, inside the sandbox.

    python host.py REQUESTS_FD ANSWERS_FD

It imports nothing from the repository (the sandbox cannot see it). Everything comes and goes as frames
(frames.py) over two pipes that the trusted side opened before the sandbox started:

1. The job: the notebook's code cells in order (source and kind), the per-cell and per-call time limits, the
   output budget, and the names that the lab's answer cells define.
2. The cells run one after the other in one IPython shell, as the notebook would run in a kernel; each cell's
   outputs go back as a frame. They are shown in the feedback and believed for nothing else.
3. Then, for each call the checker makes (a probe's name, the inputs drawn for it, sent only now, and a nonce
   that the frames sent back for this call must carry), the host forks a child. The child puts back every name
   that the lab's setup cells bound (copies taken right after the setup ran, so later cells that rebound or
   changed them do not count), runs the probe, and sends its plain answer. A served model's forwards
   (served.py) travel as frames too, answered by the trusted side. The parent relays every frame and adds the
   nonce, so a child stopped at its time limit never leaves half a frame on the pipe, and threads, timers and
   exit handlers the notebook started do not exist in the child (fork copies one thread; the child leaves with
   os._exit).

What this does not do: hide the student's code from the probe. Both run in the same process, and the
student's code can replace modules or write to the pipes. That is by design harmless: the checker believes
only a return value on inputs it drew for that call and judges it against the reference outside; forward
counts and training results are measured on the trusted side; nothing sent here is an expected value.
"""

from __future__ import annotations

import copy
import importlib
import os
import signal
import sys
import time
import traceback
import warnings

# jsonschema (under nbformat, under IPython's display machinery) imports `rfc3987_syntax` when installed, for a
# string format notebooks never use; building its grammar costs about a second of CPU in every sandbox.
sys.modules.setdefault("rfc3987_syntax", None)

import frames  # noqa: E402
import specdec_probe  # noqa: E402

# What a cell's outputs may hold (the feedback shows text and PNG images only).
KEPT_DATA = ("text/plain", "image/png")


class CellTimeout(KeyboardInterrupt):
    """Raised in the running cell when it passes its time limit (a KeyboardInterrupt, like a kernel interrupt,
    so that `except Exception` in the student's code does not swallow it)."""


class CappedText:
    """A text stream that keeps at most `budget[0]` characters in all (the budget is shared by every cell)."""

    def __init__(self, budget: list[int]):
        self.budget, self.parts, self.dropped = budget, [], False

    def write(self, text) -> int:
        text = str(text)
        kept = text[: max(self.budget[0], 0)]
        self.parts.append(kept)
        self.budget[0] -= len(kept)
        self.dropped |= len(kept) < len(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "".join(self.parts) + ("\n[the grader dropped the rest of this notebook's output]\n"
                                      if self.dropped else "")


def make_shell():
    """An IPython shell without a terminal or history: it runs cells (magics included) like a kernel."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="nocolor", history_length=0, cache_size=0)
    shell.history_manager.enabled = False
    warnings.simplefilter("ignore")
    return shell


def on_alarm(signum, frame):
    raise CellTimeout("the cell ran past its time limit")


def run_cell(shell, source: str, timeout: float, budget: list[int]) -> dict:
    """Run one cell; its outputs (stdout and stderr as one stream, displays, the error) and whether it timed out."""
    from IPython.utils.capture import capture_output

    stream = CappedText(budget)
    saved = sys.stdout, sys.stderr
    signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    with capture_output(stdout=False, stderr=False, display=True) as captured:
        sys.stdout = sys.stderr = stream
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            result = shell.run_cell(source, store_history=False)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = saved
    seconds = time.monotonic() - started
    error = result.error_in_exec or result.error_before_exec
    outputs = [{"output_type": "stream", "name": "stdout", "text": stream.text()}] if stream.parts else []
    for shown in captured.outputs:
        data = {kind: value for kind, value in shown.data.items() if kind in KEPT_DATA}
        if data and budget[0] > 0:
            budget[0] -= sum(len(str(v)) for v in data.values())
            outputs.append({"output_type": "display_data", "data": data, "metadata": {}})
    if error is not None:
        outputs.append({"output_type": "error", "ename": type(error).__name__, "evalue": str(error)[:2000],
                        "traceback": []})
    return {"outputs": outputs, "seconds": round(seconds, 2), "timeout": isinstance(error, CellTimeout)}


def changed_names(ns: dict, before: dict[str, int]) -> set[str]:
    """Names that are new in `ns`, or bound to another object, since `before` (name -> id of its value)."""
    return {name for name, value in ns.items() if before.get(name) != id(value) and not name.startswith("_i")}


def snapshot(ns: dict, names: set[str]) -> dict:
    """Private copies of the setup's objects, taken right after the setup ran (an object that cannot be
    copied, such as a module, is kept as it is)."""
    kept = {}
    for name in names:
        try:
            kept[name] = copy.deepcopy(ns[name])
        except Exception:  # modules, generators and the like: the object itself
            kept[name] = ns[name]
    return kept


class ChildChannel:
    """The child's side of the relay: its requests (a served model's forwards) and the parent's replies."""

    def __init__(self, replies: int, requests: int):
        self.replies, self.requests = replies, requests

    def request(self, message: dict) -> dict:
        frames.write(self.requests, message)
        return frames.read(self.replies)

    def answer(self, value) -> None:
        frames.write(self.requests, {"answer": value})


def run_probe(request: dict, ns: dict, setup: dict, channel: ChildChannel):
    """In the child: the lab's setup objects put back, then the probe on the inputs that just arrived."""
    for name, value in setup.items():
        ns[name] = value  # the child's own copy: nothing here reaches the parent or the next call
    specdec_probe.CHANNEL = channel
    module = importlib.import_module(f"probes.{request['lab']}")
    return getattr(module, request["probe"])(ns, request["inputs"])


def child_main(request: dict, ns: dict, setup: dict, channel: ChildChannel) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout = sys.stderr = CappedText([0])  # a probe's prints go nowhere
    try:
        value = run_probe(request, ns, setup, channel)
    except BaseException as error:  # noqa: BLE001 - whatever happens is this call's answer, never the host's end
        value = {"error": f"{type(error).__name__}: {str(error)[:300]}",
                 "where": "".join(traceback.format_exception_only(type(error), error))[:300]}
    try:
        channel.answer(value)
    except (TypeError, ValueError) as error:  # not JSON-able (a probe bug or an odd object)
        channel.answer({"error": f"the answer could not be sent ({type(error).__name__}: {str(error)[:200]})"})
    os._exit(0)


def serve_call(request: dict, ns: dict, setup: dict, inbox: int, outbox: int, timeout: float) -> dict:
    """Run one call in a forked child, relaying its forwards to the trusted side; its answer as a frame."""
    from_parent, to_child = os.pipe()  # (read end, write end), as os.pipe returns them
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (inbox, outbox, to_child, from_child):
            os.close(fd)
        child_main(request, ns, setup, ChildChannel(from_parent, to_parent))
    os.close(from_parent)
    os.close(to_parent)
    deadline = time.monotonic() + timeout
    value = None
    try:
        while value is None:
            message = frames.read(from_child, deadline=deadline)
            if isinstance(message, dict) and "forward" in message:
                frames.write(outbox, {"forward": message["forward"], "nonce": request.get("nonce")})
                frames.write(to_child, frames.read(inbox))
            elif isinstance(message, dict) and "answer" in message:
                value = message["answer"]
            else:
                value = {"error": "the probe sent something that is neither a forward nor an answer"}
    except frames.ChannelClosed as closed:
        late = "no complete answer in time" in str(closed)
        value = {"error": f"the call ran past its limit of {timeout:g} s and was stopped" if late
                 else "the probe process ended without an answer (a crash, or the process was killed)"}
    finally:
        for fd in (to_child, from_child):
            os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    return {"call": request.get("call"), "nonce": request.get("nonce"), "value": value}


def main(inbox: int, outbox: int) -> None:
    job = frames.read(inbox)
    shell = make_shell()
    ns = shell.user_ns
    budget = [int(job["output_chars"])]
    setup: dict = {}
    answer_names = set(job["answer_names"])
    for cell in job["cells"]:
        before = {name: id(value) for name, value in ns.items()}
        result = run_cell(shell, cell["source"], job["cell_timeout"], budget)
        if cell["kind"] == "setup":
            setup.update(snapshot(ns, changed_names(ns, before) - answer_names))
        frames.write(outbox, {"cell": cell["index"], **result})
    frames.write(outbox, {"ready": True})
    while True:
        try:
            request = frames.read(inbox)
        except frames.ChannelClosed:
            return
        frames.write(outbox, serve_call(request, ns, setup, inbox, outbox, job["call_timeout"]))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
