"""Training multi-token prediction modules (DeepSeek-V3's MTP) on the frozen zoo target.

Data: the windows x_0 .. x_L the EAGLE heads train on (`training_data`: corpus mixed with the target's own
completions). The frozen target gives its last hidden state h^0_i at every position and its next-token logits.

Pairing (see `specdec_lab.drafters.mtp`): module d at position i reads h^(d-1)_i and the embedding of x_(i+d)
and is trained with cross-entropy on x_(i+d+1), the token d + 1 places after position i (depth_inputs /
depth_labels). All modules run teacher-forced on the window in one causal pass each, h^d feeding module d + 1
(the gradient flows down the chain, as in the paper); the depth losses are weighted loss_decay^(d-1).

Figures, per depth d on fixed validation windows: acc{d}, how often module d's top token equals the target's
own top token for the same position (the greedy acceptance of depth d when every earlier token was right),
top1_{d}, how often it equals the corpus token, and ce{d}, the cross-entropy. The learning curve records acc{d}
at each evaluation against the training tokens seen.

    specdec train mtp           # train (resumable), export to zoo/<name>/mtp/, record in training.json
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from specdec_lab.drafters.mtp import MTPConfig, MTPHeads, depth_labels
from specdec_lab.train.eagle import target_view
from specdec_lab.train.lm import fixed_eval_batches
from specdec_lab.train.loop import bf16_here, learning_curve, train
from specdec_lab.train.recipe import MTPRecipe, ZooRecipe
from specdec_lab.train.target_outputs import TrainingMix
from specdec_lab.train.zoo import drop_stage_carry, phase_workdir, record_result, stage_carry, training_data

SECTION = "mtp"  # the recipe section, the phase, the zoo folder and the training.json entry


def mtp_losses(heads: MTPHeads, target: LlamaForCausalLM, batch: torch.Tensor,
               bf16_teacher: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per depth d = 1..K on `batch` (B, L + 1) of windows: "ce", cross-entropy against x_(i+d+1); "acc",
    agreement of the module's argmax with the target's argmax for that token (the target's logits at position
    i + d); "top1", agreement with x_(i+d+1). The target's forward runs under bf16 autocast when `bf16_teacher`."""
    hidden, logits = target_view(target, batch, bf16_teacher)
    results = []
    for depth, out in enumerate(heads.teacher_forced(hidden[-1], batch), start=1):
        labels = depth_labels(batch, depth)
        head_logits = heads.logits(out[:, : labels.shape[1]]).float()
        want = logits[:, depth : depth + labels.shape[1]].argmax(-1)
        top = head_logits.argmax(-1)
        results.append({"ce": F.cross_entropy(head_logits.flatten(0, 1), labels.flatten()),
                        "acc": (top == want).float().mean(), "top1": (top == labels).float().mean()})
    return results


def train_mtp(heads: MTPHeads, target: LlamaForCausalLM, data: TrainingMix, val_stream: torch.Tensor,
              recipe: MTPRecipe, workdir: Path, max_minutes: float | None = None, carry: Path | None = None) -> dict:
    """Train `heads` on the frozen `target` through the shared loop (resumable from `workdir`, or from `carry`
    on a machine without the checkpoint); returns the per-depth validation figures plus timing."""
    target.eval().requires_grad_(False)
    run = recipe.run
    val = fixed_eval_batches(val_stream, run)
    weights = [recipe.loss_decay**d for d in range(heads.num_modules)]
    bf16 = bf16_here(run, next(target.parameters()).device.type)

    def loss_on_batch(step: int) -> torch.Tensor:
        batch = data.batch(run.batch_size, run.seq_len, run.seed * 1_000_003 + step)
        per_depth = mtp_losses(heads, target, batch, bf16)
        return sum(w * r["ce"] for w, r in zip(weights, per_depth, strict=True)) / sum(weights)

    def evaluate() -> dict:
        sums: dict[str, float] = {}
        for batch in val:
            for d, r in enumerate(mtp_losses(heads, target, batch), start=1):
                for key, name in (("acc", f"acc{d}"), ("top1", f"top1_{d}"), ("ce", f"ce{d}")):
                    sums[name] = sums.get(name, 0.0) + r[key].item() / len(val)
        return {k: round(v, 4) for k, v in sorted(sums.items())}

    result = train(heads, loss_on_batch, evaluate, run, workdir, SECTION, max_minutes, carry)
    if not result["finished"]:  # paused: report where the modules stand now, not at their last evaluation
        with torch.no_grad():
            result.update(evaluate())
    return result


def mtp_section(recipe_path: Path) -> MTPRecipe:
    """The recipe's "mtp" section, written with the defaults when missing (re-read just before writing:
    other stages edit the same file)."""
    section = ZooRecipe.load(recipe_path).extra.get(SECTION)
    if section is None:
        section = asdict(MTPRecipe())
        fresh = ZooRecipe.load(recipe_path)
        fresh.extra[SECTION] = section
        fresh.save(recipe_path)
    return MTPRecipe.from_dict(section)


def run_mtp_stage(recipe_path: str | Path, workdir: str | Path, max_minutes: float | None = None,
                  export_partial: bool = False) -> dict:
    """Train the MTP modules on the zoo target and write them into `<zoo>/mtp/`, their figures into training.json.

    recipe_path: the zoo's recipe.json (its folder holds target/ and tokenizer/); workdir: checkpoints and
    logs (resumed by the same call); max_minutes: pause, checkpointed, after this long; export_partial: when
    paused, still write the modules as they stand (their record says how many steps they had).
    """
    recipe_path = Path(recipe_path)
    zoo_dir = recipe_path.parent
    if not (zoo_dir / "target" / "config.json").exists():
        raise FileNotFoundError(f"the MTP stage needs the zoo target in {zoo_dir / 'target'}; train it first")
    started = time.time()
    zoo = ZooRecipe.load(recipe_path)
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32).eval()
    recipe = mtp_section(recipe_path)
    workdir = Path(workdir) / zoo.name
    data, val_stream = training_data(zoo, zoo_dir, workdir, target)
    torch.manual_seed(recipe.run.seed)
    heads = MTPHeads(MTPConfig.from_target(target, recipe.num_modules)).attach(target)
    if recipe.init_from_layer is not None:
        heads.init_from_target_layer(target, recipe.init_from_layer)
    phase_dir = phase_workdir(zoo_dir, workdir, SECTION)
    result = train_mtp(heads, target, data, val_stream, recipe, phase_dir, max_minutes, stage_carry(zoo_dir, SECTION))
    if not result["finished"]:
        print(f"mtp: paused at step {result['steps']}; run the same command again to resume")
        if not export_partial:
            return result
    depths = range(1, recipe.num_modules + 1)
    heads.config.card = {"acc": [result.get(f"acc{d}") for d in depths], "steps": result["steps"]}
    heads.save(zoo_dir / SECTION)
    run = recipe.run
    result.update(parameters=sum(p.numel() for p in heads.parameters()), num_modules=recipe.num_modules,
                  planned_steps=run.steps, tokens_seen=result["steps"] * run.batch_size * run.seq_len,
                  learning_curve=learning_curve(phase_dir / "log.jsonl", run, recipe.num_modules),
                  wall_seconds_this_call=round(time.time() - started, 1))
    record_result(zoo_dir, SECTION, result)
    if result["finished"]:
        drop_stage_carry(zoo_dir, SECTION)
    return result
