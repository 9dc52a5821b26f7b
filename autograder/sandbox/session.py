"""The trusted side of one student's sandbox: start the host, run the notebook, make the checker's calls.

The host (inside/host.py) runs in bubblewrap and talks only through two pipes opened here (frames.py). This
side sends the notebook's cells, then one call at a time: a probe's name and the inputs drawn for it, which
exist nowhere in the sandbox before that moment, with a nonce that every frame of that call must carry back (a
frame without it, written by the notebook's own threads or processes, ends that sandbox). It reads every frame
with a size limit and a deadline, and answers the served models' forwards itself (counting them), so what it
keeps of a call is exactly the one answer frame the host sent for it, and what it measured.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from autograder.checks._common import NO_ANSWER
from autograder.sandbox.inside import frames

# Largest frame accepted from the sandbox (a lab 6 answer holds a small head's weights; nothing needs more).
MAX_FRAME_BYTES = 32 << 20
# Seconds the host may take beyond its own limits before this side stops waiting (start-up, relaying).
GRACE_SECONDS = 20
# Forwards a served model answers in one call, and tokens in one forward (bounds the grader's own work).
MAX_FORWARDS = 2000
MAX_TOKENS = 2048


@dataclass
class CellRun:
    """What the host reported for one cell: its outputs (untrusted, for display), time and whether it timed out."""

    outputs: list
    seconds: float
    timeout: bool


@dataclass
class NotebookRun:
    """The notebook phase: each cell's report (by index), and `stopped_at` / `problem` when the host died or
    stalled before the last cell."""

    cells: dict[int, CellRun] = field(default_factory=dict)
    stopped_at: int | None = None
    problem: str | None = None


class ModelServer:
    """Answers the forwards of the models one call serves (weights that never enter the sandbox) and logs them.

    models: name -> a Hugging Face causal LM built on the trusted side. Each student-side `DynamicCache` (known by
    the key the sandbox sends) has a real cache here, cut back to the length the sandbox reports before each
    forward.
    """

    def __init__(self, models: dict[str, torch.nn.Module]):
        self.models = models
        self.caches: dict[tuple[str, int], object] = {}
        self.log: dict[str, list[dict]] = {name: [] for name in models}

    def public(self) -> dict[str, dict]:
        """What the sandbox may know of each model: its configuration."""
        return {name: json.loads(model.config.to_json_string()) for name, model in self.models.items()}

    def forward(self, request) -> dict:
        """The reply to one forward request (logits, hidden states if asked), or {"error": why}."""
        try:
            return self.run(request)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as error:
            return {"error": f"{type(error).__name__}: {str(error)[:300]}"}

    def run(self, request: dict) -> dict:
        from transformers import DynamicCache

        name = request["model"]
        model = self.models[name]
        if sum(len(entries) for entries in self.log.values()) >= MAX_FORWARDS:
            raise ValueError(f"more than {MAX_FORWARDS} forwards in one call")
        ids = torch.tensor(request["input_ids"], dtype=torch.long)
        if ids.dim() != 2 or ids.shape[0] != 1 or not 1 <= ids.shape[1] <= MAX_TOKENS:
            raise ValueError(f"input_ids must be one row of 1 to {MAX_TOKENS} tokens, got shape {tuple(ids.shape)}")
        if bool((ids < 0).any() or (ids >= model.config.vocab_size).any()):
            raise ValueError(f"a token id outside the vocabulary of {model.config.vocab_size}")
        cache, past = None, int(request.get("past") or 0)
        if request.get("cache") is not None:
            key = (name, int(request["cache"]))
            cache = self.caches.setdefault(key, DynamicCache(config=model.config))
            if not 0 <= past <= cache.get_seq_length():
                raise ValueError(f"the cache holds {cache.get_seq_length()} tokens, the forward claims {past}")
            if past < cache.get_seq_length():
                cache.crop(past - cache.get_seq_length())  # this transformers takes the count to drop, negated
        elif past:
            raise ValueError("a past length without a cache")
        kwargs = {"input_ids": ids, "use_cache": cache is not None, "cache": cache,
                  "output_hidden_states": bool(request.get("hidden_states"))}
        total = past + ids.shape[1]
        if request.get("attention_mask") is not None:
            mask = torch.tensor(request["attention_mask"], dtype=torch.float32)
            if tuple(mask.shape) not in {(1, total), (1, 1, ids.shape[1], total)}:
                raise ValueError(f"attention mask of shape {tuple(mask.shape)} for {ids.shape[1]} tokens after {past}")
            kwargs["attention_mask"] = mask if mask.dim() == 4 else mask.long()
        if request.get("position_ids") is not None:
            positions = torch.tensor(request["position_ids"], dtype=torch.long)
            if tuple(positions.shape) != tuple(ids.shape) or bool((positions < 0).any()) \
                    or bool((positions >= model.config.max_position_embeddings).any()):
                raise ValueError(f"position ids must be one row of {ids.shape[1]} positions in range")
            kwargs["position_ids"] = positions
        with torch.no_grad():
            out = model(**kwargs)
        self.log[name].append({"tokens": int(ids.shape[1]), "past": past, "cached": cache is not None})
        reply = {"logits": out.logits.tolist()}
        if kwargs["output_hidden_states"]:
            reply["hidden_states"] = [h.tolist() for h in out.hidden_states]
        return reply


class Session:
    """One student's host process in its sandbox, driven from the trusted side (see the module docstring).

    command: the sandbox command line without the host's file-descriptor arguments (sandbox.command);
    log_path: where the sandbox's own stdout and stderr go (capped by the file-size limit), for the notes.
    """

    def __init__(self, command: list[str], log_path: Path, limits):
        self.limits = limits
        host_in, self.requests = os.pipe()
        self.answers, host_out = os.pipe()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen([*command, str(host_in), str(host_out)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, pass_fds=(host_in, host_out),
                                            start_new_session=True)
        os.close(host_in)
        os.close(host_out)
        self.calls = 0
        self.dead: str | None = None

    def send(self, message) -> None:
        frames.write(self.requests, message)

    def receive(self, seconds: float):
        return frames.read(self.answers, MAX_FRAME_BYTES, time.monotonic() + seconds)

    def run_notebook(self, cells: list[dict], answer_names: list[str]) -> NotebookRun:
        """Send the cells (dicts with index, kind and source) and collect each one's report."""
        limits = self.limits
        run = NotebookRun()
        started = time.monotonic()
        try:
            self.send({"cells": cells, "answer_names": answer_names, "cell_timeout": limits.cell_timeout,
                       "call_timeout": limits.call_timeout, "output_chars": limits.output_chars})
            for cell in cells:
                left = limits.notebook_timeout - (time.monotonic() - started)
                run.stopped_at = cell["index"]
                report = self.receive(min(limits.cell_timeout, max(left, 0)) + GRACE_SECONDS)
                if not isinstance(report, dict) or report.get("cell") != cell["index"]:
                    raise frames.ChannelClosed("the host sent something other than this cell's report")
                run.cells[cell["index"]] = CellRun(report.get("outputs"), float(report.get("seconds", 0)),
                                                   bool(report.get("timeout")))
            run.stopped_at = None
            if self.receive(GRACE_SECONDS) != {"ready": True}:
                raise frames.ChannelClosed("the host did not say it was ready for calls")
        except (frames.ChannelClosed, OSError) as error:
            run.problem = self.stop(str(error))
        return run

    def call(self, lab: str, probe: str, inputs: dict, server: ModelServer | None = None):
        """One probe call on `inputs` (sent now, without their "secret" part): the host's plain answer, or
        NO_ANSWER when none came (the host is dead or stalled; it is then stopped for good)."""
        if self.dead:
            return NO_ANSWER
        self.calls += 1
        public = {k: v for k, v in inputs.items() if k != "secret"}
        if server is not None:
            public["served"] = server.public()
        nonce = secrets.token_hex(16)  # the host's relay puts it on this call's frames; the notebook never saw it
        deadline = time.monotonic() + self.limits.call_timeout + GRACE_SECONDS
        try:
            self.send({"call": self.calls, "nonce": nonce, "lab": lab, "probe": probe, "inputs": public})
            while True:
                message = frames.read(self.answers, MAX_FRAME_BYTES, deadline)
                if not isinstance(message, dict) or message.get("nonce") != nonce:
                    raise frames.ChannelClosed("a frame that belongs to no call reached the grader (the notebook "
                                               "wrote to the grader's channel)")
                if "forward" in message:
                    self.send(server.forward(message["forward"]) if server else {"error": "no model is served"})
                elif message.get("call") == self.calls and "value" in message:
                    return message["value"]
                else:
                    raise frames.ChannelClosed("the host sent a frame that is neither a forward nor an answer")
        except (frames.ChannelClosed, OSError) as error:
            self.stop(str(error))
            return NO_ANSWER

    def stop(self, why: str) -> str:
        """End the sandbox early and say why (the first reason counts); no call is made after it."""
        if self.dead is None:
            self.dead = why
        self.close()
        return self.dead

    def close(self) -> None:
        """End the sandbox: its whole process group, and both pipes."""
        if self.requests == -1:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        for fd in (self.requests, self.answers):
            try:
                os.close(fd)
            except OSError:
                pass
        self.requests = self.answers = -1

    def log_tail(self, chars: int = 600) -> str:
        """The end of the sandbox's own output (its stderr: a crash's last words)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, os.path.getsize(self.log_path) - chars))
                return log.read().decode(errors="replace")
        except OSError:
            return ""
