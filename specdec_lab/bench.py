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

Where each part lives (one concern per module; every name stays importable from here):

    specdec_lab.bench_runner    the settings (BenchConfig), what a runner gets and returns, Method, MethodUnavailable
    specdec_lab.bench_methods   the method table: Hugging Face's generate adapters and our runners
    specdec_lab.bench_prompts   the prompt sets (held-out and grounded) from the corpus's validation files
    specdec_lab.bench_costs     what one forward costs here (the c and verification ratio of the closed form)
    specdec_lab.bench_summary   from timed runs to rows and tables of figures (speedup, tau, efficiency)
    specdec_lab.machine         the machine and software the figures were measured on (describe_machine)

This module is the run itself: load the models, build the runners, time every method on every prompt in turns,
and gather the figures.
"""

from __future__ import annotations

import time

import torch
from transformers.utils import logging as hf_logging

from specdec_lab.bench_costs import (
    decode_floor,
    forward_costs,
    interleaved_forward_seconds,
    median_forward_seconds,
    memory_bandwidth,
)
from specdec_lab.bench_methods import (
    AssistantSettings,
    HFStepRecorder,
    all_methods,
    build_hf_assisted,
    build_hf_lookup,
    compiled_runner,
    hf_runner,
    hf_sampling_kwargs,
    llamacpp_methods,
    make_eagle,
    make_lookahead,
    make_medusa,
    method_names,
    need_draft,
    optional_drafter,
    ours_runner,
    select_methods,
    tuned,
    vllm_methods,
)
from specdec_lab.bench_prompts import (
    PROMPT_SETS,
    Prompt,
    corpus_prompts,
    documented_functions,
    shown_then_repeated,
    signature_and_docstring,
)
from specdec_lab.bench_runner import BASELINE, BenchConfig, BenchContext, Method, MethodUnavailable, Runner, RunResult
from specdec_lab.bench_summary import (
    OWN_AUTOREGRESSIVE,
    MethodRecord,
    efficiency,
    merged_stats,
    model_card,
    new_tokens_of,
    settings_dict,
    summarise,
    summarise_set,
)
from specdec_lab.decode import default_eos
from specdec_lab.machine import describe_machine
from specdec_lab.models import ModelPair, load_pair, zoo_path

# The names the benchmark had before it was split by concern: lessons, export, the engines and the tests import them
# from here.
__all__ = [
    "BASELINE", "OWN_AUTOREGRESSIVE", "PROMPT_SETS", "AssistantSettings", "BenchConfig", "BenchContext",
    "HFStepRecorder", "Method", "MethodRecord", "MethodUnavailable", "Prompt", "RunResult", "Runner",
    "all_methods", "build_hf_assisted", "build_hf_lookup", "build_runners", "compiled_runner", "corpus_prompts",
    "describe_machine", "documented_functions", "efficiency", "forward_costs", "hf_runner", "hf_sampling_kwargs",
    "interleaved_forward_seconds", "llamacpp_methods", "load_models", "make_eagle", "make_lookahead", "make_medusa",
    "median_forward_seconds", "memory_bandwidth", "decode_floor", "merged_stats", "method_names", "model_card",
    "need_draft", "new_tokens_of",
    "optional_drafter", "ours_runner", "run_benchmark", "select_methods", "settings_dict", "shown_then_repeated",
    "signature_and_docstring", "summarise", "summarise_set", "time_methods", "tuned", "vllm_methods",
]


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
            started = time.perf_counter()
            for prompt in prompts if compiled else prompts[:1]:
                run(prompt.ids, config.seed)
            records[name].warmup_seconds += time.perf_counter() - started
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
    costs["floor"] = decode_floor(pair.target, memory_bandwidth(device=next(pair.target.parameters()).device))
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

