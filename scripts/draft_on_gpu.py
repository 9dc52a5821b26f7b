"""Distil candidate drafts on a lent CUDA GPU, from a carried copy of the corpus, and adopt the best one here.

The zoo's draft is distilled from the frozen target (`specdec_lab/train/lm.py`). On two CPU cores a phase of a
thousand steps of 8 windows takes half an hour; a GPU trains many times more tokens in minutes. The GPU machine
has the repository but not this interpreter's standard library (the corpus), so:

    python scripts/draft_on_gpu.py pack .gpu/stdlib.tar.xz        # here: the corpus files, fingerprint checked
    python scripts/draft_on_gpu.py train .gpu/stdlib.tar.xz OUT   # there: every candidate, side by side
    python scripts/draft_on_gpu.py adopt OUT NAME                 # here: measure, export NAME into the zoo

`train` checks the carried corpus against the fingerprint the target was trained on, writes the target's greedy
completions of every training-split function prompt (on the GPU), then trains each candidate of CANDIDATES in
a process of its own within a wall-clock budget: the step counts follow from the step time measured at the
start, so the learning-rate schedules end on time. Each candidate is scored by its greedy acceptance on the
selection prompts (held-out prompts that the model card does not use); its fp32 weights and logs come back.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

ZOO = Path(__file__).resolve().parent.parent / "specdec_lab" / "zoo" / "stdlib-14m"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# `train --smoke`: a few prompts and tiny batches, to check the plumbing on a CPU before a GPU run.
SMOKE = {"prompts": 8, "selection": 2, "batch_size": 4}


@dataclass
class Candidate:
    """One way to distil the draft: its shape and the two phases' settings (their step counts set by the budget).

    teacher_temperature: the target's logits are divided by it (below 1: sharpened toward its top token);
    share: the fraction of each second-phase batch drawn from the target's own completions.
    """

    name: str
    intermediate_size: int
    teacher_temperature: float
    share: float


CANDIDATES = [
    Candidate("kl07", 704, 0.7, 0.5),  # today's recipe, trained on many more tokens
    Candidate("kl05-own75", 704, 0.5, 0.75),  # sharper teacher, more of the target's own text
    Candidate("mlp1408", 1408, 0.7, 0.5),  # a wider MLP: costlier per token, more capacity
]
CORPUS_SHARE = 0.35  # of each candidate's training time, for the corpus phase (the rest: corpus + own text)


def runs(seconds_per_step: tuple[float, float], budget: float, smoke: bool = False):
    """The two phases' RunConfigs, with as many steps as fit `budget` seconds at the measured step times."""
    from specdec_lab.train.recipe import RunConfig

    corpus_steps = max(20, int(CORPUS_SHARE * budget / seconds_per_step[0]))
    mix_steps = max(20, int((1 - CORPUS_SHARE) * budget / seconds_per_step[1]))
    common = dict(weight_decay=0.1, grad_clip=1.0, seed=0, eval_batches=4, checkpoint_every=10**9, bf16=True)
    batches = (SMOKE["batch_size"],) * 2 if smoke else (32, 64)
    return (RunConfig(steps=corpus_steps, batch_size=batches[0], seq_len=512, lr=3e-3, min_lr_ratio=0.1,
                      warmup_steps=min(100, corpus_steps // 10), eval_every=max(1, corpus_steps // 4), **common),
            RunConfig(steps=mix_steps, batch_size=batches[1], seq_len=256, lr=1e-3, min_lr_ratio=0.1,
                      warmup_steps=min(50, mix_steps // 10), eval_every=max(1, mix_steps // 4), **common))


def load_carried_corpus(tarball: Path, dest: Path):
    """The corpus from `tarball`, unpacked into `dest`; exits if its fingerprint is not the target's."""
    from specdec_lab.train.corpus import load_corpus
    from specdec_lab.train.recipe import ZooRecipe

    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    recipe = ZooRecipe.load(ZOO / "recipe.json")
    corpus = load_corpus(dest, val_percent=recipe.val_percent, test_folders=recipe.test_folders)
    expected = json.loads((ZOO / "training.json").read_text())["target"]["corpus"]["fingerprint"]
    if corpus.fingerprint() != expected:
        sys.exit(f"the carried corpus has fingerprint {corpus.fingerprint()}, the target was trained on {expected}")
    return corpus


def pack(tarball: Path) -> None:
    """Write the corpus files this interpreter reads into `tarball`, and check that they load back the same."""
    from specdec_lab.train.corpus import load_corpus

    corpus = load_corpus(test_folders=True)
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "w:xz") as tar:
        for rel in corpus.train_files + corpus.val_files + corpus.test_files:
            tar.add(corpus.root / rel, arcname=rel)
    with tempfile.TemporaryDirectory() as tmp:
        load_carried_corpus(tarball, Path(tmp))
    print(f"{tarball}: {tarball.stat().st_size / 1e6:.1f} MB, fingerprint matches the target's")


def prepare(tarball: Path, work: Path, smoke: bool = False) -> None:
    """Token streams, the target's greedy completions of the training prompts, the selection prompts: in `work`."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from specdec_lab.train.corpus import function_prompts
    from specdec_lab.train.lm import tokenize_stream
    from specdec_lab.train.recipe import TargetOutputs
    from specdec_lab.train.target_outputs import complete_prompts
    from specdec_lab.train.zoo import CARD_PROMPTS, SELECTION_PROMPTS

    corpus = load_carried_corpus(tarball, work / "corpus")
    tokenizer = AutoTokenizer.from_pretrained(str(ZOO / "tokenizer"))
    started = time.time()
    train, val = (tokenize_stream(corpus.texts(split), tokenizer) for split in ("train", "val"))
    print(f"tokenised {len(train)} training and {len(val)} validation tokens in {time.time() - started:.0f} s")
    target = LlamaForCausalLM.from_pretrained(str(ZOO / "target"), dtype=torch.float32).to(DEVICE).eval()
    prompts = function_prompts("train", SMOKE["prompts"] if smoke else 10**6, corpus)
    settings = TargetOutputs(prompts=len(prompts), new_tokens=128, max_prompt_tokens=160, batch_size=512)
    started = time.time()
    outputs = complete_prompts(target, tokenizer, prompts, settings)
    print(f"target outputs: {len(prompts)} prompts, {len(outputs)} tokens in {time.time() - started:.0f} s")
    heldout = function_prompts("val", CARD_PROMPTS + SELECTION_PROMPTS, corpus)
    heldout, selection = heldout[:CARD_PROMPTS], heldout[CARD_PROMPTS:]
    if smoke:
        heldout, selection = heldout[: SMOKE["selection"]], selection[: SMOKE["selection"]]
    torch.save({"train": train, "val": val, "outputs": outputs, "heldout": heldout, "selection": selection,
                "target_outputs": asdict(settings)}, work / "data.pt")


def step_seconds(draft, target, data, val, run, teacher_temperature: float, probe_steps=(5, 25)) -> float:
    """The wall time of one training step of `run`'s shape: two short throwaway runs on a copy, of
    `probe_steps` steps, whose difference leaves out what every run pays once (the first steps' warm-up, the
    closing evaluation)."""
    from specdec_lab.train.lm import distill_draft

    def timed(steps: int) -> float:
        probe = replace(run, steps=steps, eval_every=10**9, eval_batches=1)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            distill_draft(copy.deepcopy(draft), target, data, val, probe, Path(tmp),
                          teacher_temperature=teacher_temperature)
            return time.perf_counter() - started

    short, long = probe_steps
    timed(short)  # kernels and allocator warmed up
    return max(1e-4, (timed(long) - timed(short)) / (long - short))


def acceptance_within(target, draft, tokenizer, texts: list[str], seconds: float) -> dict:
    """Greedy acceptance at k = 4 (64 tokens) over `texts`, or over as many as `seconds` allowed (stated)."""
    import specdec_lab as sd
    from specdec_lab.train.zoo import PHASE_CHECK_K, PHASE_CHECK_TOKENS

    drafted = accepted = measured = 0
    stop = time.time() + seconds
    for text in texts:
        if time.time() > stop:
            break
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        stats = sd.generate(target, ids, drafter=sd.DraftModelDrafter(draft, k=PHASE_CHECK_K),
                            max_new_tokens=PHASE_CHECK_TOKENS).stats
        drafted, accepted, measured = drafted + stats.drafted, accepted + stats.accepted, measured + 1
    return {"rate": round(accepted / max(1, drafted), 3), "prompts": measured, "of": len(texts)}


# Seconds each candidate spends outside its training steps: imports and loading, the acceptance check after
# the corpus phase (on the card's first 100 prompts, as the draft stage does) and the selection score.
SETUP_SECONDS, PHASE_CHECK_SECONDS, SELECTION_SECONDS = 25, 45, 50


def train_candidate(candidate: Candidate, work: Path, out: Path, budget: float, smoke: bool = False) -> None:
    """Distil one candidate in about `budget` seconds of training steps, score it, and write its weights
    (fp32) and its record to `out`."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from specdec_lab.train.lm import build_llama, distill_draft
    from specdec_lab.train.loop import hardware, read_log
    from specdec_lab.train.recipe import ZooRecipe
    from specdec_lab.train.target_outputs import TrainingMix

    data = torch.load(work / "data.pt")
    train, val, outputs = (data[k].to(DEVICE) for k in ("train", "val", "outputs"))
    tokenizer = AutoTokenizer.from_pretrained(str(ZOO / "tokenizer"))
    target = LlamaForCausalLM.from_pretrained(str(ZOO / "target"), dtype=torch.float32).to(DEVICE).eval()
    shape = replace(ZooRecipe.load(ZOO / "recipe.json").draft, intermediate_size=candidate.intermediate_size)
    draft = build_llama(shape, len(tokenizer), tokenizer.eos_token_id, seed=0).to(DEVICE)
    corpus_only, mixed = TrainingMix(train), TrainingMix(train, outputs, candidate.share)
    sharpen = candidate.teacher_temperature
    started = time.time()
    probes = runs((1.0, 1.0), 1000.0, smoke)
    probe_steps = (1, 3) if smoke else (5, 25)
    timing = (step_seconds(draft, target, corpus_only, val, probes[0], sharpen, probe_steps),
              step_seconds(draft, target, mixed, val, probes[1], sharpen, probe_steps))
    left = budget - (time.time() - started)
    corpus_run, mix_run = runs(timing, left, smoke)
    print(f"{candidate.name}: {timing[0] * 1e3:.1f} / {timing[1] * 1e3:.1f} ms a step: "
          f"{corpus_run.steps} + {mix_run.steps} steps", flush=True)
    record = {"candidate": asdict(candidate), "shape": asdict(shape), "phases": {}, "hardware": hardware(),
              "target_outputs": data["target_outputs"], "step_seconds_probed": timing}
    for phase, run, data_mix, share in (("draft", corpus_run, corpus_only, CORPUS_SHARE),
                                        ("draft-tune", mix_run, mixed, 1 - CORPUS_SHARE)):
        # A probe that read the step time low must not run past the deadline: the phase stops (unfinished,
        # and the record says so) at 1.3x its share of the time.
        result = distill_draft(draft, target, data_mix, val, run, work / candidate.name / phase,
                               max_minutes=1.3 * share * left / 60, teacher_temperature=sharpen)
        record["phases"][phase] = {"run": asdict(run), "result": result,
                                   "log": read_log(work / candidate.name / phase / "log.jsonl")}
        # The latest phase's weights only (a file comes back at most 16 MB), saved before any check, so that a
        # check cut off by the deadline loses no weights.
        torch.save({phase: draft.state_dict()}, out / f"{candidate.name}.pt")
        if phase == "draft":
            record["acceptance_after_corpus"] = acceptance_within(target, draft, tokenizer,
                                                                  data["heldout"], PHASE_CHECK_SECONDS)
        (out / f"{candidate.name}.json").write_text(json.dumps(record) + "\n")
    record["selection_acceptance"] = acceptance_within(target, draft, tokenizer, data["selection"],
                                                       SELECTION_SECONDS)
    (out / f"{candidate.name}.json").write_text(json.dumps(record) + "\n")
    print(f"{candidate.name}: selection acceptance {record['selection_acceptance']}", flush=True)


def train_all(tarball: Path, out: Path, seconds: float, smoke: bool = False) -> None:
    """Prepare the data, then train every candidate side by side, all done within `seconds` of the start."""
    import os

    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="draft-on-gpu-"))
    prepare(tarball, work, smoke)
    budget = seconds - (time.time() - started) - SETUP_SECONDS - PHASE_CHECK_SECONDS - SELECTION_SECONDS
    env = {**os.environ, "TQDM_DISABLE": "1"}
    command = [sys.executable, __file__, "candidate"]
    procs = [subprocess.Popen(command + [c.name, str(work), str(out), str(budget)] + ["--smoke"] * smoke, env=env)
             for c in (CANDIDATES[:1] if smoke else CANDIDATES)]  # a smoke run on a CPU: one is enough
    deadline = started + seconds
    for proc in procs:
        try:
            proc.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
    print("finished:", sorted(p.name for p in out.glob("*.json")))


def adopt(out: Path, name: str) -> dict:
    """Export candidate `name` of a `train` run (its files in `out`) into the zoo: the fp16 weights, the recipe
    that reproduces it (`specdec train draft`, slowly on a CPU) and its training record, with the draft stage's
    own acceptance check re-measured here (the first 100 held-out prompts, fp32 weights)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from specdec_lab.train.corpus import load_corpus
    from specdec_lab.train.lm import build_llama
    from specdec_lab.train.recipe import ModelShape, RunConfig, TargetOutputs, ZooRecipe
    from specdec_lab.train.zoo import (
        PHASE_CHECK_K,
        PHASE_CHECK_TOKENS,
        export_fp16,
        heldout_acceptance,
        record_result,
    )

    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    record, weights = records[name], torch.load(out / f"{name}.pt", map_location="cpu")
    recipe = ZooRecipe.load(ZOO / "recipe.json")
    tokenizer = AutoTokenizer.from_pretrained(str(ZOO / "tokenizer"))
    draft = build_llama(ModelShape(**record["shape"]), len(tokenizer), tokenizer.eos_token_id, seed=0)
    draft.load_state_dict(weights["draft-tune"])
    target = LlamaForCausalLM.from_pretrained(str(ZOO / "target"), dtype=torch.float32)
    recipe.draft = ModelShape(**record["shape"])
    # As run there, except checkpoints: a run of the recipe on a CPU takes hours and must resume.
    recipe.draft_run, recipe.draft_tune_run = (replace(RunConfig(**record["phases"][p]["run"]), checkpoint_every=50)
                                               for p in ("draft", "draft-tune"))
    recipe.draft_teacher_temperature = record["candidate"]["teacher_temperature"]
    recipe.draft_target_outputs = TargetOutputs(**{**record["target_outputs"], "share": record["candidate"]["share"]})
    phases = {}
    corpus_check = record["acceptance_after_corpus"]
    if corpus_check["prompts"] == recipe.phase_check_prompts:  # measured on the GPU, fp32, as the stage does
        phases["corpus"] = corpus_check["rate"]
    phases["corpus, then target outputs"] = heldout_acceptance(target, draft, tokenizer, recipe.phase_check_prompts)
    first, second = (record["phases"][p]["result"] for p in ("draft", "draft-tune"))
    result = {**second, "steps": first["steps"] + second["steps"], "hardware": record["hardware"], "finished": True,
              **{k: round(first[k] + second[k], 1) for k in ("train_seconds", "compute_seconds")},
              "acceptance_after_phase": {"prompts": recipe.phase_check_prompts, "k": PHASE_CHECK_K,
                                         "max_new_tokens": PHASE_CHECK_TOKENS, "phases": phases},
              "candidates": {"chosen": name, "selection_prompts": record["selection_acceptance"]["of"],
                             "selection_acceptance": {n: r.get("selection_acceptance") for n, r in records.items()}},
              "parameters": sum(p.numel() for p in draft.parameters()),
              "corpus": load_corpus(val_percent=recipe.val_percent, test_folders=recipe.test_folders).describe()}
    stopped = [{"phase": p, "steps": r["result"]["steps"], "of": r["run"]["steps"]}
               for p, r in record["phases"].items() if not r["result"]["finished"]]
    if stopped:  # a phase cut off by its time cap: its weights, before the schedule's last steps
        result["stopped_early"] = stopped
    recipe.save(ZOO / "recipe.json")
    trained = {p: r["result"]["steps"] for p, r in record["phases"].items()}
    result["tokens_seen"] = (trained["draft"] * recipe.draft_run.batch_size * recipe.draft_run.seq_len
                             + trained["draft-tune"] * recipe.draft_tune_run.batch_size * recipe.draft_tune_run.seq_len)
    export_fp16(draft, ZOO / "draft")
    record_result(ZOO, "draft", result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pack").add_argument("tarball", type=Path)
    train = sub.add_parser("train")
    train.add_argument("tarball", type=Path)
    train.add_argument("out", type=Path)
    train.add_argument("--seconds", type=float, default=480, help="wall-clock budget of the whole run")
    train.add_argument("--smoke", action="store_true", help="a few prompts, tiny batches: the plumbing only")
    one = sub.add_parser("candidate")
    for name, kind in (("name", str), ("work", Path), ("out", Path), ("budget", float)):
        one.add_argument(name, type=kind)
    one.add_argument("--smoke", action="store_true")
    keep = sub.add_parser("adopt")
    keep.add_argument("out", type=Path)
    keep.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.tarball)
    elif args.command == "adopt":
        print(json.dumps(adopt(args.out, args.name), indent=1)[:2000])
    elif args.command == "train":
        train_all(args.tarball, args.out, args.seconds, args.smoke)
    else:
        candidate = next(c for c in CANDIDATES if c.name == args.name)
        train_candidate(candidate, args.work, args.out, args.budget, args.smoke)


if __name__ == "__main__":
    main()
