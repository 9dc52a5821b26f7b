"""Hardware-aware tuning: pick the draft length and tree budget that are fastest on THIS device.

Speculation trades target forwards for wider ones. On a GPU a forward over 64 tokens costs about what one
token costs, so big trees pay; on a CPU the cost grows with every token fed, and a 32-node tree can be slower
than a 5-token chain although it accepts more. Sequoia (Chen et al. 2024) builds hardware-aware trees from
that observation; the tuner here does the same with a simple cost model:

    predicted tokens/s = tau / (draft time per step + target forward time(tokens fed) + overhead per step)

- the cost curve: the target's forward time after a cached prefix as a function of the tokens fed (1 .. 64),
  for causal (chain) inputs and for tree-shaped inputs (tree attention mask and position ids);
- tau and the drafter's time per step: measured by running each candidate setting on calibration prompts
  from the corpus's TRAINING split (held-out prompts stay for the benchmark); chains run once at the longest
  k, and tau(k) for every shorter k follows from how far each step's acceptance reached;
- the overhead: everything in a step that is neither drafting nor the target forward (the verification rule,
  cache bookkeeping, a tree's mask and the gather of its accepted path), measured for each candidate on its
  own calibration run: the run's time outside the drafter and outside the target's forward calls, which the
  loop times as they happen (`DecodeStats.forward_seconds`), per step. Timing the forwards in the run, not
  subtracting the curve's forward time, keeps the curve's noise (a few percent of a forward, more than the
  overhead itself) out of it. A tree's bookkeeping costs more than a chain's; an overhead shared by all
  methods would flatter trees.
- the tree budgets include the one-branch tree (top_k 1), which `EagleDrafter` drafts and verifies as a chain,
  priced from the chain's own run: where no width pays (a steep CPU curve), the tuned tree is the chain.

`choose` is the pure selection (synthetic curves in the tests); `tune` measures and returns the profile,
a JSON-ready dict that records the device it was measured on; `tuned_settings` reads a profile back as
drafter settings for a method and a temperature (`generate(..., tuned=...)`, `specdec ... --tuned`). The readers
live in `specdec_lab.profiles` (decoding with a profile needs none of the measuring here) and stay importable
from this module.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from specdec_lab.cache import CachePlan, cache_plan, new_cache, truncate
from specdec_lab.profiles import FORMAT, apply_profile, load_profile, tuned_settings
from specdec_lab.tree import DraftTree

__all__ = ["FORMAT", "apply_profile", "load_profile", "tuned_settings"]  # the profile readers, kept here for callers
TOKENS_FED = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
METHODS = ("draft", "eagle", "eagle-tree")
TREE_GRID = {"total_tokens": (4, 6, 8, 16, 32), "depth": (4, 6), "top_k": (4,)}
CHAIN_K = 8  # chains are run at this k; tau(k) for k <= CHAIN_K is read off the same steps


# ------------------------------------------------------------------------------------------- the cost model


@dataclass
class CostCurve:
    """A target forward's wall time as a function of the tokens fed (after a cached prefix).

    tokens: the measured sizes, increasing; chain_seconds / tree_seconds: the median time of one forward of
    that many causal tokens / tree-shaped tokens (the root plus tokens - 1 nodes).
    """

    tokens: list[int]
    chain_seconds: list[float]
    tree_seconds: list[float]

    def seconds(self, tokens: int, shape: str = "chain") -> float:
        """Forward time for `tokens` fed (linear between measured sizes, and beyond the last two).

        tokens: how many tokens the forward takes; shape: "chain" (causal) or "tree" (tree mask).
        """
        if shape not in ("chain", "tree"):
            raise ValueError(f"shape must be 'chain' or 'tree', got {shape!r}")
        ys = self.chain_seconds if shape == "chain" else self.tree_seconds
        xs = self.tokens
        if len(xs) == 1:
            return ys[0]
        i = max(1, min(len(xs) - 1, next((j for j, x in enumerate(xs) if x >= tokens), len(xs) - 1)))
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (tokens - x0) / (x1 - x0))


@dataclass
class Candidate:
    """One setting of one method, with what was measured for it.

    method: "draft", "eagle" (chain) or "eagle-tree"; settings: the drafter's keyword arguments (k / depth,
    or total_tokens, depth, top_k); tau: mean tokens per target forward; draft_seconds: drafting time per
    step; fed: tokens the verifying forward takes (k + 1, or nodes + 1); shape: "chain" or "tree";
    overhead_seconds: the rest of a step (see the module docstring), measured on the candidate's run.
    """

    method: str
    settings: dict
    tau: float
    draft_seconds: float
    fed: int
    shape: str
    overhead_seconds: float = 0.0
    predicted_tokens_per_second: float | None = None


def predicted_tokens_per_second(candidate: Candidate, curve: CostCurve, overhead_seconds: float = 0.0) -> float:
    """tau / (drafting + verifying forward + overhead) for one candidate on this curve.

    candidate: the measured setting (its own overhead included); curve: the device's forward costs;
    overhead_seconds: extra per-step time charged to every candidate (e.g. a synthetic what-if).
    """
    step = (candidate.draft_seconds + curve.seconds(candidate.fed, candidate.shape) + candidate.overhead_seconds
            + overhead_seconds)
    return candidate.tau / step


def choose(candidates: Sequence[Candidate], curve: CostCurve, overhead_seconds: float = 0.0) -> dict[str, Candidate]:
    """For every method among `candidates`, the candidate with the highest predicted tokens/s.

    candidates: measured settings (any methods); curve: the device's cost curve; overhead_seconds: as for
    `predicted_tokens_per_second`. Fills each candidate's `predicted_tokens_per_second`; ties go to the
    candidate listed first (list cheaper settings first).
    """
    best: dict[str, Candidate] = {}
    for candidate in candidates:
        candidate.predicted_tokens_per_second = predicted_tokens_per_second(candidate, curve, overhead_seconds)
        current = best.get(candidate.method)
        if current is None or candidate.predicted_tokens_per_second > current.predicted_tokens_per_second:
            best[candidate.method] = candidate
    return best


def chain_candidates(method: str, accepted_per_step: Sequence[int], drafted: int, draft_seconds: float,
                     k_max: int, setting: str, overhead_seconds: float = 0.0) -> list[Candidate]:
    """Candidates k = 1 .. k_max of a chain method from one run at k_max.

    A chain's first i tokens are accepted or not whatever follows them, so tau(k) = 1 + sum over i <= k of
    P(at least i accepted), read off the run's steps. accepted_per_step: tokens kept at each step of the run;
    drafted: tokens drafted in the run; draft_seconds: its drafting time (cost per drafted token = the ratio);
    k_max: the run's k; setting: the drafter keyword that holds k ("k" or "depth"); overhead_seconds: the
    run's per-step overhead (a chain's bookkeeping hardly depends on k).
    """
    if not accepted_per_step:
        raise ValueError(f"the {method} calibration run has no steps: give longer prompts or more new tokens")
    steps = len(accepted_per_step)
    per_token = draft_seconds / max(drafted, 1)
    out = []
    for k in range(1, k_max + 1):
        tau = 1 + sum(sum(a >= i for a in accepted_per_step) / steps for i in range(1, k + 1))
        out.append(Candidate(method, {setting: k}, tau, per_token * k, k + 1, "chain", overhead_seconds))
    return out


# ------------------------------------------------------------------------------------------- measurements


def example_tree(nodes: int, device: torch.device, branching: int = 4) -> DraftTree:
    """A tree-shaped input of `nodes` nodes below the root (breadth first, `branching` children each), on
    `device`."""
    parents = [-1 if i < branching else i // branching - 1 for i in range(nodes)]
    return DraftTree.from_parents(torch.zeros(nodes, dtype=torch.long, device=device), parents)


@torch.inference_mode()
def measure_cost_curve(target: torch.nn.Module, prefix: list[int], tokens: Sequence[int] = TOKENS_FED,
                       trials: int = 7, compile: bool = False) -> CostCurve:
    """Median forward time of `target` on each size in `tokens`, chain- and tree-shaped, after `prefix`.

    target: the model; prefix: the cached context (its last tokens are re-fed as input); tokens: sizes
    (each at most len(prefix)); trials: timed forwards per case; compile: time compiled forwards over a static
    cache (as `generate(compile=True)` runs them; the warm-up round compiles). Every case is timed once per
    round, in turns, so a slow patch of a shared machine hits all sizes alike.
    """
    from specdec_lab.tree import additive_mask

    if max(tokens) > len(prefix):
        raise ValueError(f"the prefix ({len(prefix)} tokens) must be at least as long as the largest size fed")
    device = next(target.parameters()).device
    if compile:
        return compiled_cost_curve(target, prefix, tokens, trials)
    cache = new_cache(target)
    target(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True, logits_to_keep=1)
    past = len(prefix)
    cases = []
    for n in tokens:
        feed = torch.tensor([prefix[-n:]], device=device)
        cases.append(("chain", n, dict(input_ids=feed)))
        tree = example_tree(n - 1, device)
        mask = additive_mask(tree.visibility().to(device), past, target.dtype)
        cases.append(("tree", n, dict(input_ids=feed, attention_mask=mask, position_ids=tree.position_ids(past))))
    times: dict[tuple[str, int], list[float]] = {(shape, n): [] for shape, n, _ in cases}
    for _ in range(trials + 1):  # the first round warms up
        for shape, n, kwargs in cases:
            started = time.perf_counter()
            target(**kwargs, cache=cache, use_cache=True)
            times[shape, n].append(time.perf_counter() - started)
            truncate(cache, past)
    median = {key: statistics.median(values[1:]) for key, values in times.items()}
    return CostCurve(list(tokens), [median["chain", n] for n in tokens], [median["tree", n] for n in tokens])


def compiled_cost_curve(target: torch.nn.Module, prefix: list[int], tokens: Sequence[int], trials: int) -> CostCurve:
    """`measure_cost_curve` for compiled forwards over a static cache sized as a decode run's would be."""
    from specdec_lab.forward import QUERY_BUCKETS, forward

    device = next(target.parameters()).device
    with cache_plan(CachePlan("static", len(prefix) + 2 * QUERY_BUCKETS[-1], compile=True)):
        cache = new_cache(target)
    forward(target, cache, torch.tensor(prefix, device=device), keep=1)
    past = len(prefix)
    cases = []
    for n in tokens:
        feed = torch.tensor(prefix[-n:], device=device)
        cases.append(("chain", n, dict(tokens=feed, keep=n)))
        tree = example_tree(n - 1, device)
        cases.append(("tree", n, dict(tokens=feed, visible=tree.visibility().to(device),
                                      positions=tree.position_ids(past))))
    times: dict[tuple[str, int], list[float]] = {(shape, n): [] for shape, n, _ in cases}
    for _ in range(trials + 1):  # the first round warms up (and compiles)
        for shape, n, kwargs in cases:
            started = time.perf_counter()
            forward(target, cache, **kwargs)
            times[shape, n].append(time.perf_counter() - started)
            truncate(cache, past)
    median = {key: statistics.median(values[1:]) for key, values in times.items()}
    return CostCurve(list(tokens), [median["chain", n] for n in tokens], [median["tree", n] for n in tokens])


