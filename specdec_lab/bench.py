"""The side-by-side benchmark: Hugging Face `generate` against every decoding method we have, in one process.

    specdec bench --prompts 10 --max-new-tokens 64 --repeats 3 --html report.html --json report.json

Protocol (Spec-Bench style): the same target, the same prompts, the same stopping rule (EOS or
`max_new_tokens`) for every method. Each method is warmed up, then every repeat runs every prompt through
every method in turn, so a slow patch on a shared machine hurts all methods alike. A method's speed is the
median over repeats of (tokens emitted / wall seconds); its speedup is that speed over the speed of Hugging
Face `generate` on the target (the baseline) measured in the same run. At temperature 0 every lossless method
must reproduce the baseline's tokens, and the benchmark says whether it did.

Two prompt sets: "heldout" (function signature + docstring from the corpus's validation files, never seen in
training) and "grounded" (a function is shown, then its header again: the continuation repeats the prompt,
which is where prompt lookup shines).

The efficiency figure holds each draft-model chain method against the closed-form model of Leviathan et al.
(`specdec_lab.theory`): from the measured tau (hence alpha) and the measured cost ratio c of one draft
forward to one target forward, it predicts the speedup over the same framework's own autoregressive loop;
measured / predicted shows what the loop's overhead costs.
"""

from __future__ import annotations

import ast
import importlib
import os
import platform
import statistics
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specdec_lab.cache import new_cache, truncate
from specdec_lab.decode import default_eos, generate
from specdec_lab.drafters import DraftModelDrafter, PromptLookupDrafter, SuffixDrafter
from specdec_lab.models import ModelPair, load_pair, zoo_path
from specdec_lab.stats import DecodeStats, rounded
from specdec_lab.theory import alpha_from_tau, expected_speedup

BASELINE = "hf-generate"
PROMPT_SETS = ("heldout", "grounded")


# ----------------------------------------------------------------------------------------------- settings


