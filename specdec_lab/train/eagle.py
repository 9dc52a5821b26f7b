"""Training EAGLE heads on the frozen zoo target: EAGLE-1, and the EAGLE-3 direction as a variant.

Data: random windows x_0 .. x_L of the corpus token stream. The frozen target gives, at every position t, its
per-layer hidden states (f_t = the final-normed top feature) and its next-token distribution p_t = p(. | x_<=t).

Both variants share one unrolled computation. A chain starts at every position i; its step s (s = 1 .. S)
sits at position i + s - 1, reads token x_{i+s} and an input feature (the target's at step 1, the head's own
previous output afterwards) and predicts the feature f_{i+s}, hence the distribution p_{i+s}:

    step 1:  out_1[i] = head(feature_i, x_{i+1})          attends to the step-1 entries of positions <= i
    step s:  out_s[i] = head(out_{s-1}[i], x_{i+s})       also attends to its own chain's entries of steps 2..s

which is exactly what the head sees while drafting (a verified prefix, then its own predictions): this is
EAGLE-3's "training-time test". With S = 1 it is EAGLE-1's teacher-forced training.

Losses, per step (the paper's): feature regression smooth_l1(out_s, f_{i+s}) and token cross-entropy between
the target's p_{i+s} and softmax(lm_head(out_s)); EAGLE-1 weighs them 1.0 and 0.1 and adds uniform noise to
the input features (robustness to its own errors); the EAGLE-3 variant fuses low, middle and high layers,
keeps the token loss only (a fused input has no single feature to regress) and unrolls S = 3 steps.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from specdec_lab.drafters.eagle import EagleConfig, EagleDrafter, EagleHead, additive_mask
from specdec_lab.train.lm import fixed_eval_batches
from specdec_lab.train.loop import bf16_here, hardware, learning_curve, train
from specdec_lab.train.recipe import RunConfig, ZooRecipe, section_with_run
from specdec_lab.train.target_outputs import TrainingMix
from specdec_lab.train.zoo import (
    drop_stage_carry,
    phase_workdir,
    record_result,
    stage_carry,
    token_streams,
    training_data,
)

# Zoo folder and training.json entry of each variant.
VARIANTS = {"eagle1": "eagle", "eagle3": "eagle3", "eagle1-vllm": "eagle-vllm"}
EVAL_STEPS = 4  # both variants are evaluated unrolled this far (depths 1 to 4), so their figures compare


@dataclass
class EagleRecipe:
    """Hyper-parameters of one EAGLE head variant (stored in recipe.json under "eagle").

    feature_layers: target hidden-state indices the head reads (None = the top feature only); unroll_steps:
    training-time-test depth S (1 = plain teacher forcing); reg_weight / cls_weight: weights of the feature
    regression and token cross-entropy losses; feature_noise: half-width of the uniform noise added to the
    input features; init_from_layer: target layer the decoder layer starts from (None = random); layout: the
    head's layout (`EagleConfig.layout`: "course", or "vllm" for the paper's head as vLLM loads it);
    target_outputs: train on the recipe's corpus/target-output mix (False: the corpus alone, which needs no
    hour of target generation first); run: optimiser.
    """

    feature_layers: list[int] | None = None
    unroll_steps: int = 1
    reg_weight: float = 1.0
    cls_weight: float = 0.1
    feature_noise: float = 0.1
    init_from_layer: int | None = -1
    layout: str = "course"
    target_outputs: bool = True
    run: RunConfig = field(default_factory=lambda: RunConfig(steps=300, batch_size=4, seq_len=256, lr=1e-3,
                                                             warmup_steps=20, eval_every=50, eval_batches=2,
                                                             checkpoint_every=25))

    @classmethod
    def from_dict(cls, data: dict) -> EagleRecipe:
        """Read one variant's section (its "run" becomes a `RunConfig`)."""
        return section_with_run(cls, data)


