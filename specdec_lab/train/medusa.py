"""The zoo's Medusa stage: train K Medusa-1 heads on the frozen target, pick their sparse tree, measure them.

Training (Medusa-1): the target stays frozen; head k (k = 1..K) reads the target's final hidden state h_t and
is trained with cross-entropy on token t + 1 + k of the corpus (the token after the target's own next
token). The per-head losses are weighted decay^(k-1), as in the paper, since later heads are less often
reached. On validation windows we then measure, per head, how often the correct token is its r-th choice;
those accuracies give the sparse tree (`specdec_lab.tree.sparse_tree`) shipped with the heads.

Measuring: tau and per-head acceptance on held-out prompts at temperature 0, and tokens/s against plain
decoding of the same target in the same run, for a few tree sizes (`measure_medusa`).

    specdec train medusa            # train (resumable), export to zoo/<name>/medusa/, measure, record
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from specdec_lab.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec_lab.train.lm import fixed_eval_batches, sample_batch
from specdec_lab.train.loop import train
from specdec_lab.train.recipe import RunConfig, ZooRecipe, section_with_run
from specdec_lab.train.target_outputs import TrainingMix
from specdec_lab.train.zoo import drop_stage_carry, phase_workdir, record_result, stage_carry, training_data
from specdec_lab.tree import expected_accepted, sparse_tree

SECTION = "medusa"


@dataclass
class MedusaRecipe:
    """The "medusa" section of the zoo recipe.

    num_heads: K; loss_decay: weight of head k's loss is loss_decay^(k-1); ranks: how many choices per head
    are scored for the tree; tree_budgets: tree sizes (nodes) measured; the fastest is shipped as default;
    measure_prompts / measure_tokens: held-out prompts and new tokens per prompt for the figures;
    run: optimisation settings.
    """

    num_heads: int = 4
    loss_decay: float = 0.8
    ranks: int = 10
    tree_budgets: list[int] = field(default_factory=lambda: [8, 16, 32])
    measure_prompts: int = 20
    measure_tokens: int = 64
    run: RunConfig = field(default_factory=lambda: RunConfig(
        steps=60, batch_size=8, seq_len=128, lr=3e-3, warmup_steps=10, eval_every=30, eval_batches=4,
        checkpoint_every=10))

    @classmethod
    def from_recipe(cls, recipe: ZooRecipe) -> MedusaRecipe:
        """The section from a loaded recipe (defaults where it has none)."""
        return section_with_run(cls, recipe.extra.get(SECTION, {}))


def ensure_section(recipe_path: Path) -> MedusaRecipe:
    """Read the "medusa" section of `recipe_path`, writing the defaults into the file if it has none.

    The file is re-read right before writing and only this section is added, so edits to the other
    sections made meanwhile are kept.
    """
    recipe = ZooRecipe.load(recipe_path)
    if SECTION not in recipe.extra:
        data = json.loads(recipe_path.read_text())
        data[SECTION] = asdict(MedusaRecipe())
        recipe_path.write_text(json.dumps(data, indent=2) + "\n")
        recipe = ZooRecipe.load(recipe_path)
    return MedusaRecipe.from_recipe(recipe)


def final_hidden(target: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """The target's final-normed hidden states (B, T, hidden): what its lm_head (and the heads) read."""
    return target.model(input_ids=ids).last_hidden_state


def head_losses(target: LlamaForCausalLM, heads: MedusaHeads, batch: torch.Tensor) -> list[torch.Tensor]:
    """Per-head cross-entropy on a batch of windows (B, T + 1): head k at position t predicts token t + 1 + k."""
    with torch.no_grad():
        hidden = final_hidden(target, batch[:, :-1])
    features = heads(hidden)  # (B, T, K, hidden)
    lm_head = target.get_output_embeddings()
    steps = batch.shape[1] - 1
    losses = []
    for k in range(heads.num_heads):
        shift = k + 2  # token t + 1 is the target's own prediction; head k (0-based) guesses t + 2 + k
        logits = lm_head(features[:, : steps + 1 - shift, k])
        losses.append(F.cross_entropy(logits.flatten(0, 1), batch[:, shift:].flatten()))
    return losses