def run_calibration(target, prompts: list[list[int]], make_drafter, max_new_tokens: int, temperature: float,
                    seed: int = 0, compile: bool = False) -> dict:
    """Run `make_drafter()` over the calibration prompts; pooled steps, drafting, forward and wall time.

    target: the model; prompts: token ids; make_drafter: returns a fresh drafter (None: plain decoding);
    max_new_tokens / temperature / seed: the generation settings (prompt i uses seed + i); compile: compiled
    forwards (`generate(compile=True)`).
    """
    from specdec_lab.decode import generate

    def run(i: int, ids: list[int]):
        return generate(target, ids, drafter=make_drafter(), max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed + i, compile=compile).stats

    if compile:  # an untimed pass first: a shape's first call compiles, and no timing may include that
        for i, ids in enumerate(prompts):
            run(i, ids)
    pooled = {"accepted_per_step": [], "drafted": 0, "draft_seconds": 0.0, "forward_seconds": 0.0,
              "total_seconds": 0.0, "steps": 0}
    for i, ids in enumerate(prompts):
        stats = run(i, ids)
        pooled["accepted_per_step"] += stats.accepted_per_step
        pooled["drafted"] += stats.drafted
        pooled["draft_seconds"] += stats.draft_seconds
        pooled["total_seconds"] += stats.total_seconds
        pooled["forward_seconds"] += stats.forward_seconds
        pooled["steps"] += len(stats.accepted_per_step)
    return pooled