def default_recipes(target_layers: int) -> dict[str, EagleRecipe]:
    """EAGLE-1 (top feature, regression + 0.1 token loss), the EAGLE-3 variant (low/middle/high fused,
    token loss only, 3-step training-time test), on the same data (same seed, same batch shapes), and EAGLE-1
    in vLLM's layout on the corpus alone (the head `specdec_lab.vllm` converts for vLLM)."""
    return {
        "eagle1": EagleRecipe(),
        "eagle3": EagleRecipe(feature_layers=[1, target_layers // 2, target_layers], unroll_steps=3,
                              reg_weight=0.0, cls_weight=1.0, feature_noise=0.0),
        "eagle1-vllm": EagleRecipe(layout="vllm", target_outputs=False),
    }


def unroll_allowed(chains: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(C, step * C) booleans for step `step` of C parallel chains whose cache holds steps 1..step in blocks.

    Chain i sees the step-1 entries of positions <= i (the verified prefix) and, of every later step, only
    its own entry (its own speculative path).
    """
    prefix = torch.ones(chains, chains, dtype=torch.bool, device=device).tril()
    own = torch.eye(chains, dtype=torch.bool, device=device)
    return torch.cat([prefix] + [own] * (step - 1), dim=1)


def unroll(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, steps: int,
           noise: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Run the head `steps` times on its own outputs, one chain starting at every position.

    features: (B, C, H) fused target features at positions 0 .. C-1; tokens: (B, C + steps) the window's
    tokens (tokens[:, t] = x_t); noise: optional (B, C, H) added to the step-1 features. Returns the
    predicted features of each step, out_s[:, i] ~ f_{i+s}, each (B, C, H).
    """
    chains = features.shape[1]
    cache = head.new_cache()
    inputs = features if noise is None else features + noise
    outputs = []
    for s in range(1, steps + 1):
        positions = torch.arange(chains, device=features.device)[None] + s - 1
        mask = additive_mask(unroll_allowed(chains, s, features.device), features.dtype)
        inputs = head(inputs, tokens[:, s : s + chains], positions.expand(tokens.shape[0], -1), mask, cache)
        outputs.append(inputs)
    return outputs


@torch.no_grad()
def target_view(target: LlamaForCausalLM, batch: torch.Tensor,
                bf16: bool = False) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The frozen target's per-layer hidden states and logits on a batch of windows (computed under bf16
    autocast when `bf16`: the teacher's forward is most of a training step; returned in fp32 either way)."""
    with torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = target(batch, output_hidden_states=True)
    return tuple(h.float() for h in out.hidden_states), out.logits.float()


def soft_cross_entropy(target_logits: torch.Tensor, head_logits: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy H(p_target, q_head) over positions (nats)."""
    return -(F.softmax(target_logits, -1) * F.log_softmax(head_logits, -1)).sum(-1).mean()


def eagle_losses(head: EagleHead, target: LlamaForCausalLM, batch: torch.Tensor, steps: int,
                 noise_width: float = 0.0, seed: int = 0, bf16_teacher: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per unroll step: feature regression ("reg"), token cross-entropy ("cls") and agreement of the head's
    argmax with the target's ("acc") on `batch` (B, L) of windows (the target's forward under bf16
    autocast when `bf16_teacher`)."""
    hidden, logits = target_view(target, batch, bf16_teacher)
    chains = batch.shape[1] - steps
    features = head.fuse_features(tuple(h[:, :chains] for h in hidden))
    noise = None
    if noise_width > 0:
        gen = torch.Generator().manual_seed(seed)
        noise = (torch.rand(features.shape, generator=gen) * 2 - 1).mul_(noise_width).to(features)
    top = hidden[-1]
    results = []
    for s, out in enumerate(unroll(head, features, batch, steps, noise), start=1):
        head_logits = head.logits(out)
        want_logits = logits[:, s : s + chains]
        results.append({
            "reg": F.smooth_l1_loss(out, top[:, s : s + chains]),
            "cls": soft_cross_entropy(want_logits, head_logits),
            "acc": (head_logits.argmax(-1) == want_logits.argmax(-1)).float().mean(),
        })
    return results


def train_head(head: EagleHead, target: LlamaForCausalLM, data: TrainingMix, val_stream: torch.Tensor,
               recipe: EagleRecipe, workdir: Path, desc: str, max_minutes: float | None = None,
               carry: Path | None = None) -> dict:
    """Train `head` on the frozen `target`; returns validation figures (per-step agreement with the target's
    argmax when unrolled `EVAL_STEPS` steps, and the step-1 token loss) plus timing."""
    target.eval().requires_grad_(False)
    run = recipe.run
    val = fixed_eval_batches(val_stream, run)
    bf16 = bf16_here(run, next(target.parameters()).device.type)

    def loss_on_batch(step: int) -> torch.Tensor:
        seed = run.seed * 1_000_003 + step
        batch = data.batch(run.batch_size, run.seq_len, seed)
        per_step = eagle_losses(head, target, batch, recipe.unroll_steps, recipe.feature_noise, seed, bf16)
        total = sum(recipe.reg_weight * r["reg"] + recipe.cls_weight * r["cls"] for r in per_step)
        return total / len(per_step)

    def evaluate() -> dict:
        sums: dict[str, float] = {}
        for batch in val:
            for s, r in enumerate(eagle_losses(head, target, batch, EVAL_STEPS), start=1):
                for key, name in (("acc", f"acc{s}"), ("cls", f"cls{s}")):
                    sums[name] = sums.get(name, 0.0) + r[key].item() / len(val)
        return {k: round(v, 4) for k, v in sorted(sums.items())}

    result = train(head, loss_on_batch, evaluate, run, workdir, desc, max_minutes, carry)
    if not result["finished"]:  # paused: report where the head stands now, not at its last evaluation
        with torch.no_grad():
            result.update(evaluate())
    return result


def eagle_section(recipe_path: Path, target_layers: int) -> dict[str, EagleRecipe]:
    """The recipe's "eagle" section, written with the defaults when missing (re-read just before writing:
    other stages edit the same file)."""
    section = ZooRecipe.load(recipe_path).extra.get("eagle")
    missing = {name: asdict(r) for name, r in default_recipes(target_layers).items() if name not in (section or {})}
    if missing:  # a variant the recipe predates is written with its defaults, the others kept as they are
        section = {**(section or {}), **missing}
        fresh = ZooRecipe.load(recipe_path)
        fresh.extra["eagle"] = section
        fresh.save(recipe_path)
    return {name: EagleRecipe.from_dict(data) for name, data in section.items()}


def run_eagle_stage(variant: str, recipe_path: str | Path, workdir: str | Path,
                    max_minutes: float | None = None, export_partial: bool = False) -> dict:
    """Train one EAGLE head variant ("eagle1" or "eagle3") on the zoo target and write it into the zoo.

    recipe_path: the zoo's recipe.json (its folder holds target/ and tokenizer/); workdir: checkpoints and
    logs (resumed by the same call); max_minutes: pause, checkpointed, after this long; export_partial:
    when paused, still write the head as it stands (its record says how many steps it had), for a fixed
    wall-clock budget on a shared machine. A later call resumes and overwrites it.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown EAGLE variant {variant!r}; choose from {', '.join(VARIANTS)}")
    recipe_path = Path(recipe_path)
    zoo_dir = recipe_path.parent
    if not (zoo_dir / "target" / "config.json").exists():
        raise FileNotFoundError(f"no target model in {zoo_dir / 'target'}: train the target first")
    started = time.time()
    zoo = ZooRecipe.load(recipe_path)
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32).eval()
    recipe = eagle_section(recipe_path, target.config.num_hidden_layers)[variant]
    workdir = Path(workdir) / zoo.name
    if recipe.target_outputs:
        data, val_stream = training_data(zoo, zoo_dir, workdir, target)
    else:
        train_stream, val_stream = token_streams(zoo, zoo_dir, workdir)
        data = TrainingMix(train_stream)
    config = EagleConfig.from_target(target, recipe.feature_layers, variant, recipe.layout)
    torch.manual_seed(recipe.run.seed)
    head = EagleHead(config).attach(target)
    if recipe.init_from_layer is not None:
        head.init_from_target_layer(target, recipe.init_from_layer)
    result = train_head(head, target, data, val_stream, recipe, phase_workdir(zoo_dir, workdir, variant),
                        variant, max_minutes, stage_carry(zoo_dir, variant))
    if not result["finished"]:
        print(f"{variant}: paused at step {result['steps']}; run the same command again to resume")
        if not export_partial:
            return result
    head.save(zoo_dir / VARIANTS[variant])
    run = recipe.run
    result.update(parameters=sum(p.numel() for p in head.parameters()), feature_layers=config.feature_layers,
                  layout=config.layout, target_outputs=recipe.target_outputs,
                  unroll_steps=recipe.unroll_steps, planned_steps=run.steps,
                  tokens_seen=result["steps"] * run.batch_size * run.seq_len,
                  learning_curve=learning_curve(phase_workdir(zoo_dir, workdir, variant) / "log.jsonl", run,
                                                EVAL_STEPS),
                  wall_seconds_this_call=round(time.time() - started, 1))
    record_result(zoo_dir, VARIANTS[variant], result)
    if result["finished"]:
        drop_stage_carry(zoo_dir, VARIANTS[variant])
    return result


# --- Measuring the shipped heads (a script, not a test: `python -m specdec_lab.train.eagle --help`) ----------


def run_timed(target, ids: list[int], drafter, max_new_tokens: int) -> tuple[list[int], float, float]:
    """One greedy generation: its tokens, tau, and wall seconds."""
    from specdec_lab.decode import generate

    started = time.perf_counter()
    out = generate(target, ids, drafter=drafter, max_new_tokens=max_new_tokens)
    return out.tokens, out.stats.mean_accepted_tokens, time.perf_counter() - started


RANK_TEMPERATURES = (1.0, 0.5, 0.25, 0.125)
FIT_TREE = {"depth": 5, "top_k": 8, "total_tokens": 16}  # the tree the zoo's heads are fitted with


def fit_rank_temperature(head: EagleHead, target: LlamaForCausalLM, prompts: list[list[int]],
                         candidates: tuple[float, ...] = RANK_TEMPERATURES, depth: int = FIT_TREE["depth"],
                         top_k: int = FIT_TREE["top_k"], total_tokens: int = FIT_TREE["total_tokens"],
                         max_new_tokens: int = 64) -> dict:
    """The tree-ranking temperature under which the head's EAGLE-2 trees keep the most tokens per forward.

    head / target: the head and the target it drafts for; prompts: token ids of TRAINING-split prompts (the
    held-out figures must not be tuned on); candidates: temperatures to try, the first one wins ties;
    depth / top_k / total_tokens: the tree (see `EagleDrafter`); max_new_tokens: greedy tokens per prompt.
    The temperature changes only which nodes are verified, so a step costs the same under every candidate
    and tau alone decides. Returns {"tau": {temperature: tokens per target forward}, "best": temperature}.
    """
    from specdec_lab.decode import generate

    taus = {}
    for temperature in candidates:
        drafter = EagleDrafter(head, "tree", depth, top_k, total_tokens, temperature)
        runs = [generate(target, ids, drafter=drafter, max_new_tokens=max_new_tokens).stats for ids in prompts]
        taus[temperature] = round(sum(s.new_tokens for s in runs) / sum(s.target_forwards for s in runs), 3)
    return {"tau": taus, "best": max(taus, key=taus.get)}


def fit_zoo_heads(zoo_dir: Path, prompts: int = 20, max_new_tokens: int = 64, threads: int = 2) -> dict:
    """Fit `rank_temperature` for every EAGLE head of the zoo on training-split prompts and store it in the
    head's config.json (the weights are left alone). Returns the fits, per head folder."""
    from transformers import AutoTokenizer

    from specdec_lab.train.corpus import function_prompts

    torch.set_num_threads(threads)
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
    ids_list = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in function_prompts("train", prompts)]
    fits = {"prompts": f"{len(ids_list)} training-split functions", "max_new_tokens": max_new_tokens,
            "tree": FIT_TREE}
    for folder in VARIANTS.values():
        if not (zoo_dir / folder / "model.safetensors").exists():
            continue
        head = EagleHead.load(zoo_dir / folder, target)
        fits[folder] = fit_rank_temperature(head, target, ids_list, max_new_tokens=max_new_tokens, **FIT_TREE)
        head.config.rank_temperature = fits[folder]["best"]
        head.save_config(zoo_dir / folder)
    return fits


def measure_heads(prompts: int = 20, max_new_tokens: int = 64, depth: int = 5, tree_depth: int = 6,
                  top_k: int = 8, budgets: tuple[int, ...] = (8, 16, 24, 32, 48),
                  variant_budgets: tuple[int, ...] = (16, 32), draft_ks: tuple[int, ...] = (5, 16),
                  threads: int = 2, zoo_dir: Path | None = None, rank_temperature: float | None = None) -> dict:
    """Greedy figures of the zoo's EAGLE heads on held-out prompts, all methods measured in one run.

    For every prompt (signature + docstring of a validation-file function) the methods run back to back,
    so load on the machine hits them alike: plain decoding, the draft model (k in `draft_ks`: equal
    verification budgets), the EAGLE-1 head as a chain (depth) and as trees of each size in `budgets`
    (tree_depth, top_k, rank_temperature: see `EagleDrafter`; None = each head's fitted value), and the
    other heads (EAGLE-3, the vLLM-layout EAGLE-1) as chains and as trees of `variant_budgets`. Reports tau,
    tokens/s, speed-up over plain (ratio of summed times) and greedy equality with plain decoding.
    """
    from transformers import AutoTokenizer

    from specdec_lab.drafters.draft_model import DraftModelDrafter
    from specdec_lab.models import zoo_path
    from specdec_lab.train.corpus import heldout_prompts

    torch.set_num_threads(threads)
    zoo_dir = Path(zoo_dir or zoo_path())
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
    methods: dict[str, object] = {"plain": None}
    if (zoo_dir / "draft" / "config.json").exists():
        draft = LlamaForCausalLM.from_pretrained(str(zoo_dir / "draft"), dtype=torch.float32).eval()
        for k in draft_ks:
            methods[f"draft k={k}"] = DraftModelDrafter(draft, k=k)
    used_temperatures = {}
    # EAGLE-1 gets the full sweep of tree sizes; the other heads (EAGLE-3, the vLLM-layout head) the shorter one.
    tree_sizes = {folder: budgets if variant == "eagle1" else variant_budgets for variant, folder in VARIANTS.items()}
    for folder, sizes in tree_sizes.items():
        if not (zoo_dir / folder / "model.safetensors").exists():
            continue
        head = EagleHead.load(zoo_dir / folder, target)
        used_temperatures[folder] = head.config.rank_temperature if rank_temperature is None else rank_temperature
        methods[f"{folder} chain d={depth}"] = EagleDrafter(head, "chain", depth=depth)
        for budget in sizes:
            methods[f"{folder} tree n={budget}"] = EagleDrafter(head, "tree", tree_depth, top_k, budget,
                                                                rank_temperature)
    ids_list = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in heldout_prompts(prompts)]
    for drafter in methods.values():  # warm-up
        run_timed(target, ids_list[0], drafter, 8)
    rows = {name: {"tau": [], "seconds": 0.0, "tokens": 0, "same": 0} for name in methods}
    for ids in ids_list:
        plain_tokens = None
        for name, drafter in methods.items():
            tokens, tau, seconds = run_timed(target, ids, drafter, max_new_tokens)
            plain_tokens = tokens if plain_tokens is None else plain_tokens
            row = rows[name]
            row["tau"].append(tau)
            row["seconds"] += seconds
            row["tokens"] += len(tokens)
            row["same"] += tokens == plain_tokens
    plain_seconds = rows["plain"]["seconds"]
    table = {name: {"tau": round(sum(r["tau"]) / len(r["tau"]), 3),
                    "tokens_per_s": round(r["tokens"] / r["seconds"], 1),
                    "speedup": round(plain_seconds / r["seconds"], 3),
                    "same_as_plain": f"{r['same']}/{len(ids_list)}"}
             for name, r in rows.items()}
    return {"prompts": len(ids_list), "max_new_tokens": max_new_tokens, "threads": threads, "depth": depth,
            "tree_depth": tree_depth, "top_k": top_k, "rank_temperature": used_temperatures,
            "hardware": hardware(), "methods": table}


def main(argv: list[str] | None = None) -> None:
    """Command line: measure the zoo heads and record the figures in training.json ("eagle_heldout")."""
    import argparse
    import sys

    from specdec_lab.models import zoo_path

    parser = argparse.ArgumentParser(description=measure_heads.__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=20, help="held-out prompts (default: 20)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    parser.add_argument("--depth", type=int, default=5, help="chain length of EAGLE chain and draft model")
    parser.add_argument("--tree-depth", type=int, default=6, help="EAGLE-2 tree depth (default: 6)")
    parser.add_argument("--top-k", type=int, default=8, help="EAGLE-2 children per node (default: 8)")
    parser.add_argument("--budgets", default="8,16,24,32,48", help="EAGLE-1 tree sizes to sweep (total_tokens)")
    parser.add_argument("--variant-budgets", default="16,32",
                        help="tree sizes for the other heads: EAGLE-3, eagle-vllm (total_tokens)")
    parser.add_argument("--draft-ks", default="5,16", help="draft-model chain lengths (default: 5,16)")
    parser.add_argument("--rank-temperature", type=float, default=None,
                        help="EAGLE-2 ranks tree nodes by log-softmax(logits / this) (default: each head's fitted "
                             "value; 1.0 is the paper's ranking)")
    parser.add_argument("--fit-rank-temperature", action="store_true",
                        help="instead of measuring: fit each head's rank temperature on training-split prompts and "
                             "store it in the head's config.json")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    parser.add_argument("--no-record", action="store_true", help="print only; leave training.json alone")
    parser.add_argument("--zoo", type=Path, default=None,
                        help="the zoo folder whose heads to fit or measure (default: the shipped zoo)")
    args = parser.parse_args(argv)
    zoo_dir = args.zoo or zoo_path()
    if args.fit_rank_temperature:
        fits = fit_zoo_heads(zoo_dir, args.prompts, args.max_new_tokens, args.threads)
        print(json.dumps(fits, indent=2))
        if not args.no_record:
            record_result(zoo_dir, "eagle_rank_temperature", fits)
        return

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(",") if part)

    result = measure_heads(args.prompts, args.max_new_tokens, args.depth, args.tree_depth, args.top_k,
                           ints(args.budgets), ints(args.variant_budgets), ints(args.draft_ks), args.threads,
                           zoo_dir, args.rank_temperature)
    given = sys.argv[1:] if argv is None else argv
    # The card prints the command; which folder it ran on (a staging copy of the zoo) is not part of it.
    shown = [a for i, a in enumerate(given) if not (a == "--zoo" or a.startswith("--zoo=")
                                                   or (i > 0 and given[i - 1] == "--zoo"))]
    result["command"] = " ".join(["python -m specdec_lab.train.eagle", *shown])
    print(json.dumps(result, indent=2))
    if not args.no_record:
        record_result(zoo_dir, "eagle_heldout", result)


if __name__ == "__main__":
    main()