@torch.no_grad()
def rank_accuracy(target: LlamaForCausalLM, heads: MedusaHeads, batches: list[torch.Tensor],
                  ranks: int) -> torch.Tensor:
    """(K, ranks): how often the correct token is exactly head k's r-th most likely choice (r = 0 is top-1)."""
    hits = torch.zeros(heads.num_heads, ranks)
    counts = torch.zeros(heads.num_heads)
    lm_head = target.get_output_embeddings()
    for batch in batches:
        features = heads(final_hidden(target, batch[:, :-1]))
        steps = batch.shape[1] - 1
        for k in range(heads.num_heads):
            shift = k + 2
            top = lm_head(features[:, : steps + 1 - shift, k]).topk(ranks, dim=-1).indices
            match = top == batch[:, shift:, None]
            hits[k] += match.flatten(0, 1).sum(0).float()
            counts[k] += match.shape[0] * match.shape[1]
    return hits / counts[:, None]


def train_heads(target: LlamaForCausalLM, data: TrainingMix, val_stream: torch.Tensor,
                config: MedusaRecipe, workdir: Path, max_minutes: float | None = None,
                carry: Path | None = None) -> tuple[MedusaHeads, dict]:
    """Train fresh heads on the frozen `target` (resuming from `workdir`, or from `carry` on a machine
    without the checkpoint); returns them and the loop's result."""
    target.eval().requires_grad_(False)
    run = config.run
    torch.manual_seed(run.seed)
    heads = MedusaHeads(target.config.hidden_size, config.num_heads)
    weights = [config.loss_decay**k for k in range(config.num_heads)]
    val = fixed_eval_batches(val_stream, run)

    def loss_on_batch(step: int) -> torch.Tensor:
        batch = data.batch(run.batch_size, run.seq_len, run.seed * 1_000_003 + 7_919 + step)
        losses = head_losses(target, heads, batch)
        return sum(w * loss for w, loss in zip(weights, losses, strict=True)) / sum(weights)

    def evaluate() -> dict:
        top1 = rank_accuracy(target, heads, val, 1)[:, 0]
        return {f"head{k + 1}_top1": float(a) for k, a in enumerate(top1)}

    result = train(heads, loss_on_batch, evaluate, run, workdir, "medusa", max_minutes, carry)
    return heads, result


def tree_batches(data: TrainingMix, run: RunConfig) -> list[torch.Tensor]:
    """Fixed windows of the target's own outputs (corpus windows when there are none) to build trees from."""
    stream = data.outputs if data.outputs is not None else data.corpus
    return [sample_batch(stream, run.batch_size, run.seq_len, 20_000 + i) for i in range(run.eval_batches)]


