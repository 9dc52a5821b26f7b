"""Acceptance against temperature: alpha and tau of each drafter as sampling gets hotter.

    specdec sweep --html sweep.html              # the zoo, 3 held-out prompts x 32 tokens, T in 0 .. 1.3

The course's tables show temperature 0 and 1 only; this draws the curve in between and past it. A method's
alpha is the share of the draft positions it verified that the target kept (for a tree, along its deepest
path); tau is tokens per target forward (bonus token included, plain decoding = 1). What the figure shows on
the zoo is the point of it: a drafter whose draws are verified against its own q (the draft model, the EAGLE
chain, sampled EAGLE trees) keeps much of its gain as T rises, because p and q flatten together; a tree of
top-k tokens verified as point masses (EAGLE's "top" children, Medusa's lossless rule) only keeps a token with
probability p(x), which falls as p flattens; Medusa's typical acceptance keeps its tau because it is LOSSY: it
accepts whatever the target finds plausible enough, and its output is not the target's distribution.

No speed is measured here (that is `specdec bench`'s job): only counts, so the sweep is cheap and its figures
do not depend on the machine's load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec_lab.decode import default_eos, generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.models import ModelPair, load_pair, zoo_path
from specdec_lab.stats import DecodeStats

TEMPERATURES = (0.0, 0.3, 0.7, 1.0, 1.3)


@dataclass
class SweepMethod:
    """One curve: name (command-line id), label (legend), lossless, and make(pair, config) -> drafter (raises
    FileNotFoundError / ValueError when its weights are missing or do not fit the target)."""

    name: str
    label: str
    lossless: bool
    make: Callable


def zoo_eagle(pair: ModelPair, config: SweepConfig, **settings):
    from specdec_lab.drafters.eagle import EagleDrafter, EagleHead

    return EagleDrafter(EagleHead.load(zoo_path() / "eagle", pair.target), **settings)


def zoo_medusa(pair: ModelPair, acceptance: str):
    from specdec_lab.drafters.medusa import MedusaDrafter

    return MedusaDrafter.from_pretrained(zoo_path() / "medusa", pair.target, acceptance=acceptance)


def zoo_mtp(pair: ModelPair):
    from specdec_lab.drafters.mtp import MTPDrafter

    return MTPDrafter.from_pretrained(zoo_path() / "mtp", pair.target)


def need_draft(pair: ModelPair):
    if pair.draft is None:
        raise FileNotFoundError("no draft model (the zoo draft is missing, or pass --draft PATH)")
    return pair.draft


METHODS = [
    SweepMethod("draft", "draft model, token-wise", True, lambda pair, c: DraftModelDrafter(need_draft(pair), k=c.k)),
    SweepMethod("draft-block", "draft model, block verification", True,
                lambda pair, c: DraftModelDrafter(need_draft(pair), k=c.k, verification="block")),
    SweepMethod("eagle-chain", "EAGLE chain", True, lambda pair, c: zoo_eagle(pair, c, mode="chain", depth=c.k)),
    SweepMethod("eagle-tree-sampled", "EAGLE tree, sampled children", True,
                lambda pair, c: zoo_eagle(pair, c, mode="tree", children="sampled", total_tokens=c.tree_tokens)),
    SweepMethod("eagle-tree-top", "EAGLE tree, top-k children", True,
                lambda pair, c: zoo_eagle(pair, c, mode="tree", children="top", total_tokens=c.tree_tokens)),
    SweepMethod("mtp", "MTP modules, chain", True, lambda pair, c: zoo_mtp(pair)),
    SweepMethod("medusa", "Medusa, lossless rejection", True, lambda pair, c: zoo_medusa(pair, "rejection")),
    SweepMethod("medusa-typical", "Medusa, typical acceptance (LOSSY)", False,
                lambda pair, c: zoo_medusa(pair, "typical")),
]


def method_names() -> list[str]:
    """The names `--methods` accepts."""
    return [m.name for m in METHODS]


@dataclass
class SweepConfig:
    """What to sweep.

    temperatures: the sampling temperatures (0 = greedy); methods: names from `method_names()` (None = all);
    prompts: held-out prompts; max_new_tokens: tokens per prompt; seeds: sampled runs per prompt at each
    temperature above 0 (greedy runs once); k: draft length of the chains; tree_tokens: EAGLE tree budget;
    threads: torch CPU threads; seed: base seed; target / draft: model folders (None = the zoo);
    progress: show a tqdm bar.
    """

    temperatures: tuple[float, ...] = TEMPERATURES
    methods: list[str] | None = None
    prompts: int = 3
    max_new_tokens: int = 32
    seeds: int = 2
    k: int = 4
    tree_tokens: int = 16
    threads: int = 2
    seed: int = 0
    target: str | None = None
    draft: str | None = None
    progress: bool = True

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        for name in ("prompts", "max_new_tokens", "seeds", "k", "tree_tokens", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.temperatures or any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {list(self.temperatures)}")
        unknown = sorted(set(self.methods or []) - set(method_names()))
        if unknown or self.methods == []:
            raise ValueError(f"unknown method(s) {unknown}; choose from {method_names()}")


def merged(runs: list[DecodeStats]) -> DecodeStats:
    """Several runs' counters added up, as if they were one run."""
    total = DecodeStats()
    for s in runs:
        for name in ("target_forwards", "drafted", "accepted", "new_tokens"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
    return total


def run_sweep(config: SweepConfig, pair: ModelPair | None = None) -> dict:
    """Run every method at every temperature on the same prompts and seeds; return a JSON-ready dict.

    config: what to run; pair: the models (default: `config.target` / `config.draft`, or the zoo). Methods whose
    weights are missing or do not fit the target are listed under "skipped" with the reason.
    """
    from tqdm.auto import tqdm

    from specdec_lab.bench import corpus_prompts

    config.check()
    torch.set_num_threads(config.threads)
    pair = pair or load_pair(target=config.target, draft=config.draft)
    eos = default_eos(pair.target)
    prompts = corpus_prompts("heldout", pair.tokenizer, config.prompts, 400)
    methods = [m for m in METHODS if config.methods is None or m.name in config.methods]
    drafters, skipped = {}, {}
    for method in methods:
        try:
            drafter = method.make(pair, config)
            # A short trial run: heads trained for another target fail here, not in the middle of the sweep.
            generate(pair.target, prompts[0].ids[:8], drafter=drafter, max_new_tokens=2)
            drafters[method.name] = drafter
        except (FileNotFoundError, ValueError, RuntimeError, AttributeError, TypeError) as error:
            skipped[method.name] = f"{type(error).__name__}: {error}"
    runs = sum(len(prompts) * (1 if t == 0 else config.seeds) for t in config.temperatures) * len(drafters)
    rows = {}
    with tqdm(total=runs, desc="sweep", unit="run", disable=not config.progress) as progress:
        for method in methods:
            if method.name not in drafters:
                continue
            row = {"label": method.label, "lossless": method.lossless, "temperature": [], "alpha": [], "tau": []}
            for temperature in config.temperatures:
                stats = []
                for index, prompt in enumerate(prompts):
                    for repeat in range(1 if temperature == 0 else config.seeds):
                        out = generate(pair.target, prompt.ids, drafter=drafters[method.name],
                                       max_new_tokens=config.max_new_tokens, temperature=temperature,
                                       seed=config.seed + index * config.seeds + repeat, eos_token_id=eos)
                        stats.append(out.stats)
                        progress.update(1)
                total = merged(stats)
                row["temperature"].append(temperature)
                row["alpha"].append(round(total.acceptance_rate, 4))
                row["tau"].append(round(total.mean_accepted_tokens, 4))
            rows[method.name] = row
    settings = {key: getattr(config, key) for key in ("prompts", "max_new_tokens", "seeds", "k", "tree_tokens",
                                                       "threads", "seed")}
    return {"settings": settings | {"temperatures": list(config.temperatures)},
            "prompt_sources": [p.source for p in prompts], "methods": rows, "skipped": skipped}
