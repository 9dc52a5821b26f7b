"""The benchmark's methods: how each row decodes one prompt, and the table of every method it knows.

Hugging Face's rows wrap the target's own `generate` (plain, assisted generation with the draft model, prompt
lookup), with `HFStepRecorder` counting what it did and `AssistantSettings` pinning its draft length; our rows wrap
`specdec_lab.generate` with one drafter each; llama.cpp's and vLLM's rows come from their own modules. A builder
that cannot run here (no draft model, no trained heads, an engine not built) raises `MethodUnavailable`, and the
benchmark lists the method as skipped with the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdec_lab.bench_runner import BASELINE, BenchConfig, BenchContext, Method, MethodUnavailable, Runner, RunResult
from specdec_lab.decode import generate
from specdec_lab.drafters import DraftModelDrafter, PromptLookupDrafter, SuffixDrafter
from specdec_lab.models import zoo_path
from specdec_lab.stats import DecodeStats


def hf_sampling_kwargs(config: BenchConfig) -> dict:
    """`generate` keyword arguments for the benchmark's sampling settings.

    Greedy passes only do_sample=False. When sampling, top_k=0 and top_p=1.0 switch off transformers'
    default top-k of 50, so both frameworks sample the same processed distribution.
    """
    if config.temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": config.temperature, "top_k": config.top_k or 0,
            "top_p": config.top_p if config.top_p is not None else 1.0}


class HFStepRecorder:
    """Counts what transformers' generate did, without changing it.

    A forward pre-hook counts target forwards. For assisted generation (draft model or prompt lookup) the
    candidate generator is wrapped to record, per step, the context length and the number of candidates;
    the growth of the context from one step to the next tells how many candidates were accepted.
    """

    def __init__(self, target: torch.nn.Module):
        self.target = target
        self.forwards = 0
        self.steps: list[tuple[int, int]] = []  # (context length, candidates drafted)

    def __enter__(self) -> HFStepRecorder:
        self.hook = self.target.register_forward_pre_hook(self._count_forward)
        self.target._get_candidate_generator = self._wrap_candidate_generator
        return self

    def __exit__(self, *exc) -> None:
        self.hook.remove()
        del self.target._get_candidate_generator  # back to the class's method

    def _count_forward(self, module, args) -> None:
        self.forwards += 1

    def _wrap_candidate_generator(self, *args, **kwargs):
        generator = type(self.target)._get_candidate_generator(self.target, *args, **kwargs)
        get_candidates = generator.get_candidates

        def recorded(input_ids, *a, **kw):
            candidates, logits = get_candidates(input_ids, *a, **kw)
            self.steps.append((input_ids.shape[1], candidates.shape[1] - input_ids.shape[1]))
            return candidates, logits

        generator.get_candidates = recorded
        return generator

    def stats(self, final_length: int, new_tokens: int, seconds: float) -> DecodeStats:
        """The run's statistics in the engine's conventions (tau counts the target's own token)."""
        stats = DecodeStats(target_forwards=self.forwards, new_tokens=new_tokens, total_seconds=seconds)
        ends = [length for length, _ in self.steps[1:]] + [final_length] if self.steps else []
        for (start, drafted), end in zip(self.steps, ends, strict=True):
            stats.record_step(drafted, max(0, min(drafted, end - start - 1)))
        return stats


def hf_runner(context: BenchContext, **method_kwargs) -> Runner:
    """A runner around the target's own `generate` (plus assisted-generation keyword arguments)."""
    target, config = context.pair.target, context.config
    device = next(target.parameters()).device
    kwargs = dict(max_new_tokens=config.max_new_tokens, eos_token_id=context.eos_token_id,
                  pad_token_id=context.eos_token_id, **hf_sampling_kwargs(config), **method_kwargs)

    def run(ids: list[int], seed: int) -> RunResult:
        input_ids = torch.tensor([ids], device=device)
        torch.manual_seed(seed)  # transformers samples from the global generator
        started = time.perf_counter()
        with HFStepRecorder(target) as recorder, torch.inference_mode():
            output = target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        seconds = time.perf_counter() - started
        tokens = output[0, len(ids) :].tolist()
        return RunResult(tokens, recorder.stats(output.shape[1], len(tokens), seconds))

    return run


def hf_compiled_runner(context: BenchContext) -> Runner:
    """`hf-generate-compiled`: the target's own `generate` over transformers' static cache with its forward
    compiled (transformers compiles on its own only on accelerators; `_compile_all_devices` asks for it on a
    CPU too). The static cache is sized like ours (`CachePlan.static_length`), so both compiled rows attend
    over the same preallocated length, and off CUDA both use inductor's C++ wrapper. Runs under `--compile`, or
    when asked for by name, on a copy of the target taken before any row of ours runs: our compiled forwards give
    the model they compile float16 weight copies and our attention, which transformers' graph would then trace."""
    from transformers.generation import CompileConfig

    from specdec_lab.cache import CachePlan
    from specdec_lab.forward import WRAPPER_OPTIONS

    config = context.config
    if not config.compile and "hf-generate-compiled" not in (config.methods or []):
        raise MethodUnavailable("compiles on first use (minutes on a small CPU): ask for it (--compile, or "
                                "--methods ...,hf-generate-compiled)")
    device = next(context.pair.target.parameters()).device
    on_cuda = device.type == "cuda"
    compile_config = CompileConfig(mode="reduce-overhead" if on_cuda else None,
                                   options=None if on_cuda else WRAPPER_OPTIONS)
    compile_config._compile_all_devices = True

    pair = dataclasses.replace(context.pair, target=copy.deepcopy(context.pair.target))
    own = dataclasses.replace(context, pair=pair)

    def run(ids: list[int], seed: int) -> RunResult:
        length = CachePlan("static", len(ids) + config.max_new_tokens + 1).static_length
        return hf_runner(own, cache_implementation="static", compile_config=compile_config,
                         max_cache_len=length)(ids, seed)

    return run


def ours_runner(context: BenchContext, drafter, compile: bool | None = None) -> Runner:
    """A runner around `specdec_lab.generate` with one drafter instance (None = plain decoding); compile: compiled
    forwards over a static cache (None: as the config says)."""
    config = context.config
    compile = config.compile if compile is None else compile

    def run(ids: list[int], seed: int) -> RunResult:
        out = generate(context.pair.target, ids, drafter=drafter, max_new_tokens=config.max_new_tokens,
                       temperature=config.temperature, top_k=config.top_k, top_p=config.top_p, seed=seed,
                       eos_token_id=context.eos_token_id, compile=compile)
        return RunResult(out.tokens, out.stats)

    return run


def compiled_runner(context: BenchContext, name: str, drafter) -> Runner:
    """A "-compiled" row: ours over static caches with compiled forwards. It runs only when asked for by name: its
    first calls compile for minutes on a small CPU (and `--compile` already compiles every row of ours)."""
    if context.config.compile:
        raise MethodUnavailable("--compile compiles every row of ours already")
    if not context.config.methods or name not in context.config.methods:
        raise MethodUnavailable(f"compiles on first use (minutes on a small CPU): ask for it (--methods ...,{name})")
    return ours_runner(context, drafter() if callable(drafter) else drafter, compile=True)


def need_draft(context: BenchContext):
    """The draft model, or MethodUnavailable when the pair has none."""
    if context.pair.draft is None:
        raise MethodUnavailable("no draft model (the zoo draft is missing, or pass --draft PATH)")
    return context.pair.draft


class AssistantSettings:
    """Temporarily sets the draft's generation config so HF drafts exactly k tokens every step.

    transformers reads the draft length from the *assistant's* generation config; its defaults (20 tokens,
    a 0.4 confidence cut-off) would make the comparison with our fixed-k loop unequal.
    """

    def __init__(self, draft, k: int):
        self.config, self.k = draft.generation_config, k

    def __enter__(self):
        names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        self.saved = {name: getattr(self.config, name, None) for name in names}
        self.config.num_assistant_tokens = self.k
        self.config.num_assistant_tokens_schedule = "constant"
        self.config.assistant_confidence_threshold = 0.0
        return self

    def __exit__(self, *exc) -> None:
        for name, value in self.saved.items():
            setattr(self.config, name, value)


def build_hf_assisted(context: BenchContext) -> Runner:
    draft = need_draft(context)
    run = hf_runner(context, assistant_model=draft)

    def run_with_k(ids: list[int], seed: int) -> RunResult:
        with AssistantSettings(draft, context.config.k):
            return run(ids, seed)

    return run_with_k


def build_hf_lookup(context: BenchContext) -> Runner:
    config = context.config
    return hf_runner(context, prompt_lookup_num_tokens=config.lookup_k, max_matching_ngram_size=config.lookup_ngram)


def optional_drafter(module_name: str, class_name: str, weights: str | None, make: Callable) -> Callable:
    """A builder for a drafter that may not exist yet: its module must import and its zoo weights exist.

    module_name / class_name: where the drafter lives; weights: the zoo sub-folder it loads (None = needs
    none); make: (drafter class, weights path, context) -> drafter instance.
    """

    def build(context: BenchContext) -> Runner:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise MethodUnavailable(f"module {module_name} is not installed ({error})") from None
        drafter_class = getattr(module, class_name, None)
        if drafter_class is None:
            raise MethodUnavailable(f"{module_name} has no {class_name}")
        path = zoo_path() / weights if weights else None
        if path is not None and not (path.is_dir() and any(path.iterdir())):
            raise MethodUnavailable(f"weights missing: {path} (train them with `specdec train`)")
        try:
            drafter = make(drafter_class, path, context)
            # A short trial run: weights trained for another target fail here, not in the middle of the run.
            generate(context.pair.target, [0, 1, 2], drafter=drafter, max_new_tokens=4)
        except (AttributeError, TypeError, ValueError, OSError, RuntimeError) as error:
            raise MethodUnavailable(f"{class_name} from {path or module_name} does not work with this target: "
                                    f"{error}") from None
        return ours_runner(context, drafter)

    return build


def make_medusa(acceptance: str) -> Callable:
    """Medusa heads load with the target they extend; "rejection" is lossless, "typical" is lossy."""

    def make(drafter_class, path: Path, context: BenchContext):
        return drafter_class.from_pretrained(path, context.pair.target, acceptance=acceptance)

    return make


def make_eagle(mode: str) -> Callable:
    """EAGLE heads load with `EagleHead.load(folder, target)`; chains draft k tokens ("adaptive": up to
    adaptive_k, stopping at min_confidence), trees keep `tree_tokens` nodes (depth and top-k at the drafter's
    defaults; when sampling, "tree" draws the children, "tree-top" keeps EAGLE-2's top-k children)."""

    def make(drafter_class, path: Path, context: BenchContext):
        from specdec_lab.drafters.eagle import EagleHead

        head = EagleHead.load(path, context.pair.target)
        config = context.config
        if mode == "chain":
            depth = tuned(config, "eagle").get("depth", config.k)
            return drafter_class(head, mode="chain", depth=depth)
        if mode == "adaptive":
            depth = tuned(config, "eagle").get("depth", config.adaptive_k)
            return drafter_class(head, mode="chain", depth=depth, min_confidence=config.min_confidence)
        children = "top" if mode == "tree-top" else "sampled"
        settings = {"total_tokens": config.tree_tokens} | tuned(config, "eagle-tree")
        if children == "top":
            settings.pop("alpha", None)
        return drafter_class(head, mode="tree", children=children, **settings)

    return make


def tuned(config: BenchConfig, method: str) -> dict:
    """The profile's drafter settings for `method` at the run's temperature ({} without a profile)."""
    if config.tuned is None:
        return {}
    from specdec_lab.profiles import tuned_settings

    return tuned_settings(config.tuned, method, config.temperature)


def make_mtp(drafter_class, path: Path, context: BenchContext):
    """MTP modules load with the target they extend and draft one token per module (a chain)."""
    return drafter_class.from_pretrained(path, context.pair.target)


def make_lookahead(drafter_class, path: Path | None, context: BenchContext):
    """Lookahead needs no weights; its window and n-gram sizes stay at the drafter's defaults."""
    return drafter_class()


def all_methods() -> list[Method]:
    """Every method the benchmark knows, in table order (the baseline first)."""
    eagle, medusa = "specdec_lab.drafters.eagle", "specdec_lab.drafters.medusa"
    return [
        Method(BASELINE, "HF generate (baseline)", "hf", "autoregressive", lambda c: hf_runner(c)),
        Method("hf-generate-compiled", "HF generate, static cache + torch.compile", "hf", "autoregressive",
               hf_compiled_runner),
        Method("plain", "ours, autoregressive", "ours", "autoregressive", lambda c: ours_runner(c, None)),
        Method("plain-compiled", "ours, autoregressive, static cache + torch.compile", "ours", "autoregressive",
               lambda c: compiled_runner(c, "plain-compiled", None)),
        Method("hf-assisted", "HF assisted generation, draft model, k fixed", "hf", "chain", build_hf_assisted,
               draft_model=True),
        Method("draft", "ours, draft model (Leviathan / Chen)", "ours", "chain",
               lambda c: ours_runner(c, DraftModelDrafter(need_draft(c),
                                                          k=tuned(c.config, "draft").get("k", c.config.k))),
               draft_model=True),
        Method("draft-block", "ours, draft model, block verification (Sun et al.)", "ours", "chain",
               lambda c: ours_runner(c, DraftModelDrafter(need_draft(c),
                                                          k=tuned(c.config, "draft").get("k", c.config.k),
                                                          verification="block")),
               draft_model=True),
        Method("draft-compiled", "ours, draft model, static caches + torch.compile", "ours", "chain",
               lambda c: compiled_runner(c, "draft-compiled", lambda: DraftModelDrafter(
                   need_draft(c), k=tuned(c.config, "draft").get("k", c.config.k))),
               draft_model=True),
        Method("draft-adaptive", "ours, draft model, adaptive k (stops when unsure)", "ours", "chain",
               lambda c: ours_runner(c, DraftModelDrafter(need_draft(c), k=c.config.adaptive_k,
                                                          min_confidence=c.config.min_confidence))),
        Method("hf-lookup", "HF prompt lookup", "hf", "lookup", build_hf_lookup),
        Method("lookup", "ours, prompt lookup", "ours", "lookup",
               lambda c: ours_runner(c, PromptLookupDrafter(c.config.lookup_ngram, c.config.lookup_k))),
        Method("suffix", "ours, suffix decoding (suffix index, frequency-weighted)", "ours", "lookup",
               lambda c: ours_runner(c, SuffixDrafter())),
        Method("medusa", "ours, Medusa-1 heads, tree, lossless verification", "ours", "tree",
               optional_drafter(medusa, "MedusaDrafter", "medusa", make_medusa("rejection"))),
        Method("medusa-typical", "ours, Medusa-1 heads, typical acceptance (LOSSY)", "ours", "tree",
               optional_drafter(medusa, "MedusaDrafter", "medusa", make_medusa("typical")), lossless=False),
        Method("eagle", "ours, EAGLE-1 head, chain of k", "ours", "chain",
               optional_drafter(eagle, "EagleDrafter", "eagle", make_eagle("chain"))),
        Method("eagle-adaptive", "ours, EAGLE-1 head, adaptive chain (stops when unsure)", "ours", "chain",
               optional_drafter(eagle, "EagleDrafter", "eagle", make_eagle("adaptive"))),
        Method("eagle-tree", "ours, EAGLE-2 tree (sampled children when sampling)", "ours", "tree",
               optional_drafter(eagle, "EagleDrafter", "eagle", make_eagle("tree"))),
        Method("eagle-tree-top", "ours, EAGLE-2 tree, top-k children also when sampling", "ours", "tree",
               optional_drafter(eagle, "EagleDrafter", "eagle", make_eagle("tree-top"))),
        Method("eagle3-tree", "ours, EAGLE-3 fused features, dynamic tree", "ours", "tree",
               optional_drafter(eagle, "EagleDrafter", "eagle3", make_eagle("tree"))),
        Method("mtp", "ours, MTP modules (DeepSeek-V3 multi-token prediction), chain", "ours", "chain",
               optional_drafter("specdec_lab.drafters.mtp", "MTPDrafter", "mtp", make_mtp)),
        Method("lookahead", "ours, lookahead (Jacobi window + n-gram pool)", "ours", "tree",
               optional_drafter("specdec_lab.drafters.lookahead", "LookaheadDrafter", None, make_lookahead)),
        *llamacpp_methods(),
        *vllm_methods(),
    ]


def llamacpp_methods() -> list[Method]:
    """llama.cpp's rows (a production engine on the same prompts; see specdec_lab/llamacpp.py)."""
    from specdec_lab import llamacpp

    return [
        Method("llamacpp", "llama.cpp, autoregressive (Python bindings)", "llama.cpp", "autoregressive",
               llamacpp.plain_runner),
        Method("llamacpp-draft", "llama.cpp speculative-simple, draft model, k fixed", "llama.cpp", "chain",
               llamacpp.example_runner("llama-speculative-simple"), draft_model=True),
        Method("llamacpp-lookup", "llama.cpp lookup (prompt lookup)", "llama.cpp", "lookup",
               llamacpp.example_runner("llama-lookup")),
    ]


def vllm_methods() -> list[Method]:
    """vLLM's rows, one engine load each (about 45 s on 2 cores; see specdec_lab/vllm.py). A method vLLM cannot
    run on the zoo (the EAGLE heads' layouts, suffix decoding's missing package) is skipped with the reason."""
    from specdec_lab import vllm

    return [
        Method("vllm", "vLLM, autoregressive", "vllm", "autoregressive", vllm.bench_runner("plain")),
        Method("vllm-draft", "vLLM draft_model, k fixed", "vllm", "chain", vllm.bench_runner("draft"),
               draft_model=True),
        Method("vllm-ngram", "vLLM ngram (prompt lookup)", "vllm", "lookup", vllm.bench_runner("ngram")),
        Method("vllm-suffix", "vLLM suffix decoding", "vllm", "lookup", vllm.bench_runner("suffix")),
        Method("vllm-medusa", "vLLM Medusa, the zoo's heads converted (chain of top-1)", "vllm", "chain",
               vllm.bench_runner("medusa")),
        Method("vllm-eagle", "vLLM EAGLE-1, the zoo's vLLM-layout head (eagle-vllm/)", "vllm", "chain",
               vllm.bench_runner("eagle")),
        Method("vllm-eagle3", "vLLM EAGLE-3, the zoo's head", "vllm", "chain", vllm.bench_runner("eagle3")),
    ]


def method_names() -> list[str]:
    """The names `--methods` accepts."""
    return [m.name for m in all_methods()]


def select_methods(names: list[str] | None) -> list[Method]:
    """The methods to run, in table order; the baseline is always included."""
    methods = all_methods()
    if names is None:
        return methods
    unknown = sorted(set(names) - {m.name for m in methods})
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {method_names()}")
    return [m for m in methods if m.name == BASELINE or m.name in names]