def one_branch_tree(chain: Candidate, alpha: float | None = None) -> Candidate:
    """An EAGLE chain candidate as the tree budget that drafts it: `depth` nodes, one child each (top_k 1).

    `EagleDrafter` drafts and verifies a one-branch tree as a chain, so the tree method can always fall back
    to the chain when no width pays on this device, and its measurements are the chain's. alpha: recorded
    with sampled settings, like every sampled tree's (None when greedy).
    """
    depth = chain.settings["depth"]
    settings = {"total_tokens": depth, "depth": depth, "top_k": 1} | ({"alpha": alpha} if alpha is not None else {})
    return Candidate("eagle-tree", settings, chain.tau, chain.draft_seconds, chain.fed, "chain",
                     chain.overhead_seconds)


def step_overhead(run: dict) -> float:
    """A calibration run's time per step outside the drafter and outside the target's forward calls.

    run: `run_calibration`'s pooled figures (the forwards timed as they ran, the prompt's included, so
    every step, the one that fed the prompt too, counts once).
    """
    outside = run["total_seconds"] - run["draft_seconds"] - run["forward_seconds"]
    return max(0.0, outside) / max(run["steps"], 1)


def measure_candidates(pair, head, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                       tree_grid: dict = TREE_GRID,
                       chain_k: int = CHAIN_K, compile: bool = False) -> tuple[list[Candidate], float, dict]:
    """Measure every candidate of every available method at one temperature.

    pair: the `ModelPair` (its draft may be None); head: an `EagleHead` for the target, or None; prompts:
    calibration token ids; max_new_tokens / temperature: generation settings; tree_grid: the EAGLE tree
    settings to try (total_tokens, depth, top_k); chain_k: the longest chain; compile: compiled forwards.
    Returns (candidates, plain decoding's overhead per step, notes such as the alpha the sampled trees
    assumed).
    """
    from specdec_lab.drafters.draft_model import DraftModelDrafter
    from specdec_lab.drafters.eagle import EagleDrafter

    plain = run_calibration(pair.target, prompts, lambda: None, max_new_tokens, temperature, compile=compile)
    candidates: list[Candidate] = []
    notes: dict = {}
    if pair.draft is not None:
        run = run_calibration(pair.target, prompts, lambda: DraftModelDrafter(pair.draft, k=chain_k), max_new_tokens,
                              temperature, compile=compile)
        candidates += chain_candidates("draft", run["accepted_per_step"], run["drafted"], run["draft_seconds"],
                                       chain_k, "k", step_overhead(run))
    if head is not None:
        run = run_calibration(pair.target, prompts, lambda: EagleDrafter(head, mode="chain", depth=chain_k),
                              max_new_tokens, temperature, compile=compile)
        chain = chain_candidates("eagle", run["accepted_per_step"], run["drafted"], run["draft_seconds"], chain_k,
                                 "depth", step_overhead(run))
        candidates += chain
        # A sampled tree's shape assumes each tried child is accepted with the chain's first-token rate.
        alpha = min(0.95, max(0.05, chain[0].tau - 1))
        notes["alpha"] = round(alpha, 3)
        candidates += [one_branch_tree(c, notes["alpha"] if temperature > 0 else None) for c in chain]
        for nodes, depth, top_k in itertools.product(*(tree_grid[key] for key in ("total_tokens", "depth", "top_k"))):
            if depth > nodes:
                continue
            settings = {"total_tokens": nodes, "depth": depth, "top_k": top_k}
            if temperature > 0:
                settings["alpha"] = notes["alpha"]
            run = run_calibration(pair.target, prompts, lambda s=settings: EagleDrafter(head, mode="tree", **s),
                                  max_new_tokens, temperature, compile=compile)
            steps = max(run["steps"], 1)
            tau = 1 + sum(run["accepted_per_step"]) / steps
            candidates.append(Candidate("eagle-tree", settings, tau, run["draft_seconds"] / steps, nodes + 1, "tree",
                                        step_overhead(run)))
    return candidates, step_overhead(plain), notes