@dataclass
class BenchConfig:
    """What to run.

    methods: method names to run (None = every available one; the baseline always runs); k: tokens drafted
    per step by the draft-model methods; lookup_k / lookup_ngram: draft length and longest n-gram of the
    prompt-lookup methods; tree_tokens: nodes of the EAGLE-2 trees (their verification budget);
    adaptive_k / min_confidence: the "-adaptive" methods draft up to adaptive_k tokens and stop before a
    token whose largest draft probability is below min_confidence (compare them with the fixed-k methods);
    tuned: a `specdec tune` profile (path) whose choices replace k (draft, eagle), adaptive_k (eagle-adaptive)
    and the tree settings (eagle trees) for this temperature;
    temperature / top_k / top_p: sampling (temperature 0 = greedy); prompts: prompts per set; max_new_tokens:
    tokens per prompt; repeats: timed passes (median reported); warmup: untimed passes over the first prompt;
    threads: torch CPU threads (pinned); seed: base seed (prompt i uses seed + i); prompt_sets: which sets to
    run; target / draft: model folders (None = the zoo); progress: show a tqdm bar; compile: run every "ours"
    method over a static cache with compiled forwards (the "-compiled" rows always do; compiled runners warm up
    on every prompt, so the timed passes do not pay the compiles).
    """

    methods: list[str] | None = None
    k: int = 4
    lookup_k: int = 10
    lookup_ngram: int = 3
    tree_tokens: int = 16
    adaptive_k: int = 8
    min_confidence: float = 0.5
    tuned: str | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    prompts: int = 10
    max_new_tokens: int = 64
    repeats: int = 3
    warmup: int = 1
    threads: int = 2
    seed: int = 0
    prompt_sets: tuple[str, ...] = PROMPT_SETS
    target: str | None = None
    draft: str | None = None
    progress: bool = True
    compile: bool = False

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        if not 0 < self.min_confidence < 1:
            raise ValueError(f"min_confidence must lie in (0, 1), got {self.min_confidence!r}")
        for name in ("k", "lookup_k", "lookup_ngram", "tree_tokens", "adaptive_k", "prompts", "max_new_tokens",
                     "repeats", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        unknown = [s for s in self.prompt_sets if s not in PROMPT_SETS]
        if unknown or not self.prompt_sets:
            raise ValueError(f"prompt sets must be among {PROMPT_SETS}, got {list(self.prompt_sets)}")


# ----------------------------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    """One benchmark prompt: where it came from, its text, and its token ids."""

    source: str
    text: str
    ids: list[int]


def documented_functions(source: str) -> list[tuple[ast.FunctionDef, list[str]]]:
    """The functions of a module's source that have a docstring, with the source's lines."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node) is not None:
            found.append((node, lines))
    return sorted(found, key=lambda item: item[0].lineno)


def signature_and_docstring(node: ast.FunctionDef, lines: list[str]) -> str:
    """The function's header and docstring, dedented: what a held-out prompt shows.

    Prompts end on their last character, never on a newline: the tokenizer merges a newline with the next
    line's indentation, so a prompt ending in a bare newline would look like a dedent to the model.
    """
    docstring_end = node.body[0].end_lineno
    return textwrap.dedent("\n".join(lines[node.lineno - 1 : docstring_end]))


def shown_then_repeated(node: ast.FunctionDef, lines: list[str]) -> str:
    """The whole function, then a comment and its header again: the continuation repeats the prompt (ending,
    like every prompt, without a newline)."""
    whole = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    header = whole.splitlines()[: node.body[0].lineno - node.lineno]
    return f"{whole}\n\n\n# {node.name}, copied unchanged:\n" + "\n".join(header)


def corpus_prompts(kind: str, tokenizer, count: int, max_tokens: int) -> list[Prompt]:
    """`count` prompts of one kind ("heldout" or "grounded") from the corpus's validation files.

    Files are visited round-robin so the prompts come from as many files as possible; prompts longer than
    `max_tokens` tokens, or grounded candidates that are too short or too long, are passed over. The order
    is deterministic (the corpus split is a hash of the file path).
    """
    from specdec_lab.train.corpus import load_corpus

    corpus = load_corpus()
    per_file = []
    for path in corpus.val_files:
        functions = documented_functions(corpus.read(path))
        if kind == "grounded":
            functions = [(n, lines) for n, lines in functions if 4 <= n.end_lineno - n.lineno <= 30]
            texts = [shown_then_repeated(n, lines) for n, lines in functions]
        else:
            texts = [signature_and_docstring(n, lines) for n, lines in functions]
        per_file.append([(f"{path}:{n.lineno}", text) for (n, _), text in zip(functions, texts, strict=True)])
    prompts: list[Prompt] = []
    for depth in range(max((len(f) for f in per_file), default=0)):
        for candidates in per_file:
            if depth < len(candidates) and len(prompts) < count:
                source, text = candidates[depth]
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if 8 <= len(ids) <= max_tokens:
                    prompts.append(Prompt(source, text, ids))
    if len(prompts) < count:
        raise ValueError(f"only {len(prompts)} {kind} prompts of at most {max_tokens} tokens in the validation "
                         f"files; ask for fewer (--prompts {len(prompts)}) or fewer new tokens")
    return prompts


# ----------------------------------------------------------------------------------------------- methods


# Each family's own autoregressive loop: the reference of its measured-vs-predicted efficiency figures.
OWN_AUTOREGRESSIVE = {"hf": BASELINE, "ours": "plain", "llama.cpp": "llamacpp", "vllm": "vllm"}


class MethodUnavailable(Exception):
    """A method cannot run here (its module or its weights are missing); the message says why."""


@dataclass
class RunResult:
    """One prompt through one method: the new tokens and the decoding statistics.

    seconds: the engine's own decoding time, for a runner whose call also does work that is not decoding (a
    llama.cpp example starts a process and loads its models on every call); None = the call's wall time.
    """

    tokens: list[int]
    stats: DecodeStats
    seconds: float | None = None


Runner = Callable[[list[int], int], RunResult]


@dataclass
class Method:
    """A decoding method in the benchmark.

    name: the id used on the command line; label: one line for tables; family: "hf" (transformers' own
    generate) or "ours" (specdec_lab.generate); kind: "autoregressive", "chain" (one path of k drafted
    tokens), "lookup" (variable-length drafts, no model) or "tree"; build: makes the runner, or raises
    MethodUnavailable; lossless: whether sampling is exactly the target's; draft_model: drafts k tokens with
    the pair's draft model (the setting of the closed-form efficiency figure).
    """

    name: str
    label: str
    family: str
    kind: str
    build: Callable[[BenchContext], Runner]
    lossless: bool = True
    draft_model: bool = False


@dataclass
class BenchContext:
    """What runners share: the models, the settings, and the stopping rule."""

    pair: ModelPair
    config: BenchConfig
    eos_token_id: int | None


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
    from specdec_lab.tune import tuned_settings

    return tuned_settings(config.tuned, method, config.temperature)


def make_lookahead(drafter_class, path: Path | None, context: BenchContext):
    """Lookahead needs no weights; its window and n-gram sizes stay at the drafter's defaults."""
    return drafter_class()


