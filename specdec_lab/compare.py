"""Drafters on one target, side by side: how deep into a draft each stays right, and what a draft costs.

Three of the course's drafters read the target's own features and differ only in how they reach depth d:

- Medusa: K independent heads on the same last feature; head d guesses token t + d without seeing tokens
  t + 1 .. t + d - 1, so its acceptance falls fastest with depth;
- MTP (DeepSeek-V3): K chained modules; module d sees module d - 1's state and the drafted token before it;
- EAGLE: one head rolled forward on its own predicted features, every depth by the same weights.

The draft model reads only tokens. Run as greedy chains on the same held-out prompts, the per-depth
acceptance shows the structural difference directly, and the drafting time shows its price. No speed claim is
made here (drafting milliseconds are a cost reading of this machine at this moment; `specdec bench` measures
speed against a same-run baseline).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec_lab.decode import default_eos, generate
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.models import ModelPair, zoo_path


@dataclass
class Contender:
    """One drafter of the comparison: name (short id), label (what it is), make(pair, k, zoo) -> drafter (raises
    FileNotFoundError when its weights are not in the zoo folder `zoo`)."""

    name: str
    label: str
    make: Callable


def _medusa(pair: ModelPair, k: int, zoo: Path):
    from specdec_lab.drafters.medusa import MedusaDrafter

    chain = [(0,) * depth for depth in range(1, k + 1)]  # each head's top token, one per depth
    return MedusaDrafter.from_pretrained(zoo / "medusa", pair.target, tree=chain)


def _eagle(folder: str) -> Callable:
    def make(pair: ModelPair, k: int, zoo: Path):
        from specdec_lab.drafters.eagle import EagleDrafter, EagleHead

        return EagleDrafter(EagleHead.load(zoo / folder, pair.target), mode="chain", depth=k)

    return make


def _mtp(pair: ModelPair, k: int, zoo: Path):
    from specdec_lab.drafters.mtp import MTPDrafter

    return MTPDrafter.from_pretrained(zoo / "mtp", pair.target)  # drafts one token per module


def _draft_model(pair: ModelPair, k: int, zoo: Path):
    if pair.draft is None:
        raise FileNotFoundError("no draft model in this pair")
    return DraftModelDrafter(pair.draft, k=k)


CONTENDERS = [
    Contender("medusa", "Medusa heads (parallel, one feature)", _medusa),
    Contender("mtp", "MTP modules (chained, DeepSeek-V3)", _mtp),
    Contender("eagle", "EAGLE-1 head (one head, rolled forward)", _eagle("eagle")),
    Contender("eagle3", "EAGLE-3 head (fused layers, rolled forward)", _eagle("eagle3")),
    Contender("draft", "draft model (tokens only)", _draft_model),
]


def compare_drafters(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int = 64, k: int = 4,
                     names: list[str] | None = None, zoo: str | Path | None = None) -> dict:
    """Greedy chains of every contender on the same prompts; per-depth acceptance, tau and drafting time.

    pair: the target (and the draft model) the heads were trained for; prompts: token-id lists; k: the chain's
    length (MTP drafts at most its number of modules); names: contenders to run (None = all); zoo: the folder
    holding the heads (None = the shipped zoo). Returns a
    JSON-ready dict: per contender its depth, tau, how often each depth was drafted and kept, survival (share of
    steps keeping depth d, i.e. every depth up to d), conditional acceptance (kept at d among steps that reached
    d), drafting ms per step, and how many prompts gave exactly the plain greedy tokens; contenders whose weights
    are missing are under "skipped".
    """
    eos = default_eos(pair.target)
    plain = [generate(pair.target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos).tokens for ids in prompts]
    rows, skipped = {}, {}
    for contender in CONTENDERS:
        if names is not None and contender.name not in names:
            continue
        try:
            drafter = contender.make(pair, k, Path(zoo) if zoo is not None else zoo_path())
        except FileNotFoundError as error:
            skipped[contender.name] = str(error)
            continue
        runs = [generate(pair.target, ids, drafter=drafter, max_new_tokens=max_new_tokens, eos_token_id=eos)
                for ids in prompts]
        steps = sum(len(run.stats.accepted_per_step) for run in runs)
        drafted_at, reached_at, accepted_at = (sum((getattr(run.stats, name) for run in runs), Counter())
                                               for name in ("drafted_at", "reached_at", "accepted_at"))
        depth = max(drafted_at) + 1 if drafted_at else 0
        rows[contender.name] = {
            "label": contender.label,
            "depth": depth,
            "tau": round(sum(r.stats.new_tokens for r in runs) / sum(r.stats.target_forwards for r in runs), 3),
            "drafted": [drafted_at[d] for d in range(depth)],
            "kept": [accepted_at[d] for d in range(depth)],
            "survival": [round(accepted_at[d] / drafted_at[d], 3) for d in range(depth)],
            "conditional": [round(accepted_at[d] / reached_at[d], 3) if reached_at[d] else None
                            for d in range(depth)],
            "draft_ms_per_step": round(1000 * sum(r.stats.draft_seconds for r in runs) / max(steps, 1), 3),
            "same_as_plain": sum(run.tokens == tokens for run, tokens in zip(runs, plain, strict=True)),
        }
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "k": k,
            "threads": torch.get_num_threads(), "drafters": rows, "skipped": skipped}


def comparison_table(result: dict) -> str:
    """A markdown table of `compare_drafters`' result: conditional acceptance per depth, tau, drafting cost."""
    depth = max((row["depth"] for row in result["drafters"].values()), default=0)
    lines = ["| drafter | " + " | ".join(f"depth {d + 1}" for d in range(depth)) + " | tau | draft ms / step |",
             "|---" * (depth + 3) + "|"]
    for row in result["drafters"].values():
        cells = [f"{a:.2f}" if a is not None else "n/a" for a in row["conditional"]]
        cells += ["—"] * (depth - len(cells))
        lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {row['tau']:.2f} | "
                     f"{row['draft_ms_per_step']:.2f} |")
    return "\n".join(lines)