def tune(pair=None, head=None, prompts: int = 6, max_new_tokens: int = 48, temperatures: Sequence[float] = (0.0, 1.0),
         threads: int | None = 2, tree_grid: dict = TREE_GRID, chain_k: int = CHAIN_K, trials: int = 7,
         log=print, compile: bool = False) -> dict:
    """Measure this device and choose each method's settings; returns the profile (a JSON-ready dict).

    pair: a `ModelPair` (None = the zoo pair); head: an `EagleHead` (None = the zoo's EAGLE head when the
    target is the zoo's, else no EAGLE methods); prompts / max_new_tokens: the calibration workload, from the
    corpus's training split; temperatures: the settings to choose for (0 = greedy; > 0 = sampled, recorded
    under "sampled"); threads: torch CPU threads (None = leave as is); tree_grid / chain_k: the candidates;
    trials: timed forwards per size of the cost curve; log: where progress lines go (None = silent); compile:
    measure and calibrate with compiled forwards over static caches (`generate(compile=True)`), so the choices
    fit runs with `compile=True` (recorded in the profile).
    """
    from specdec_lab.machine import describe_machine
    from specdec_lab.models import load_pair, zoo_path
    from specdec_lab.train.corpus import function_prompts

    log = log or (lambda *args: None)
    if threads is not None:
        torch.set_num_threads(threads)
    if pair is None:
        pair = load_pair()
        if head is None and (zoo_path() / "eagle" / "config.json").exists():
            from specdec_lab.drafters.eagle import EagleHead

            head = EagleHead.load(zoo_path() / "eagle", pair.target)
    ids = [pair.tokenizer(text, add_special_tokens=False)["input_ids"] for text in function_prompts("train", prompts)]
    prefix = max(ids, key=len)
    while len(prefix) < max(TOKENS_FED):
        prefix = prefix + prefix
    log("measuring the target's forward time against the tokens fed ...")
    curve = measure_cost_curve(pair.target, prefix, TOKENS_FED, trials, compile=compile)
    log(format_curve(curve))
    profile = {"format": FORMAT, "device": describe_machine(torch.get_num_threads()),
               "models": {"target": getattr(pair.target.config, "_name_or_path", "") or "zoo target",
                          "draft": getattr(pair.draft.config, "_name_or_path", "") if pair.draft is not None else None,
                          "eagle_head": head.config.variant if head is not None else None},
               "cost_curve": {"prefix_tokens": len(prefix), "tokens": curve.tokens,
                              "chain_ms": [round(s * 1e3, 4) for s in curve.chain_seconds],
                              "tree_ms": [round(s * 1e3, 4) for s in curve.tree_seconds]},
               "calibration": {"split": "train", "prompts": len(ids), "max_new_tokens": max_new_tokens,
                               "compile": compile},
               "choices": {}}
    for temperature in temperatures:
        key = "greedy" if temperature == 0 else "sampled"
        log(f"calibrating at temperature {temperature} ({len(ids)} training-split prompts x {max_new_tokens} tokens)")
        candidates, overhead, notes = measure_candidates(pair, head, ids, max_new_tokens, temperature,
                                                           tree_grid, chain_k, compile=compile)
        best = choose(candidates, curve)
        plain_tps = 1 / (curve.seconds(1) + overhead)
        profile["choices"][key] = {
            "temperature": temperature, "overhead_ms": round(overhead * 1e3, 4),
            "plain_predicted_tokens_per_second": round(plain_tps, 2), **notes,
            "choice": {method: candidate.settings for method, candidate in best.items()},
            "candidates": [candidate_dict(c) for c in candidates],
        }
        log(format_choice(profile["choices"][key]))
    return profile