def heads_card(accuracy: torch.Tensor, on_outputs: torch.Tensor, tree: list[tuple[int, ...]], measured: dict) -> str:
    """The model-card section (markdown) for the shipped heads (accuracy: on corpus validation text;
    on_outputs: on the target's own outputs, which the trees are built from)."""
    top1, top5 = accuracy[:, 0], accuracy[:, :5].sum(1)
    lines = [
        "## Medusa heads (`medusa/`)",
        "",
        f"{len(top1)} Medusa-1 heads (residual SiLU block on the target's final hidden state, feeding the "
        "target's frozen lm_head); head k predicts the token k + 1 positions after the target's next token. "
        "Validation accuracy against the corpus tokens:",
        "",
        "| head | " + " | ".join(str(k + 1) for k in range(len(top1))) + " |",
        "|---|" + "---|" * len(top1),
        "| top-1 | " + " | ".join(f"{a:.3f}" for a in top1.tolist()) + " |",
        "| top-5 | " + " | ".join(f"{a:.3f}" for a in top5.tolist()) + " |",
        "| top-1 on target outputs | " + " | ".join(f"{a:.3f}" for a in on_outputs[:, 0].tolist()) + " |",
        "",
        "The sparse trees are built from the accuracies on the target's own outputs (the text they draft).",
        f"Shipped tree: {len(tree)} nodes (the Medusa sparse tree construction; the fastest of "
        f"the measured sizes). On {measured['prompts']} held-out prompts, greedy, {measured['max_new_tokens']} "
        f"new tokens, {measured['threads']} threads, one run:",
        "",
        "| tree | nodes | tau | accepted at depth k (share of steps) | head k kept when reached | tokens/s "
        "| vs plain | same as plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in measured["rows"]:
        lines.append(f"| {row['tree']} | {row['nodes']} | {row['tau']:.2f} | "
                     f"{', '.join(f'{a:.2f}' for a in row['per_depth_acceptance'])} | "
                     f"{', '.join(f'{a:.2f}' for a in row['per_head_conditional'])} | {row['tokens_per_second']:.0f} "
                     f"| {row['speedup']:.2f}x | {row['same_as_plain']} |")
    lines += ["", f"Plain decoding of the same target in the same run: {measured['plain_tokens_per_second']:.0f} "
              "tokens/s. Reproduce: `specdec train medusa` (it resumes, re-exports and re-measures)."]
    return "\n".join(lines)


def step_recorder(steps: list[tuple[int, int]]):
    """An `on_step` callback that appends (tree depth, accepted tokens) of every verification step to `steps`."""

    def record(step) -> None:
        steps.append((step.draft.info.get("depth", 0), step.verdict.accepted))

    return record


def ratios(numerators: list[int], denominators: list[int]) -> list[float]:
    """Element-wise a / b rounded to 3 places (0 where b is 0)."""
    return [round(a / b, 3) if b else 0.0 for a, b in zip(numerators, denominators, strict=True)]


@torch.inference_mode()
def measure_medusa(target, tokenizer, heads: MedusaHeads, trees: dict[str, list[tuple[int, ...]]],
                   prompts: int = 20, max_new_tokens: int = 64) -> dict:
    """tau, per-depth acceptance and tokens/s of each tree against plain decoding, greedy, in one run.

    target / tokenizer: the zoo target; heads: its Medusa heads; trees: name -> choice-tuples; prompts: how
    many held-out prompts (signature + docstring from the validation files); max_new_tokens: per prompt.
    Each prompt runs plain decoding and every tree back to back, so machine load hits them alike.
    """
    import specdec_lab as sd
    from specdec_lab.train.corpus import heldout_prompts

    ids_list = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in heldout_prompts(prompts)]
    drafters = {name: MedusaDrafter(heads, tree=tree) for name, tree in trees.items()}
    sd.generate(target, ids_list[0], drafter=next(iter(drafters.values())), max_new_tokens=8)  # warm-up
    heads_range = range(heads.num_heads)
    totals = {name: {"seconds": 0.0, "tokens": 0, "forwards": 0, "same": 0, "steps": []}
              for name in ["plain", *drafters]}
    for ids in ids_list:
        plain = sd.generate(target, ids, max_new_tokens=max_new_tokens)
        for name, drafter in [("plain", None), *drafters.items()]:
            row = totals[name]
            if drafter is None:
                out = plain
            else:
                out = sd.generate(target, ids, drafter=drafter, max_new_tokens=max_new_tokens,
                                  on_step=step_recorder(row["steps"]))
            row["seconds"] += out.stats.total_seconds
            row["tokens"] += out.stats.new_tokens
            row["forwards"] += out.stats.target_forwards
            row["same"] += out.tokens == plain.tokens
    plain_speed = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    rows = []
    for name, tree in trees.items():
        row = totals[name]
        speed = row["tokens"] / row["seconds"]
        # Head k (0-based) was drafted when the tree reached depth k + 1, and "reached" when its parent was kept.
        drafted = [sum(depth > k for depth, _ in row["steps"]) for k in heads_range]
        reached = [sum(depth > k and kept >= k for depth, kept in row["steps"]) for k in heads_range]
        kept = [sum(kept > k for _, kept in row["steps"]) for k in heads_range]
        rows.append({"tree": name, "nodes": len(tree), "tau": round(row["tokens"] / row["forwards"], 3),
                     "per_depth_acceptance": ratios(kept, drafted), "per_head_conditional": ratios(kept, reached),
                     "tokens_per_second": round(speed, 1), "speedup": round(speed / plain_speed, 3),
                     "same_as_plain": f"{row['same']}/{len(ids_list)}"})
    return {"prompts": len(ids_list), "max_new_tokens": max_new_tokens, "threads": torch.get_num_threads(),
            "plain_tokens_per_second": round(plain_speed, 1), "plain_tau": 1.0, "rows": rows}


