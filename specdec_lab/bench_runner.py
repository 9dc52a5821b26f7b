"""What the benchmark and a method's runner agree on: the settings of a run (`BenchConfig`), what a runner is
given (`BenchContext`), what it returns for one prompt (`RunResult`), a method's entry in the table (`Method`), and
`MethodUnavailable`, which a runner's builder raises when its method cannot run here.

Every row of `specdec bench` is built on these: ours and Hugging Face's (`specdec_lab.bench_methods`),
llama.cpp's (`specdec_lab.llamacpp`) and vLLM's (`specdec_lab.vllm`). This module imports none of them, so each of
them can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdec_lab.bench_prompts import PROMPT_SETS
from specdec_lab.stats import DecodeStats

if TYPE_CHECKING:
    from specdec_lab.models import ModelPair

BASELINE = "hf-generate"


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