def candidate_dict(candidate: Candidate) -> dict:
    """A candidate as JSON-ready numbers (milliseconds, rounded)."""
    data = asdict(candidate)
    data["draft_ms"] = round(data.pop("draft_seconds") * 1e3, 4)
    data["overhead_ms"] = round(data.pop("overhead_seconds") * 1e3, 4)
    data["tau"] = round(data["tau"], 4)
    data["predicted_tokens_per_second"] = round(data["predicted_tokens_per_second"] or 0.0, 2)
    return data


def curve_from_profile(profile: dict) -> CostCurve:
    """The `CostCurve` stored in a profile."""
    c = profile["cost_curve"]
    return CostCurve(c["tokens"], [ms / 1e3 for ms in c["chain_ms"]], [ms / 1e3 for ms in c["tree_ms"]])


def format_curve(curve: CostCurve) -> str:
    """The cost curve as a small text table (ms, and relative to one token)."""
    lines = ["tokens fed   chain ms   tree ms   tree / 1 token"]
    for n, chain, tree in zip(curve.tokens, curve.chain_seconds, curve.tree_seconds, strict=True):
        lines.append(f"{n:>10} {chain * 1e3:>10.2f} {tree * 1e3:>9.2f} {tree / curve.chain_seconds[0]:>16.2f}x")
    return "\n".join(lines)


def format_choice(entry: dict) -> str:
    """One temperature's choice, with the best few candidates of each method."""
    lines = [f"temperature {entry['temperature']}: plain decoding predicted at "
             f"{entry['plain_predicted_tokens_per_second']:.1f} tokens/s"]
    by_method: dict[str, list[dict]] = {}
    for c in entry["candidates"]:
        by_method.setdefault(c["method"], []).append(c)
    for method, rows in by_method.items():
        rows = sorted(rows, key=lambda c: -c["predicted_tokens_per_second"])
        lines.append(f"  {method}: chose {entry['choice'][method]}")
        for c in rows[:4]:
            lines.append(f"    {c['settings']}  tau {c['tau']:.2f}  draft {c['draft_ms']:.2f} ms  fed {c['fed']}  "
                         f"overhead {c['overhead_ms']:.2f} ms -> {c['predicted_tokens_per_second']:.1f} tokens/s")
    return "\n".join(lines)