def run_medusa_stage(recipe_path: str | Path, workdir: str | Path, max_minutes: float | None = None) -> dict:
    """Train the heads (resumable), export them with their sparse tree to `<zoo>/medusa/`, measure, record.

    recipe_path: the zoo's recipe JSON (its "medusa" section is added with defaults if missing); workdir:
    checkpoints, logs and token caches; max_minutes: pause (checkpointed) after this long.
    """
    from transformers import AutoTokenizer

    recipe_path = Path(recipe_path)
    config = ensure_section(recipe_path)
    recipe = ZooRecipe.load(recipe_path)
    zoo_dir = recipe_path.parent
    workdir = Path(workdir) / recipe.name
    started = time.time()
    if not (zoo_dir / "target" / "config.json").exists():
        raise FileNotFoundError(f"the Medusa stage needs the zoo target in {zoo_dir / 'target'}; train it first")
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32).eval()
    data, val_stream = training_data(recipe, zoo_dir, workdir, target)
    heads, result = train_heads(target, data, val_stream, config, phase_workdir(zoo_dir, workdir, SECTION),
                                 max_minutes, stage_carry(zoo_dir, SECTION))
    if not result["finished"]:
        print(f"medusa: paused at step {result['steps']}; run the same command again to resume")
        return result
    accuracy = rank_accuracy(target, heads, fixed_eval_batches(val_stream, config.run), config.ranks)
    # The tree is built from the accuracies on the text it will draft: the target's own outputs. (Corpus
    # accuracies are far lower and give wide, shallow trees; the held-out measurement below judges the choice.)
    on_outputs = rank_accuracy(target, heads, tree_batches(data, config.run), config.ranks)
    trees = {"chain": [(0,) * d for d in range(1, config.num_heads + 1)]}
    trees.update({f"sparse-{b}": sparse_tree(on_outputs.tolist(), b) for b in config.tree_budgets})
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
    measured = measure_medusa(target, tokenizer, heads, trees, config.measure_prompts, config.measure_tokens)
    fastest = max(measured["rows"], key=lambda row: row["tokens_per_second"])["tree"]
    top1, top5 = accuracy[:, 0], accuracy[:, :5].sum(1)
    heads.tree = trees[fastest]
    heads.card = {"head_top1": [round(a, 4) for a in top1.tolist()], "head_top5": [round(a, 4) for a in top5.tolist()],
                  "tree_name": fastest,
                  "tree_top1_on_target_outputs": [round(a, 4) for a in on_outputs[:, 0].tolist()]}
    heads.save(zoo_dir / "medusa")
    result.update(
        parameters=sum(p.numel() for p in heads.parameters()),
        tokens_seen=config.run.steps * config.run.batch_size * config.run.seq_len,
        head_top1=heads.card["head_top1"], head_top5=heads.card["head_top5"],
        rank_accuracy=[[round(a, 4) for a in head] for head in accuracy.tolist()],
        tree=[list(c) for c in heads.tree], tree_name=fastest,
        tree_expected_tau=round(expected_accepted(heads.tree, on_outputs.tolist()), 3),
        tree_rank_accuracy=[[round(a, 4) for a in head] for head in on_outputs.tolist()],
        measured=measured, card=heads_card(accuracy, on_outputs, heads.tree, measured),
        wall_seconds_this_call=round(time.time() - started, 1),
    )
    record_result(zoo_dir, SECTION, result)
    drop_stage_carry(zoo_dir, SECTION)
    return result