def all_methods() -> list[Method]:
    """Every method the benchmark knows, in table order (the baseline first)."""
    eagle, medusa = "specdec_lab.drafters.eagle", "specdec_lab.drafters.medusa"
    return [
        Method(BASELINE, "HF generate (baseline)", "hf", "autoregressive", lambda c: hf_runner(c)),
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
        Method("vllm-eagle", "vLLM EAGLE-1, the zoo's head", "vllm", "chain", vllm.bench_runner("eagle")),
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


# ----------------------------------------------------------------------------------------------- measuring


def describe_machine(threads: int) -> dict:
    """The machine and software the figures were measured on."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "device": "cuda: " + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def median_forward_seconds(model, prefix: list[int], new_tokens: int, trials: int) -> float:
    """Median wall time of one forward of `new_tokens` tokens after a cached `prefix` (cache cropped back)."""
    return interleaved_forward_seconds([(model, new_tokens)], prefix, trials)[0]


def interleaved_forward_seconds(cases: list[tuple[torch.nn.Module, int]], prefix: list[int],
                                trials: int) -> list[float]:
    """For each (model, tokens) case, the median wall time of one forward of that many tokens after a cached
    `prefix` (the cache is cropped back after every trial). The cases take turns trial by trial, so a slow
    patch of a shared machine hits them alike and their ratios stay fair."""
    caches, feeds = [], []
    with torch.inference_mode():
        for model, new_tokens in cases:
            device = next(model.parameters()).device
            cache = new_cache(model)
            model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True, logits_to_keep=1)
            caches.append(cache)
            feeds.append(torch.tensor([prefix[-new_tokens:]], device=device))
        times: list[list[float]] = [[] for _ in cases]
        for _ in range(trials):
            for (model, new_tokens), cache, feed, spent in zip(cases, caches, feeds, times, strict=True):
                started = time.perf_counter()
                model(input_ids=feed, cache=cache, use_cache=True, logits_to_keep=new_tokens)
                spent.append(time.perf_counter() - started)
                truncate(cache, len(prefix))
    return [statistics.median(spent) for spent in times]


def forward_costs(pair: ModelPair, prefix: list[int], k: int, trials: int = 30) -> dict:
    """What one forward costs in this run: target on 1 and on k + 1 tokens, draft on 1 token, and the ratios.

    c = draft / target (1 token each) is the cost ratio of Leviathan et al.; verify_ratio = target on k + 1
    tokens / target on 1 token is what the closed form assumes to be 1. The three are timed in turns.
    """
    cases = [(pair.target, 1), (pair.target, k + 1)] + ([(pair.draft, 1)] if pair.draft is not None else [])
    seconds = interleaved_forward_seconds(cases, prefix, trials)
    target_1, target_k1 = seconds[:2]
    costs = {"prefix_tokens": len(prefix), "target_1_ms": target_1 * 1e3, "target_k1_ms": target_k1 * 1e3,
             "verify_ratio": target_k1 / target_1, "draft_1_ms": None, "c": None}
    if pair.draft is not None:
        costs.update(draft_1_ms=seconds[2] * 1e3, c=seconds[2] / target_1)
    return {key: round(value, 4) if isinstance(value, float) else value for key, value in costs.items()}


@dataclass
class MethodRecord:
    """Everything measured for one method on one prompt set."""

    method: Method
    results: list[RunResult | None]
    seconds: list[list[float]] = field(default_factory=list)  # [repeat][prompt]


def time_methods(context: BenchContext, runners: dict[str, Runner], prompts: list[Prompt], methods: list[Method],
                 progress) -> dict[str, MethodRecord]:
    """Warm up, then run every prompt through every method `repeats` times, interleaved."""
    config = context.config
    records = {m.name: MethodRecord(m, [None] * len(prompts)) for m in methods}
    for _ in range(config.warmup):
        for name, run in runners.items():
            # A compiled forward compiles once per shape, and the prompts' lengths pick the static cache's size:
            # warm compiled runners up on every prompt.
            compiled = config.compile or name.endswith("-compiled")
            for prompt in prompts if compiled else prompts[:1]:
                run(prompt.ids, config.seed)
    for repeat in range(config.repeats):
        for record in records.values():
            record.seconds.append([0.0] * len(prompts))
        for index, prompt in enumerate(prompts):
            for name, run in runners.items():
                started = time.perf_counter()
                result = run(prompt.ids, config.seed + index)
                wall = time.perf_counter() - started
                records[name].seconds[repeat][index] = wall if result.seconds is None else result.seconds
                if repeat == 0:
                    records[name].results[index] = result
                progress.update(1)
    return records


def summarise(record: MethodRecord, baseline: MethodRecord, reference: MethodRecord | None, config: BenchConfig,
              costs: dict) -> dict:
    """The figures of one method: speed, speedup, tau, acceptance, equality with the baseline, efficiency."""
    stats = merged_stats([r.stats for r in record.results])
    new_tokens = sum(len(r.tokens) for r in record.results)
    speeds = [new_tokens / sum(seconds) for seconds in record.seconds]
    speed = statistics.median(speeds)
    baseline_speed = statistics.median(new_tokens_of(baseline) / sum(s) for s in baseline.seconds)
    equal = sum(r.tokens == b.tokens for r, b in zip(record.results, baseline.results, strict=True))
    greedy = config.temperature == 0
    row = {
        "label": record.method.label,
        "family": record.method.family,
        "kind": record.method.kind,
        "lossless": record.method.lossless,
        "new_tokens": new_tokens,
        "tokens_per_second": round(speed, 2),
        "tokens_per_second_repeats": [round(s, 2) for s in speeds],
        "speedup": round(speed / baseline_speed, 3),
        "tau": round(stats.mean_accepted_tokens, 3),
        "acceptance_rate": round(stats.acceptance_rate, 3) if stats.drafted else None,
        "per_position_acceptance": [round(a, 3) for a in stats.per_position_acceptance],
        "conditional_acceptance": rounded(stats.conditional_acceptance),
        "target_forwards": stats.target_forwards,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "outputs_equal_to_baseline": equal if greedy else None,
        "equal_to_baseline": (equal == len(record.results)) if greedy else None,
        "draft_share": round(stats.draft_seconds / stats.total_seconds, 3)
        if record.method.family == "ours" and stats.total_seconds else None,
    }
    row.update(efficiency(record, row, reference, config, costs))
    return row


def new_tokens_of(record: MethodRecord) -> int:
    return sum(len(r.tokens) for r in record.results)


def merged_stats(runs: list[DecodeStats]) -> DecodeStats:
    """The statistics of several runs added up, as if they were one run."""
    total = DecodeStats()
    for s in runs:
        for name in ("target_forwards", "drafted", "accepted", "new_tokens", "draft_seconds", "verify_seconds",
                     "total_seconds"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.accepted_per_step.extend(s.accepted_per_step)
        total.drafted_at.update(s.drafted_at)
        total.reached_at.update(s.reached_at)
        total.accepted_at.update(s.accepted_at)
    return total


def efficiency(record: MethodRecord, row: dict, reference: MethodRecord | None, config: BenchConfig,
               costs: dict) -> dict:
    """Measured / predicted speedup for the draft-model chain methods (None elsewhere).

    alpha is the acceptance probability that makes the closed-form tau equal the measured tau; the predicted
    speedup over the same framework's autoregressive loop is `theory.expected_speedup(alpha, k, c)`.
    "costed" also charges the measured extra cost of verifying k + 1 tokens instead of 1 (a CPU is not
    memory-bound enough to verify for free), so its ratio isolates the loop's own overhead.
    """
    empty = {"alpha": None, "measured_speedup_vs_own_ar": None, "predicted_speedup": None, "efficiency": None,
             "predicted_speedup_costed": None, "efficiency_costed": None}
    if not record.method.draft_model or reference is None or costs.get("c") is None:
        return empty
    if config.tuned is not None and record.method.family == "ours":
        return empty  # its k came from the profile, not config.k, which the measured costs were timed at
    k, c = config.k, costs["c"]
    tau = min(max(row["tau"], 1.0), k + 1.0)
    alpha = alpha_from_tau(tau, k)
    own_ar_speed = statistics.median(new_tokens_of(reference) / sum(s) for s in reference.seconds)
    measured = row["tokens_per_second"] / own_ar_speed
    predicted = expected_speedup(alpha, k, c)
    costed = tau / (k * c + costs["verify_ratio"])
    return {"alpha": round(alpha, 3), "measured_speedup_vs_own_ar": round(measured, 3),
            "predicted_speedup": round(predicted, 3), "efficiency": round(measured / predicted, 3),
            "predicted_speedup_costed": round(costed, 3), "efficiency_costed": round(measured / costed, 3)}


# ----------------------------------------------------------------------------------------------- the run


def build_runners(context: BenchContext, methods: list[Method]) -> tuple[dict[str, Runner], dict[str, str]]:
    """Runners for the methods that can run, and the reason for each one that cannot."""
    runners, skipped = {}, {}
    for method in methods:
        try:
            runners[method.name] = method.build(context)
        except MethodUnavailable as reason:
            skipped[method.name] = str(reason)
    return runners, skipped


def run_benchmark(config: BenchConfig, pair: ModelPair | None = None) -> dict:
    """Run the benchmark and return its figures as a JSON-ready dict (see `report.py` for printing).

    config: what to run; pair: the models (default: load `config.target` / `config.draft`, or the zoo).
    """
    from tqdm.auto import tqdm

    config.check()
    methods = select_methods(config.methods)
    torch.set_num_threads(config.threads)
    pair = pair or load_models(config)
    context = BenchContext(pair, config, default_eos(pair.target))
    runners, skipped = build_runners(context, methods)
    methods = [m for m in methods if m.name in runners]
    limit = getattr(pair.target.config, "max_position_embeddings", 1 << 30) - config.max_new_tokens - 1
    prompt_sets = {kind: corpus_prompts(kind, pair.tokenizer, config.prompts, min(limit, 400))
                   for kind in config.prompt_sets}
    first_prompt = next(iter(prompt_sets.values()))[0].ids
    costs = forward_costs(pair, first_prompt, config.k)
    total = len(prompt_sets) * config.repeats * config.prompts * len(runners)
    sets = {}
    # transformers' assisted generation warns about its own internal call on every step; keep the bar readable.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with tqdm(total=total, desc="bench", unit="run", disable=not config.progress) as progress:
            for kind, prompts in prompt_sets.items():
                progress.set_postfix_str(kind)
                records = time_methods(context, runners, prompts, methods, progress)
                sets[kind] = summarise_set(records, prompts, config, costs)
    finally:
        hf_logging.set_verbosity(verbosity)
    return {
        "machine": describe_machine(config.threads),
        "settings": settings_dict(config),
        "models": {"target": model_card(pair.target, config.target or str(zoo_path() / "target")),
                   "draft": model_card(pair.draft, config.draft or str(zoo_path() / "draft"))},
        "costs": costs,
        "sets": sets,
        "skipped": skipped,
    }


def load_models(config: BenchConfig) -> ModelPair:
    """The pair to measure: `config.target` / `config.draft`, or the zoo's. A zoo whose draft is not trained
    yet still gives its target, so the methods without a draft model run and the others are reported skipped."""
    zoo = zoo_path()
    if config.target is None and config.draft is None and not (zoo / "draft" / "config.json").exists() \
            and (zoo / "target" / "config.json").exists():
        return load_pair(target=zoo / "target")
    return load_pair(target=config.target, draft=config.draft)


def summarise_set(records: dict[str, MethodRecord], prompts: list[Prompt], config: BenchConfig, costs: dict,
                  baseline: str = BASELINE) -> dict:
    """One prompt set's figures: where its prompts came from, and one row per method.

    baseline: the method every speedup and output comparison is relative to.
    """
    rows = {}
    for name, record in records.items():
        reference = records.get(OWN_AUTOREGRESSIVE.get(record.method.family, "plain"))
        rows[name] = summarise(record, records[baseline], reference, config, costs)
    return {"prompts": len(prompts), "prompt_sources": [p.source for p in prompts],
            "mean_prompt_tokens": round(statistics.mean(len(p.ids) for p in prompts), 1), "methods": rows}


def settings_dict(config: BenchConfig) -> dict:
    """The settings as recorded in the output (the progress flag is not a setting of the measurement)."""
    keys = ("k", "lookup_k", "lookup_ngram", "tree_tokens", "adaptive_k", "min_confidence", "temperature", "top_k",
            "top_p", "tuned", "prompts",
            "max_new_tokens", "repeats", "warmup", "threads", "seed", "compile")
    return {key: getattr(config, key) for key in keys} | {"baseline": BASELINE}


def model_card(model, path: str) -> dict | None:
    """Where a model came from and its size."""
    if model is None:
        return None
    return {"path": path, "parameters": model.num_parameters(), "layers": model.config.num_hidden_layers,
            "hidden_size": model.config.hidden_size}
