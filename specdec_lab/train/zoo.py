"""Build the shipped zoo from its recipe: tokenizer, target, draft (heads are added by their own stages).

`specdec train <stage> --recipe specdec_lab/zoo/<name>/recipe.json` runs one stage; each stage resumes from
its checkpoint in the work folder and finally writes a fp16 Hugging Face folder into the zoo.
"""

from __future__ import annotations

import copy
import fcntl
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from specdec_lab.models import folder_digest
from specdec_lab.train.corpus import function_prompts, heldout_prompts, load_corpus
from specdec_lab.train.lm import build_llama, distill_draft, pretrain_target, tokenize_stream
from specdec_lab.train.loop import hardware, load_best
from specdec_lab.train.quality import text_quality
from specdec_lab.train.recipe import ModelShape, TargetOutputs, ZooRecipe
from specdec_lab.train.target_outputs import TrainingMix, target_output_stream
from specdec_lab.train.tokenizer import train_tokenizer
from specdec_lab.train.unlikelihood import unlearn_loops

STAGES = ("tokenizer", "target", "draft")
# The model card measures the first this many held-out prompts; weights are selected on the ones after them.
CARD_PROMPTS = 100
SELECTION_PROMPTS = 100


def selection_quality(tokenizer) -> Callable[[LlamaForCausalLM], dict]:
    """The target's text quality on held-out prompts that the card does not use (so that picking the best
    evaluation's weights by it does not flatter the card's figures)."""
    prompts = heldout_prompts(CARD_PROMPTS + SELECTION_PROMPTS)[CARD_PROMPTS:]
    return lambda model: {f"selection_{k}": v for k, v in text_quality(model, tokenizer, prompts).items()}


def carry_folder(zoo_dir: Path, phase: str) -> Path:
    """Where an unfinished training phase's committed carry lives (`specdec train STAGE --write-carry` writes
    it; see loop.write_carry). Phases: "target", "draft", "draft-tune", "medusa", "eagle1", "eagle3"."""
    return zoo_dir / "carry" / phase


# The training phases of each stage, in order (the draft distils in two phases, each with its own checkpoint).
STAGE_PHASES = {"target": ("target", "target-tune"), "draft": ("draft", "draft-tune"), "medusa": ("medusa",),
                "eagle": ("eagle1",), "eagle3": ("eagle3",), "eagle-vllm": ("eagle1-vllm",), "mtp": ("mtp",)}


def phase_workdir(zoo_dir: Path, workdir: Path, phase: str) -> Path:
    """The checkpoint folder of one phase in a recipe's work folder: the target's own phases directly, every
    later phase's under the folder named by the target it trains against (see `against_target`)."""
    return workdir / phase if phase in STAGE_PHASES["target"] else against_target(workdir, zoo_dir) / phase


def stage_carry(zoo_dir: Path, phase: str) -> Path | None:
    """The phase's carry folder, when there is one written against the zoo's current target (a carry made
    against another target's weights is ignored: its draft or head learnt a different model)."""
    folder = carry_folder(zoo_dir, phase)
    if not (folder / "state.json").exists():
        return None
    if phase not in STAGE_PHASES["target"]:
        written_against = (folder / "against_target.txt").read_text().strip()
        if written_against != folder_digest(zoo_dir / "target"):
            return None
    return folder


def write_stage_carry(recipe_path: str | Path, workdir: str | Path, stage: str) -> dict:
    """Copy every phase of `stage` that has a checkpoint in `workdir` into the zoo's carry folders; returns
    the loop state of the last phase carried."""
    from specdec_lab.train.loop import write_carry

    recipe_path = Path(recipe_path)
    zoo_dir = recipe_path.parent
    runs = Path(workdir) / ZooRecipe.load(recipe_path).name
    state: dict = {}
    for phase in STAGE_PHASES[stage]:
        source = phase_workdir(zoo_dir, runs, phase)
        if not (source / "checkpoint.pt").exists():
            continue
        dest = carry_folder(zoo_dir, phase)
        state = write_carry(source, dest)
        if phase not in STAGE_PHASES["target"]:
            (dest / "against_target.txt").write_text(folder_digest(zoo_dir / "target") + "\n")
    if not state:
        raise FileNotFoundError(f"{stage}: no checkpoint under {runs} to carry")
    return state


def drop_stage_carry(zoo_dir: Path, stage: str) -> None:
    """Remove a finished stage's carries (its exported weights replace them)."""
    for phase in STAGE_PHASES[stage]:
        shutil.rmtree(carry_folder(zoo_dir, phase), ignore_errors=True)
    if (zoo_dir / "carry").is_dir() and not any((zoo_dir / "carry").iterdir()):
        (zoo_dir / "carry").rmdir()


