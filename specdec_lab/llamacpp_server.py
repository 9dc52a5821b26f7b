"""llama.cpp's OpenAI-compatible server on the zoo pair: `llama-server -m target.gguf -md draft.gguf`, queried with
the `openai` client, its speculation read from its Prometheus `/metrics` (the same counters as vLLM's, under
`llamacpp:`).

    with LlamaServer(k=4) as server:                         # llama-server -m <target> -md <draft> --metrics
        reply = server.complete(prompt_ids, max_tokens=32)   # the openai client's completions call, on token ids
        print(reply.token_ids, server.spec_metrics())         # drafts, draft tokens, accepted, per position

The server is the `llama-server` binary that `make production` builds beside the examples
(`specdec_lab.llamacpp`), started on 127.0.0.1 and a free port with the zoo's GGUF files. Its OpenAI-style
reply carries text only; asking for `return_tokens` and `verbose` (llama.cpp's own request fields) adds its
native reply, whose `tokens` are the ids it emitted, so the comparison with our engine is token for token.
"""

from __future__ import annotations

import os

from specdec_lab import llamacpp
from specdec_lab.serving import SERVED_NAME, OpenAIServer, free_port
from specdec_lab.serving import round_trip as serve_and_complete


class LlamaServer(OpenAIServer):
    """`llama-server` on the zoo target, with the zoo draft drafting `k` tokens per step (k = 0: plain decoding).

    threads: CPU threads (target and draft); port: None = a free one; timeout: seconds to wait until healthy.
    """

    name = "llama-server"
    metrics_prefix = "llamacpp:"

    def __init__(self, k: int = 4, threads: int = 2, port: int | None = None, timeout: float = 120):
        reason = llamacpp.server_missing()
        if reason:
            raise llamacpp.LlamaCppUnavailable(reason)
        files = llamacpp.convert_zoo()
        port = port or free_port()
        command = [str(llamacpp.bin_dir() / llamacpp.SERVER), "-m", str(files["target"]), "--alias", SERVED_NAME,
                   "--host", "127.0.0.1", "--port", str(port), "-c", "1024", "-np", "1", "-t", str(threads),
                   "-tb", str(threads), "--seed", "0", "--metrics", "--no-webui"]
        if k > 0:
            # Drafts are never cut short by the draft's confidence (p-min 0), as in our fixed-k drafters.
            command += ["-md", str(files["draft"]), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", str(threads)]
        super().__init__(command, dict(os.environ), port, timeout)

    def request_extras(self) -> dict:
        # No `ignore_eos`: llama.cpp's bans the EOS token (the completion then differs from ours where the target
        # would write it) where vLLM's runs past it; here EOS ends a completion, as it ends ours.
        return {"return_tokens": True, "verbose": True}

    def emitted_tokens(self, reply) -> list[int]:
        native = (reply.model_extra or {}).get("__verbose") or {}
        return [int(t) for t in native.get("tokens") or []]


def round_trip(prompts: list[list[int]], max_tokens: int = 32, k: int = 4, threads: int = 2) -> dict:
    """Serve the zoo pair in llama.cpp's server, complete each prompt (token ids) greedily through the openai
    client, and read the speculation the server counted (see `specdec_lab.serving.round_trip`)."""
    return serve_and_complete(lambda: LlamaServer(k=k, threads=threads), prompts, max_tokens)
