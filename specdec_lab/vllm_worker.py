"""The process that holds one vLLM engine for specdec_lab/vllm.py; it runs in vLLM's own environment.

Started as `<vLLM's python> vllm_worker.py '<settings as JSON>'`, it imports only the standard library and vLLM
(this file is not imported by specdec_lab, whose environment has no vLLM). It loads `vllm.LLM` once (about 40 s
on a 2-core CPU), then answers requests, one JSON object per line on stdin, with one JSON line each on the
stdout it was given; vLLM's own logging goes to stderr. Requests:

    {"op": "generate", "prompts": [[ids], ...], "max_tokens": 32, "temperature": 0.0, "top_p": 1.0,
     "top_k": 0, "seed": 0, "ignore_eos": true}
        -> {"outputs": [[ids], ...], "seconds": ..., "spec": {"drafts", "draft_tokens", "accepted",
            "accepted_per_position"}}  (speculative counters of this request only: after minus before)
    {"op": "tokenize", "texts": [...]}  -> {"ids": [[...], ...]}  (vLLM's tokenizer, no special tokens)
    {"op": "quit"}

Errors come back as {"error": "..."} and the worker carries on.
"""

import json
import os
import sys
import time
import traceback

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (zeros when the engine does not speculate)."""
    counts = {name: 0 for name in SPEC_COUNTERS.values()}
    counts["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            counts[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            old = counts["accepted_per_position"]
            counts["accepted_per_position"] = [v + (old[i] if i < len(old) else 0) for i, v in enumerate(values)]
    return counts


def difference(after: dict, before: dict) -> dict:
    """Counters of one request: after minus before (the per-position list padded to the same length)."""
    out = {key: after[key] - before[key] for key in SPEC_COUNTERS.values()}
    old = before["accepted_per_position"]
    out["accepted_per_position"] = [a - (old[i] if i < len(old) else 0)
                                    for i, a in enumerate(after["accepted_per_position"])]
    return out


def main() -> None:
    settings = json.loads(sys.argv[1])
    reply = os.fdopen(os.dup(1), "w", buffering=1)  # our channel; vLLM's prints go to stderr from here on
    os.dup2(2, 1)
    started = time.perf_counter()
    # This file sits beside specdec_lab/vllm.py, and Python puts a script's folder first on the path: without
    # this, `import vllm` would find that module instead of vLLM.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import vllm
    from vllm.inputs import TokensPrompt

    # No tokenizer (a model made of token ids only, as lab 6's): vLLM runs on ids and never decodes text.
    tokenizer = settings["tokenizer"]
    llm = vllm.LLM(model=settings["model"], tokenizer=tokenizer, skip_tokenizer_init=tokenizer is None,
                   dtype=settings.get("dtype", "float32"),
                   max_model_len=settings.get("max_model_len", 1024), seed=settings.get("seed", 0),
                   speculative_config=settings.get("speculative_config"), disable_log_stats=False,
                   max_num_seqs=settings.get("max_num_seqs", 16))
    reply.write(json.dumps({"ready": True, "vllm": vllm.__version__,
                            "load_seconds": round(time.perf_counter() - started, 1)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "quit":
                break
            if request["op"] == "tokenize":
                tokenizer = llm.get_tokenizer()
                answer = {"ids": [tokenizer.encode(text, add_special_tokens=False) for text in request["texts"]]}
            elif request["op"] == "generate":
                params = vllm.SamplingParams(
                    temperature=request.get("temperature", 0.0), top_p=request.get("top_p", 1.0),
                    top_k=request.get("top_k") or 0, seed=request.get("seed", 0),
                    max_tokens=request["max_tokens"], ignore_eos=request.get("ignore_eos", True),
                    detokenize=tokenizer is not None)
                prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
                before = spec_counters(llm)
                tick = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - tick
                answer = {"outputs": [list(o.outputs[0].token_ids) for o in outputs], "seconds": seconds,
                          "spec": difference(spec_counters(llm), before)}
            else:
                answer = {"error": f"unknown op {request['op']!r}"}
        except Exception:  # reported to the caller, which raises it; the engine stays loaded
            answer = {"error": traceback.format_exc()[-3000:]}
        reply.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
