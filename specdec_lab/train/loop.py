"""A small, resumable training loop shared by every zoo stage (target, draft, heads).

It owns what every stage needs and nothing else: the learning-rate schedule, AdamW, gradient clipping,
checkpoints that resume exactly, a tqdm bar, and a JSON-lines log of the loss curves.
"""

from __future__ import annotations

import itertools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec_lab.train.recipe import RunConfig


def lr_at(step: int, run: RunConfig) -> float:
    """Linear warm-up, then cosine decay to `min_lr_ratio * lr` at the last step."""
    if step < run.warmup_steps:
        return run.lr * (step + 1) / run.warmup_steps
    progress = (step - run.warmup_steps) / max(1, run.steps - run.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return run.lr * (run.min_lr_ratio + (1 - run.min_lr_ratio) * cosine)


def hardware() -> str:
    """A one-line description of what runs this process's training steps (recorded in the model card)."""
    if torch.cuda.is_available():
        return f"CUDA: {torch.cuda.get_device_name(0)}"
    threads = torch.get_num_threads()
    return f"CPU: {platform.processor() or platform.machine()}, {threads} thread{'s' if threads != 1 else ''}"


def read_log(log_path: Path) -> list[dict]:
    """The records of a run's JSON-lines log, one per step (and more where a resume replayed steps)."""
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


def off_schedule(log_path: Path, run: RunConfig) -> dict | None:
    """Steps whose logged learning rate is not the one `run`'s schedule gives them; None when all match.

    A schedule changed mid-run (the step count cut or extended, then the run resumed) leaves weights trained
    at learning rates a fresh run of the recipe would not use, and the model card must say so. Of a step
    logged twice (replayed after a resume), the last record counts: its update is the one that stayed.
    """
    logged = {r["step"]: r["lr"] for r in read_log(log_path)}
    # The record of step s holds the rate its update used, lr_at(s - 1) (steps count from 0 inside the loop).
    ratios = {step: lr / lr_at(step - 1, run) for step, lr in logged.items()}
    off = sorted(step for step, ratio in ratios.items() if not math.isclose(ratio, 1.0, rel_tol=1e-6))
    if not off:
        return None
    return {"steps": len(off), "first_step": off[0], "last_step": off[-1],
            "lr_ratio_min": round(min(ratios[s] for s in off), 3),
            "lr_ratio_max": round(max(ratios[s] for s in off), 3)}


def bf16_here(run: RunConfig, device_type: str) -> bool:
    """Whether `run` trains under bf16 autocast on this machine: where its recipe asks for it and the device has
    bf16 kernels (a CUDA GPU that supports bf16; a CPU whose oneDNN has them, with AVX-512 BF16 or AMX). On other
    CPUs torch emulates bf16 matrix products, far slower than fp32 (an AVX2-only AMD EPYC took about 5.5 s per
    step of the zoo's EAGLE-3 stage under autocast, 1.7 s in fp32), so the run computes in fp32 there; weights
    and optimizer state are fp32 either way, so a checkpoint resumes on either kind of machine."""
    if not run.bf16:
        return False
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device_type == "cpu" and cpu_has_bf16()


def cpu_has_bf16() -> bool:
    """Whether this CPU's oneDNN computes bf16 natively (torch asks the CPU for AVX-512 BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def training_forward(module: torch.nn.Module, run: RunConfig) -> Callable:
    """`module`'s forward as a stage's loss should call it: compiled and under bf16 autocast where `run` asks
    (and `bf16_here` finds the device able).

    The module itself stays eager and fp32 (evaluation, generation and export use it as it is); only the
    training loss goes through the returned callable. Logits come back in bf16 under autocast: take the loss
    of `.float()` logits.
    """
    forward = torch.compile(module) if run.compile else module
    device_type = next(module.parameters()).device.type
    bf16 = bf16_here(run, device_type)

    def call(*args, **kwargs):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            return forward(*args, **kwargs)

    return call


def save_whole(obj, path: Path) -> None:
    """torch.save through a temporary file and a rename: the file is either the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def keep_if_best(module: torch.nn.Module, figures: dict, state: dict, run: RunConfig, best_path: Path) -> None:
    """Save `module`'s weights to `best_path` when this evaluation's `run.select_by` figure beats the best one
    so far (ties go to the later step: more training, same score); `state["best"]` records which step it was."""
    score = figures.get(run.select_by) if run.select_by else None
    if score is None or score < state.get("best", {}).get(run.select_by, -math.inf):
        return
    save_whole(module.state_dict(), best_path)
    state["best"] = {"step": state["step"], **figures}


def load_best(module: torch.nn.Module, result: dict, workdir: str | Path) -> None:
    """Load the weights `keep_if_best` kept into `module`, when the run selected any (see `RunConfig.select_by`)."""
    if "best" in result:
        module.load_state_dict(torch.load(Path(workdir) / "best.pt"))


def write_carry(workdir: str | Path, dest: str | Path) -> dict:
    """Copy an unfinished run into `dest`, small enough to commit: fp16 weights, the loop's state and its log.

    A run longer than a session must not live only on a machine that may not come back. The optimizer's
    moments (twice the weights in fp32) stay behind: `train` resumes from a carry with fresh moments and a
    short re-warm-up of the learning rate, which the log records (and `off_schedule` then reports). Returns
    the state written. The best-so-far weights (`select_by`) are not carried: selection starts again.
    """
    from safetensors.torch import save_file

    workdir, dest = Path(workdir), Path(dest)
    checkpoint = torch.load(workdir / "checkpoint.pt", weights_only=False)
    dest.mkdir(parents=True, exist_ok=True)
    weights = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in checkpoint["module"].items()}
    save_file(weights, str(dest / "weights.safetensors"))
    state = {k: v for k, v in checkpoint["state"].items() if k != "best"}
    (dest / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    (dest / "log.jsonl").write_bytes((workdir / "log.jsonl").read_bytes())
    return state


def read_carry(module: torch.nn.Module, carry: Path, workdir: Path) -> dict:
    """Load a carry written by `write_carry` into `module` and `workdir`; the loop state to resume from."""
    from safetensors.torch import load_file

    dtypes = {k: v.dtype for k, v in module.state_dict().items()}
    weights = load_file(str(carry / "weights.safetensors"))
    module.load_state_dict({k: v.to(dtypes[k]) for k, v in weights.items()})
    (workdir / "log.jsonl").write_bytes((carry / "log.jsonl").read_bytes())
    state = json.loads((carry / "state.json").read_text())
    state["restarted_at"] = state["step"]
    return state


def restart_ramp(step: int, state: dict, run: RunConfig) -> float:
    """After a resume from a carry (fresh optimizer moments), the learning rate ramps up again over
    `run.warmup_steps` steps; 1.0 otherwise."""
    if "restarted_at" not in state:
        return 1.0
    return min(1.0, (step - state["restarted_at"] + 1) / max(1, run.warmup_steps))


def median_step_seconds(log_path: Path) -> float | None:
    """The median wall time of one training step, read from a run's JSON-lines log.

    The log's cumulative `seconds` also counts any time the process sat paused (a SIGSTOP, a suspended
    laptop), so the total overstates the work; steps x median step time does not. Only pairs of
    consecutive steps count (a resume after a lost checkpoint repeats step numbers).
    """
    records = read_log(log_path)
    gaps = [b["seconds"] - a["seconds"] for a, b in itertools.pairwise(records) if b["step"] == a["step"] + 1]
    return statistics.median(gaps) if gaps else None


def train(
    module: torch.nn.Module,
    loss_on_batch: Callable[[int], torch.Tensor],
    evaluate: Callable[[], dict],
    run: RunConfig,
    workdir: str | Path,
    desc: str,
    max_minutes: float | None = None,
    carry: str | Path | None = None,
) -> dict:
    """Optimise the trainable parameters of `module` for `run.steps` steps, resuming from `workdir`.

    loss_on_batch: computes the loss of training step `step` (it draws its own batch from the step number,
    so a resumed run sees the same data); evaluate: returns validation figures (a dict, logged);
    workdir: where `checkpoint.pt` and `log.jsonl` live; max_minutes: stop early (checkpointed) after this
    much wall time, to be resumed by the same call; carry: a folder written by `write_carry`, resumed from
    when `workdir` has no checkpoint (a new machine). Returns the last evaluation plus timing: `train_seconds`
    (wall time, pauses included), `compute_seconds` (steps x median step time, pauses excluded) and the
    `hardware` the last step ran on; with `run.select_by`, also `best` (the step and figures of the
    evaluation whose weights `load_best` restores).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    params = [p for p in module.parameters() if p.requires_grad]
    # No weight decay on norms and biases (1-D tensors), as usual for transformers.
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": run.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=run.lr, betas=(0.9, 0.95))
    state = {"step": 0, "seconds": 0.0, "last_eval": {}}
    ckpt_path = workdir / "checkpoint.pt"
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        module.load_state_dict(ckpt["module"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
    elif carry is not None and (Path(carry) / "state.json").exists():
        state = read_carry(module, Path(carry), workdir)

    def save_checkpoint() -> None:
        # whole: a stop mid-write never corrupts the checkpoint
        save_whole({"module": module.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, ckpt_path)

    this_call = hardware()
    started = time.perf_counter()
    seconds_before = state["seconds"]
    log = (workdir / "log.jsonl").open("a")
    bar = tqdm(total=run.steps, initial=state["step"], desc=desc, dynamic_ncols=True)
    module.train()
    while state["step"] < run.steps:
        step = state["step"]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, run) * restart_ramp(step, state, run)
        loss = loss_on_batch(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, run.grad_clip)
        optimizer.step()
        state["step"] = step + 1
        state["hardware"] = this_call  # what trained, not what a later call that only re-measures runs on
        state["seconds"] = seconds_before + time.perf_counter() - started
        record = {"step": step + 1, "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"],
                  "seconds": round(state["seconds"], 3)}  # ms: a GPU step takes a few
        if state["step"] % run.eval_every == 0 or state["step"] == run.steps:
            module.eval()
            with torch.no_grad():
                state["last_eval"] = evaluate()
            keep_if_best(module, state["last_eval"], state, run, workdir / "best.pt")
            module.train()
            record.update(state["last_eval"])
        log.write(json.dumps(record) + "\n")
        log.flush()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", **{k: f"{v:.3f}" for k, v in state["last_eval"].items()})
        out_of_time = max_minutes is not None and time.perf_counter() - started > 60 * max_minutes
        if state["step"] % run.checkpoint_every == 0 or state["step"] == run.steps or out_of_time:
            save_checkpoint()
        if out_of_time:
            break
    bar.close()
    log.close()
    module.eval()
    median = median_step_seconds(workdir / "log.jsonl")
    result = {**state["last_eval"], "steps": state["step"], "hardware": state.get("hardware", this_call),
              "train_seconds": round(state["seconds"], 1),
              # A one-step run has no step-to-step gap: its wall time is all there is.
              "compute_seconds": round(median * state["step"] if median is not None else state["seconds"], 1),
              "finished": state["step"] >= run.steps}
    if "best" in state:
        result["best"] = state["best"]
    changed = off_schedule(workdir / "log.jsonl", run)
    if changed:
        result["off_schedule"] = changed
    return result


def learning_curve(log_path: Path, run: RunConfig, depths: int) -> list[dict]:
    """A head's agreement with the target at depths 1..`depths` (acc1, acc2, ... in its log) at each evaluation
    of its run, against the training tokens seen by then: the small scaling curve the card and lesson 5 draw."""
    tokens_per_step = run.batch_size * run.seq_len
    evaluations = {r["step"]: r for r in read_log(log_path) if "acc1" in r}  # a replayed step: its last record
    return [{"tokens": step * tokens_per_step,
             **{f"acc{d}": r[f"acc{d}"] for d in range(1, depths + 1) if f"acc{d}" in r}}
            for step, r in sorted(evaluations.items())]
