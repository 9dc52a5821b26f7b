"""An OpenAI-compatible inference server on loopback, as a deployment runs one, and the speculation it reports.

vLLM's `vllm serve` (`specdec_lab.vllm_server`) and llama.cpp's `llama-server` (`specdec_lab.llamacpp_server`)
speak the same protocol and export the same speculative counters to Prometheus, under their own prefix
(`vllm:` and `llamacpp:`): drafts (verification steps that had a draft), draft tokens, accepted tokens, and the
accepted count per draft position. This module holds what the two have in common: start the server in its own
process group on a free port, wait until it is healthy, query it with the `openai` client, read `/metrics`,
stop it with everything it started; and `round_trip`, which serves some prompts and reports the course's tau.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

SPEC_COUNTERS = {"spec_decode_num_drafts_total": "drafts", "spec_decode_num_draft_tokens_total": "draft_tokens",
                 "spec_decode_num_accepted_tokens_total": "accepted"}
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_total"
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
SERVED_NAME = "zoo"  # the model name the servers answer to


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_spec_metrics(text: str, prefix: str = "vllm:") -> dict:
    """A server's speculative counters from its Prometheus text page: drafts, draft_tokens, accepted (summed over
    the label sets, e.g. one per engine) and accepted_per_position (indexed by the `position` label).

    prefix: the server's metric namespace ("vllm:" for vLLM, "llamacpp:" for llama.cpp's server).
    """
    counts = {name: 0 for name in SPEC_COUNTERS.values()} | {"accepted_per_position": []}
    per_position: dict[int, int] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match or line.startswith("#") or not match["name"].startswith(prefix):
            continue
        name, value = match["name"][len(prefix):], int(float(match["value"]))
        if name in SPEC_COUNTERS:
            counts[SPEC_COUNTERS[name]] += value
        elif name == PER_POSITION:
            position = re.search(r'position="(\d+)"', match["labels"] or "")
            if position:
                index = int(position[1])
                per_position[index] = per_position.get(index, 0) + value
    counts["accepted_per_position"] = [per_position.get(i, 0) for i in range(max(per_position, default=-1) + 1)]
    return counts


@dataclass
class Completion:
    """One completion from a server: the tokens it emitted and their text."""

    token_ids: list[int]
    text: str


class OpenAIServer(ABC):
    """A server process answering the OpenAI API on 127.0.0.1 (a subclass says how to start it and how to ask it
    for the emitted token ids). Use it as a context manager, or call `close()`.

    name: how messages call it; command / environment: its process; port: where it listens (the command's);
    metrics_prefix: its Prometheus namespace; timeout: seconds to wait until /health answers 200.
    """

    name = "server"
    metrics_prefix = "vllm:"

    def __init__(self, command: list[str], environment: dict[str, str], port: int, timeout: float):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._client = None
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{self.name.replace(' ', '-')}-", suffix=".log",
                                               delete=False)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=environment,
                                        cwd=tempfile.gettempdir(), start_new_session=True)
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} stopped (exit {self.process.returncode}); its log "
                                   f"({self.log.name}) ends:\n{self.log_tail()}")
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise TimeoutError(f"{self.name} was not healthy after {timeout:.0f} s; its log ends:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def client(self):
        """The `openai.OpenAI` client of this server, made once (no key: it listens on loopback only)."""
        if self._client is None:
            import openai

            self._client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=300)
        return self._client

    @abstractmethod
    def request_extras(self) -> dict:
        """Fields beyond the OpenAI API that make the server return the emitted token ids (and say whether EOS
        ends a completion)."""

    @abstractmethod
    def emitted_tokens(self, reply) -> list[int]:
        """The token ids a completions reply carries (where `request_extras` asked for them)."""

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0
                 ) -> Completion:
        """One completion through the openai client, the prompt given as token ids, at most `max_tokens` tokens
        (whether EOS ends it is the server's `request_extras`)."""
        reply = self.client().completions.create(
            model=SERVED_NAME, prompt=[int(t) for t in prompt_ids], max_tokens=max_tokens, temperature=temperature,
            seed=seed, extra_body=self.request_extras())
        return Completion(self.emitted_tokens(reply), reply.choices[0].text)

    def metrics_text(self) -> str:
        import requests

        answer = requests.get(f"{self.url}/metrics", timeout=30)
        answer.raise_for_status()
        return answer.text

    def spec_metrics(self) -> dict:
        """The server's cumulative speculative counters (see `parse_spec_metrics`)."""
        return parse_spec_metrics(self.metrics_text(), self.metrics_prefix)

    def close(self) -> None:
        """Stop the server and everything it started (its process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def round_trip(start, prompts: list[list[int]], max_tokens: int = 32) -> dict:
    """Start a server with `start()` (an `OpenAIServer`), complete each prompt (token ids) greedily through the
    openai client, stop it, and report the speculation it counted: {"completions": [token ids], "spec": counters
    (the difference over the requests: they are cumulative over the server's life), "tau", "acceptance",
    "load_seconds", "port" (where it listened; free again when this returns)}."""
    from specdec_lab.engines import acceptance, course_tau

    started = time.perf_counter()
    with start() as server:
        loaded = time.perf_counter() - started
        before = server.spec_metrics()
        completions = [server.complete(ids, max_tokens).token_ids for ids in prompts]
        after = server.spec_metrics()
        port = server.port
    spec = {key: after[key] - before[key] for key in SPEC_COUNTERS.values()}
    new_tokens = sum(map(len, completions))
    return {"completions": completions, "spec": spec, "load_seconds": round(loaded, 1), "port": port,
            "tau": round(course_tau(new_tokens, spec["accepted"], spec["drafts"], len(prompts)), 3),
            "acceptance": round(acceptance(spec["draft_tokens"], spec["accepted"]), 3)}