def record_result(zoo_dir: Path, stage: str, result: dict) -> None:
    """Merge one stage's figures into `training.json`, which the model card is written from."""
    path = zoo_dir / "training.json"
    # Stages may run side by side (the draft in one process, the heads in another): the lock makes each
    # read-modify-write whole, so one stage's record never overwrites another's.
    with open(zoo_dir / ".training.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[stage] = result
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)


def export_fp16(model: torch.nn.Module, folder: Path) -> None:
    """Save a fp16 copy of `model` as a Hugging Face folder (the loaders upcast to fp32 on CPU)."""
    half = copy.deepcopy(model).to(torch.float16)
    half.save_pretrained(str(folder))


def token_streams(recipe: ZooRecipe, zoo_dir: Path, workdir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and validation token streams, cached in the work folder (tokenising takes a while)."""
    cache = workdir / "streams.pt"
    if cache.exists():
        data = torch.load(cache)
        return data["train"], data["val"]
    corpus = load_corpus(val_percent=recipe.val_percent, test_folders=recipe.test_folders)
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
    train_stream = tokenize_stream(corpus.texts("train"), tokenizer)
    val_stream = tokenize_stream(corpus.texts("val"), tokenizer)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save({"train": train_stream, "val": val_stream}, cache)
    return train_stream, val_stream


def against_target(workdir: Path, zoo_dir: Path) -> Path:
    """Where a stage trained against the zoo's target keeps its checkpoints and the target's completions:
    a folder named by the target's weights, so a retrained target never resumes a draft or a head trained
    against the old one, nor reuses the old target's text."""
    return workdir / f"on-target-{folder_digest(zoo_dir / 'target')}"


def training_data(recipe: ZooRecipe, zoo_dir: Path, workdir: Path,
                  target: LlamaForCausalLM) -> tuple[TrainingMix, torch.Tensor]:
    """What the draft's second phase and the heads train on: corpus plus the target's own completions
    (generated once, cached against this target), and the corpus validation stream they are evaluated on."""
    train_stream, val_stream = token_streams(recipe, zoo_dir, workdir)
    return with_target_outputs(recipe, zoo_dir, workdir, target, train_stream), val_stream


def with_target_outputs(recipe: ZooRecipe, zoo_dir: Path, workdir: Path, target: LlamaForCausalLM,
                        train_stream: torch.Tensor, settings: TargetOutputs | None = None) -> TrainingMix:
    """The corpus training stream mixed with the target's completions, as the recipe asks (or alone).

    settings: which completions and what share of each batch (default: the recipe's `target_outputs`).
    """
    settings = settings or recipe.target_outputs
    if settings.prompts == 0 or settings.share == 0:
        return TrainingMix(train_stream)
    # One cache per settings: the draft's text and the heads' may differ.
    name = "target_outputs.pt" if settings == recipe.target_outputs else f"target_outputs-{settings.prompts}.pt"
    outputs = target_output_stream(target, zoo_dir / "tokenizer", settings, recipe.val_percent,
                                   against_target(workdir, zoo_dir) / name)
    return TrainingMix(train_stream, outputs, settings.share)


def tokens_seen(recipe: ZooRecipe, stage: str, pretrained: dict | None = None) -> int:
    """Corpus training tokens of the target (both phases; the loop phase also reads text of its own) or of the
    draft (both phases). pretrained: where the run started from another zoo's model (`pretrained_record`): its
    first phase is that model's whole training."""
    if stage == "target":
        runs = [recipe.target_run, recipe.target_tune.run if recipe.target_tune else None]
    else:
        runs = [None if pretrained else recipe.draft_run, recipe.draft_tune_run]
    before = pretrained["record"]["tokens_seen"] if pretrained and stage == "draft" else 0
    return before + sum(r.steps * r.batch_size * r.seq_len for r in runs if r is not None)


# The draft stage's check after each phase: greedy, this many drafted tokens per step and new tokens per prompt.
PHASE_CHECK_K, PHASE_CHECK_TOKENS = 4, 64


def heldout_acceptance(target: LlamaForCausalLM, draft: LlamaForCausalLM, tokenizer, prompts: int,
                       k: int = PHASE_CHECK_K, max_new_tokens: int = PHASE_CHECK_TOKENS) -> float:
    """Greedy acceptance rate of `draft` proposing `k` tokens for `target` on the first `prompts` held-out
    prompts (validation files, never trained on), `max_new_tokens` each."""
    return acceptance_on(target, draft, tokenizer, heldout_prompts(prompts), k, max_new_tokens)


def acceptance_on(target: LlamaForCausalLM, draft: LlamaForCausalLM, tokenizer, texts: list[str],
                  k: int = PHASE_CHECK_K, max_new_tokens: int = PHASE_CHECK_TOKENS) -> float:
    """Greedy acceptance rate (accepted / drafted) of `draft` proposing `k` tokens for `target`, over the
    completions of `texts`, `max_new_tokens` each."""
    import specdec_lab as sd

    drafted = accepted = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        stats = sd.generate(target, ids, drafter=sd.DraftModelDrafter(draft, k=k), max_new_tokens=max_new_tokens).stats
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    return round(accepted / drafted, 3)


def train_draft(recipe: ZooRecipe, draft: LlamaForCausalLM, zoo_dir: Path, workdir: Path,
                streams: tuple[torch.Tensor, torch.Tensor], max_minutes: float | None,
                pretrained: Path | None = None) -> dict:
    """Distil the draft in two phases: on the corpus, then (if the recipe has `draft_tune_run`) on corpus
    mixed with the target's own completions. Each phase resumes from its own checkpoint.

    streams: the corpus train and validation tokens; pretrained: an exported draft (another zoo's `draft/`,
    distilled from that zoo's target) to start the second phase from instead of running the first; its
    record is kept under "pretrained_from".
    """
    target = LlamaForCausalLM.from_pretrained(str(zoo_dir / "target"), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
    train_stream, val_stream = streams
    sharpen = recipe.draft_teacher_temperature
    checks = recipe.phase_check_prompts
    if pretrained is None:
        result = distill_draft(draft, target, TrainingMix(train_stream), val_stream, recipe.draft_run,
                               phase_workdir(zoo_dir, workdir, "draft"), max_minutes, sharpen,
                               stage_carry(zoo_dir, "draft"))
        if not result["finished"]:
            return result
        first = "corpus"
    else:
        if recipe.draft_tune_run is None:
            raise ValueError("a pretrained draft starts the recipe's second phase, and this recipe has no "
                             "draft_tune_run: nothing would train it against this target")
        draft.load_state_dict(load_pretrained(Path(pretrained), recipe.draft).state_dict())
        record = pretrained_record(Path(pretrained), "draft")
        result = {"steps": 0, "train_seconds": 0.0, "compute_seconds": 0.0, "pretrained_from": record}
        first = f"the draft of {record['zoo']}, as it was"
    acceptance = {first: heldout_acceptance(target, draft, tokenizer, checks)} if checks else {}
    if recipe.draft_tune_run is not None:
        mix = with_target_outputs(recipe, zoo_dir, workdir, target, train_stream, recipe.draft_target_outputs)
        phase_two = distill_draft(draft, target, mix, val_stream, recipe.draft_tune_run,
                                  phase_workdir(zoo_dir, workdir, "draft-tune"), max_minutes, sharpen,
                                  stage_carry(zoo_dir, "draft-tune"))
        if not phase_two["finished"]:
            return phase_two
        phase_two["steps"] += result["steps"]
        for key in ("train_seconds", "compute_seconds"):
            phase_two[key] = round(phase_two[key] + result[key], 1)
        if pretrained is not None:
            phase_two["pretrained_from"] = result["pretrained_from"]
        result = phase_two
        if checks:
            second = "corpus, then target outputs" if pretrained is None else "the outputs of this target"
            acceptance[second] = heldout_acceptance(target, draft, tokenizer, checks)
    if acceptance:
        result["acceptance_after_phase"] = {"prompts": checks, "k": PHASE_CHECK_K,
                                            "max_new_tokens": PHASE_CHECK_TOKENS, "phases": acceptance}
    return result


def pretrained_record(folder: Path, stage: str = "target") -> dict:
    """Where an exported model that a run starts from came from: its zoo's name, its weights' digest, and its
    training record (its stage's entry of the training.json beside it)."""
    record = dict(json.loads((folder.parent / "training.json").read_text())[stage])
    zoo_name = json.loads((folder.parent / "recipe.json").read_text())["name"]
    return {"zoo": zoo_name, "digest": folder_digest(folder), "record": record}


def load_pretrained(folder: Path, shape: ModelShape) -> LlamaForCausalLM:
    """An exported model to go on training (fp32), refused with the reason when it is not the recipe's shape."""
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    found = (model.config.hidden_size, model.config.num_hidden_layers)
    if found != (shape.hidden_size, shape.num_layers):
        raise ValueError(f"{folder}: a model of hidden size {found[0]} with {found[1]} layers, but the recipe "
                         f"asks for hidden size {shape.hidden_size} and {shape.num_layers} layers")
    return model


def train_target(recipe: ZooRecipe, zoo_dir: Path, workdir: Path, tokenizer,
                 streams: tuple[torch.Tensor, torch.Tensor], max_minutes: float | None,
                 pretrained: Path | None = None) -> tuple[LlamaForCausalLM, dict]:
    """Pre-train the target, then (if the recipe has `target_tune`) fine-tune it against its own loops; returns
    the model and its figures. Each phase resumes from its own checkpoint; the weights each selects by its
    `select_by` go on to the next.

    streams: the corpus train and validation tokens; pretrained: an exported target (a zoo's `target/` folder,
    trained by this recipe's `target_run`) to take as the pre-training phase's result instead of running it;
    its record (training.json beside it) is kept as the pre-training's figures.
    """
    train_stream, val_stream = streams
    tune = recipe.target_tune
    quality = selection_quality(tokenizer) if recipe.target_run.select_by or tune else None
    if pretrained is None:
        model = build_llama(recipe.target, len(tokenizer), tokenizer.eos_token_id, recipe.target_run.seed)
        result = pretrain_target(model, train_stream, val_stream, recipe.target_run,
                                 phase_workdir(zoo_dir, workdir, "target"), max_minutes, quality,
                                 stage_carry(zoo_dir, "target"))
        if not result["finished"]:
            return model, result
        load_best(model, result, phase_workdir(zoo_dir, workdir, "target"))
    else:
        origin = pretrained_record(Path(pretrained))
        if "loop_unlikelihood" in origin["record"]:
            raise ValueError(f"{pretrained} was fine-tuned against its loops already: give a target that was only "
                             "pre-trained")
        model, result = load_pretrained(Path(pretrained), recipe.target), origin.pop("record")
        result |= {"pretrained_from": origin, "finished": True}
    if tune is None:
        return model, result
    prompts = function_prompts("train", tune.prompt_pool, load_corpus(val_percent=recipe.val_percent))
    tuned = unlearn_loops(model, tokenizer, train_stream, val_stream, prompts, tune,
                          phase_workdir(zoo_dir, workdir, "target-tune"), max_minutes, quality,
                          stage_carry(zoo_dir, "target-tune"))
    if not tuned["finished"]:
        return model, tuned
    load_best(model, tuned, phase_workdir(zoo_dir, workdir, "target-tune"))
    return model, result | {"loop_unlikelihood": tuned}


def run_stage(stage: str, recipe_path: str | Path, workdir: str | Path, max_minutes: float | None = None,
              pretrained: str | Path | None = None) -> dict:
    """Run one zoo stage ("tokenizer", "target", "draft" or "mtp") and write its output into the zoo folder.

    recipe_path: the recipe JSON (its folder is the zoo folder); workdir: scratch space for checkpoints,
    logs and token caches; max_minutes: pause (checkpointed) after this long, to resume with the same call;
    pretrained: for the target and draft stages, an exported model to start from (see `train_target`,
    `train_draft`).
    """
    if stage == "mtp":  # a head stage: its module imports this one, hence the late import
        from specdec_lab.train.mtp import run_mtp_stage

        return run_mtp_stage(recipe_path, workdir, max_minutes)
    recipe_path = Path(recipe_path)
    recipe = ZooRecipe.load(recipe_path)
    zoo_dir = recipe_path.parent
    workdir = Path(workdir) / recipe.name
    started = time.time()
    if stage == "tokenizer":
        corpus = load_corpus(val_percent=recipe.val_percent)
        train_tokenizer(corpus.texts("train"), recipe.vocab_size, zoo_dir / "tokenizer")
        result = {"vocab_size": recipe.vocab_size, "corpus": corpus.describe()}
    elif stage in ("target", "draft"):
        tokenizer = AutoTokenizer.from_pretrained(str(zoo_dir / "tokenizer"))
        train_stream, val_stream = token_streams(recipe, zoo_dir, workdir)
        if stage == "target":
            model, result = train_target(recipe, zoo_dir, workdir, tokenizer, (train_stream, val_stream),
                                         max_minutes, pretrained)
        else:
            model = build_llama(recipe.draft, len(tokenizer), tokenizer.eos_token_id, recipe.draft_run.seed)
            result = train_draft(recipe, model, zoo_dir, workdir, (train_stream, val_stream), max_minutes,
                                 pretrained)
        if not result["finished"]:
            print(f"{stage}: paused at step {result['steps']}; run the same command again to resume")
            return result
        export_fp16(model, zoo_dir / stage)
        drop_stage_carry(zoo_dir, stage)
        corpus = load_corpus(val_percent=recipe.val_percent, test_folders=recipe.test_folders)
        result.update(parameters=sum(p.numel() for p in model.parameters()),
                      tokens_seen=tokens_seen(recipe, stage, result.get("pretrained_from")), corpus=corpus.describe())
    else:
        raise ValueError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")
    result.setdefault("hardware", hardware())  # the loop records what trained; the tokenizer stage has no loop
    result.update(wall_seconds_this_call=round(time.time() - started, 1))
    record_result(zoo_dir, stage, result)
    return result
