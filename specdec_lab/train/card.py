"""Measure the shipped zoo and write its model card from the measurements.

Every figure in `MODEL_CARD.md` comes from `evaluate_zoo` (stored in `training.json` under "evaluation"),
so the card can be regenerated at any time: `specdec train card`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from specdec_lab.train.corpus import heldout_prompts, load_corpus
from specdec_lab.train.lm import tokenize_stream
from specdec_lab.train.quality import (
    LOOP_MIN_TOKENS,
    REPEAT_MAX_PERIOD,
    first_statement_parses,
    is_degenerate,
    repeats_itself,
)
from specdec_lab.train.zoo import SELECTION_PROMPTS, record_result

# The fixed validation windows on which the card's loss is measured (and a test re-measures it).
CHECK_WINDOWS = 8
CHECK_LENGTH = 512
# The card also records the acceptance on its first this many prompts, which the test suite re-measures (a
# regression check that is fast enough to run on every commit).
REGRESSION_PROMPTS = 20


def validation_windows(tokenizer, count: int = CHECK_WINDOWS, length: int = CHECK_LENGTH) -> torch.Tensor:
    """`count` evenly spaced windows of `length + 1` tokens from the validation files (deterministic)."""
    corpus = load_corpus()
    stream = tokenize_stream(corpus.texts("val"), tokenizer).long()
    step = (len(stream) - length - 1) // count
    return torch.stack([stream[i * step : i * step + length + 1] for i in range(count)])


@torch.no_grad()
def validation_loss(model, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats/token) of `model` on `windows`."""
    logits = model(windows[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()


@torch.inference_mode()
def forward_milliseconds(model, context: int = 128, repeats: int = 50) -> float:
    """Median wall time of one single-token forward after a cached `context`-token prefix (ms)."""
    from specdec_lab.cache import new_cache, truncate

    cache = new_cache(model)
    model(input_ids=torch.zeros(1, context, dtype=torch.long), cache=cache, use_cache=True)
    token = torch.zeros(1, 1, dtype=torch.long)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model(input_ids=token, cache=cache, use_cache=True)
        times.append(time.perf_counter() - started)
        truncate(cache, context)
    return 1000 * sorted(times)[len(times) // 2]


def evaluate_zoo(zoo_dir: str | Path, prompts: int = 100, max_new_tokens: int = 64, k: int = 4) -> dict:
    """Measure the zoo pair: validation loss/perplexity, parse rate, greedy acceptance at `k`, samples.

    zoo_dir: the zoo folder; prompts: how many held-out prompts; max_new_tokens: completion length.
    """
    import specdec_lab as sd

    zoo_dir = Path(zoo_dir)
    pair = sd.load_pair(zoo_dir / "target", zoo_dir / "draft", device="cpu")
    windows = validation_windows(pair.tokenizer)
    target_loss = validation_loss(pair.target, windows)
    draft_loss = validation_loss(pair.draft, windows)
    target_ms, draft_ms = forward_milliseconds(pair.target), forward_milliseconds(pair.draft)
    texts = heldout_prompts(prompts)
    parsed, looping, repeating, drafted, accepted, new_tokens, forwards, same = 0, 0, 0, 0, 0, 0, 0, 0
    samples, first_prompts = [], None
    started = time.time()
    for i, text in enumerate(texts):
        ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"]
        plain = sd.generate(pair.target, ids, max_new_tokens=max_new_tokens)
        spec = sd.generate(pair.target, ids, drafter=sd.DraftModelDrafter(pair.draft, k=k),
                           max_new_tokens=max_new_tokens)
        completion = pair.tokenizer.decode(plain.tokens)
        parsed += first_statement_parses(text, completion)
        looping += is_degenerate(plain.tokens)
        repeating += repeats_itself(plain.tokens)
        same += spec.tokens == plain.tokens
        drafted += spec.stats.drafted
        accepted += spec.stats.accepted
        new_tokens += spec.stats.new_tokens
        forwards += spec.stats.target_forwards
        if i < 3:
            samples.append({"prompt": text, "completion": completion})
        if i == REGRESSION_PROMPTS - 1:
            first_prompts = {"prompts": REGRESSION_PROMPTS, "drafted": drafted, "accepted": accepted}
    return {
        "check_windows": f"{CHECK_WINDOWS} x {CHECK_LENGTH} tokens, evenly spaced in the validation stream",
        "target_val_loss": round(target_loss, 4),
        "target_val_ppl": round(float(torch.tensor(target_loss).exp()), 2),
        "draft_val_loss": round(draft_loss, 4),
        "draft_val_ppl": round(float(torch.tensor(draft_loss).exp()), 2),
        "heldout_prompts": len(texts),
        "max_new_tokens": max_new_tokens,
        "first_statement_parses": round(parsed / len(texts), 3),
        "degenerate_share": round(looping / len(texts), 3),
        "repeat_share": round(repeating / len(texts), 3),
        "k": k,
        "greedy_acceptance_rate": round(accepted / drafted, 3),
        "greedy_tau": round(new_tokens / forwards, 3),
        "first_prompts_acceptance": first_prompts,
        "speculative_equals_plain": f"{same}/{len(texts)}",
        "target_forward_ms": round(target_ms, 3),
        "draft_forward_ms": round(draft_ms, 3),
        "forward_cost_ratio": round(target_ms / draft_ms, 1),
        "threads": torch.get_num_threads(),
        "samples": samples,
        "seconds": round(time.time() - started, 1),
    }


def eagle_summary(name: str, figures: dict) -> str:
    """A short card section for an EAGLE head from its training figures (steps done vs planned, accuracy)."""
    done = "" if figures.get("finished", True) else (
        f" Training was paused at step {figures['steps']} of {figures['planned_steps']} (the shared machine was "
        "saturated): this head is under-trained; `specdec train " + name + "` on a free machine trains it fully.")
    depths = sorted(int(k[3:]) for k in figures if k.startswith("acc") and k[3:].isdigit())
    agreement = " / ".join(f"{figures[f'acc{d}']:.2f}" for d in depths)
    layout = (" In vLLM's layout (the paper's head: no fc bias, no input or closing norm), for vLLM's `eagle` "
              "method (`python -m specdec_lab.vllm convert`)." if figures.get("layout") == "vllm" else "")
    data = "" if figures.get("target_outputs", True) else " of the corpus alone"
    return (f"## EAGLE head (`{name}/`)\n\nOne decoder layer over target layers {figures['feature_layers']} "
            f"({figures['parameters'] / 1e6:.2f}M parameters, {figures['unroll_steps']}-step training-time unroll), "
            f"{figures['tokens_seen'] / 1e3:.0f}k training tokens{data} on {figures['hardware']}. Agreement with the "
            f"target's top token at unroll depths {'/'.join(map(str, depths))}: {agreement}.{layout}{done}")


def mtp_summary(figures: dict) -> str:
    """A short card section for the MTP modules from their training figures (`specdec train mtp`)."""
    done = "" if figures.get("finished", True) else (
        f" Training was paused at step {figures['steps']} of {figures['planned_steps']}: these modules are "
        "under-trained; `specdec train mtp` resumes them.")
    depths = range(1, figures["num_modules"] + 1)
    agreement = " / ".join(f"{figures[f'acc{d}']:.2f}" for d in depths)
    return (f"## MTP modules (`mtp/`)\n\n{figures['num_modules']} chained modules in DeepSeek-V3's layout (each: "
            "normalised previous state and next-token embedding, projected, one decoder layer; the target's own "
            f"embedding and output head), {figures['parameters'] / 1e6:.2f}M parameters, "
            f"{figures['tokens_seen'] / 1e3:.0f}k training tokens on {figures['hardware']}. Agreement with the "
            f"target's top token at depths {'/'.join(map(str, depths))} (teacher-forced, validation windows): "
            f"{agreement}.{done}")


def scaling_curve(results: dict) -> str:
    """Both EAGLE heads' agreement at depths 1..4 against training tokens (their runs' evaluations)."""
    heads = [name for name in ("eagle", "eagle3") if results.get(name, {}).get("learning_curve")]
    if not heads:
        return ""
    depths = sorted(int(k[3:]) for k in results[heads[0]]["learning_curve"][0] if k.startswith("acc"))
    lines = ["### EAGLE-1 and EAGLE-3 against training tokens\n\nAgreement of each head's top token with the "
             "target's at unroll depths " + ", ".join(map(str, depths)) + " (the head fed its own features "
             "after depth 1, as when drafting), on the validation windows, at each evaluation of its run. "
             "Points are evaluations of one cosine-scheduled run per head (each run's learning rate decays over "
             "its own length), not separately tuned budgets; both heads are evaluated on the same windows.\n",
             "| head | training tokens | " + " | ".join(f"depth {d}" for d in depths) + " |",
             "|---" * (len(depths) + 2) + "|"]
    for name in heads:
        for point in results[name]["learning_curve"]:
            values = " | ".join(f"{point[f'acc{d}']:.3f}" for d in depths)
            lines.append(f"| {name}/ | {point['tokens'] / 1e6:.2f}M | {values} |")
    return "\n".join(lines)


def temperature_text(value: float | dict) -> str:
    """A ranking temperature as recorded: one value, or one per head folder."""
    if isinstance(value, dict):
        return ", ".join(f"{value[name]} for {name}/" for name in value)
    return str(value)


def rank_temperature_fit(fits: dict) -> str:
    """The fit of each head's tree-ranking temperature (`python -m specdec_lab.train.eagle --fit-rank-temperature`)."""
    tree, heads = fits["tree"], [name for name in ("eagle", "eagle3") if name in fits]
    temperatures = list(fits[heads[0]]["tau"]) if heads else []
    lines = [f"### Tree-ranking temperature, fitted on {fits['prompts']}\n\nTau of EAGLE-2 trees (depth "
             f"{tree['depth']}, top-{tree['top_k']}, {tree['total_tokens']} nodes, {fits['max_new_tokens']} greedy "
             "tokens per prompt) under each temperature; the best is stored in the head's config.json and is "
             "`EagleDrafter`'s default in greedy runs. Reproduce: `python -m specdec_lab.train.eagle "
             "--fit-rank-temperature`.\n",
             "| head | " + " | ".join(f"T = {t}" for t in temperatures) + " | stored |",
             "|---" * (len(temperatures) + 2) + "|"]
    for name in heads:
        taus = " | ".join(f"{tau:.2f}" for tau in fits[name]["tau"].values())
        lines.append(f"| {name}/ | {taus} | {fits[name]['best']} |")
    return "\n".join(lines)


def eagle_table(figures: dict) -> str:
    """The EAGLE sweep (`python -m specdec_lab.train.eagle`): every method on the same prompts in one run."""
    lines = [f"### EAGLE heads against plain decoding and the draft model\n\n{figures['prompts']} held-out "
             f"prompts, {figures['max_new_tokens']} new tokens, greedy, {figures['hardware']}; trees of depth "
             f"{figures['tree_depth']} with top-{figures['top_k']} expansion, reranked to n tokens (EAGLE-2) by "
             f"log-softmax(logits / T), T = {temperature_text(figures.get('rank_temperature', 1.0))}. "
             f"Reproduce: `{figures.get('command', 'python -m specdec_lab.train.eagle')}`.\n",
             "| method | tau | tokens/s | speed-up vs plain | same as plain |", "|---|---|---|---|---|"]
    for name, row in figures["methods"].items():
        lines.append(f"| {name} | {row['tau']:.2f} | {row['tokens_per_s']:.0f} | {row['speedup']:.2f}x | "
                     f"{row['same_as_plain']} |")
    return "\n".join(lines)


def phase_acceptance_line(draft: dict) -> list[str]:
    """What each draft training phase bought: greedy acceptance measured after it (when the stage did)."""
    checks = draft.get("acceptance_after_phase")
    if not checks:
        return []
    figures = ", ".join(f"{rate:.3f} {'for' if phase.endswith('as it was') else 'after training on'} {phase}"
                        for phase, rate in checks["phases"].items())
    return [f"- draft greedy acceptance at k = {checks['k']} on the first {checks['prompts']} held-out prompts "
            f"({checks['max_new_tokens']} tokens, fp32 weights, measured by the draft stage): {figures}"]


def pretrained_draft_line(draft: dict) -> list[str]:
    """Where a draft that started from another zoo's draft came from (the table counts only its own phase)."""
    origin = draft.get("pretrained_from")
    if not origin:
        return []
    before = origin["record"]
    return [f"- the draft starts from `{origin['zoo']}`'s draft ({before['steps']} steps, "
            f"{training_minutes(before):.0f} min on {before['hardware']}, distilled from that zoo's target); the "
            "table's training time and hardware are its mixed phase's against this target"]


def stopped_early_line(draft: dict) -> list[str]:
    """The card's note on a draft phase stopped by its time cap before its schedule's end."""
    return [f"- the draft's {'corpus' if s['phase'] == 'draft' else 'mixed'} phase stopped at its time cap after "
            f"{s['steps']} of the {s['of']} steps its schedule (in the table) plans, its learning rate not yet "
            "at the schedule's floor; tokens seen count the steps it ran" for s in draft.get("stopped_early", [])]


def off_schedule_note(stage: str, off: dict) -> str:
    """The card's warning that a stage's learning-rate schedule changed while it trained (read from its log)."""
    return (f"The {stage}'s learning-rate schedule was changed during training: {off['steps']} steps (steps "
            f"{off['first_step']} to {off['last_step']}) ran at {off['lr_ratio_min']:.2f}x to "
            f"{off['lr_ratio_max']:.2f}x the rate `recipe.json`'s schedule gives them, so a fresh run of the "
            "recipe differs from these weights in those steps.")


def training_minutes(stage: dict) -> float:
    """A stage's training time in minutes: steps x median step when recorded (pauses excluded), else the
    wall clock of its training calls."""
    return (stage.get("compute_seconds") or stage["train_seconds"]) / 60


def run_shape(run: dict) -> str:
    return f"{run['steps']} x {run['batch_size']} x {run['seq_len']}"


def target_runs(recipe: dict) -> str:
    """The target's optimisation: pre-training, then (where the recipe has one) the loop unlikelihood phase."""
    tune = recipe.get("target_tune")
    if not tune:
        return run_shape(recipe["target_run"])
    return (f"{run_shape(recipe['target_run'])}, then {run_shape(tune['run'])} plus {tune['prompts_per_step']} "
            f"completions of its own of {tune['new_tokens']} tokens per step (loop unlikelihood)")


def target_minutes(target: dict) -> float:
    """The target's training time over both of its phases."""
    tune = target.get("loop_unlikelihood")
    return training_minutes(target) + (training_minutes(tune) if tune else 0)


def target_hardware(target: dict) -> str:
    """Where the target trained (each phase, where they differ)."""
    tune = target.get("loop_unlikelihood")
    if not tune or tune["hardware"] == target["hardware"]:
        return target["hardware"]
    return f"{target['hardware']}, then {tune['hardware']}"


def loop_unlikelihood_lines(recipe: dict, target: dict) -> list[str]:
    """The card's paragraph on the target's loop phase: what it does and what it changed on the selection
    prompts (pre-training's kept weights against the phase's kept weights)."""
    tune = target.get("loop_unlikelihood")
    if not tune:
        return []
    settings, before, after = recipe["target_tune"], target.get("best", target), tune.get("best", tune)
    origin = target.get("pretrained_from")
    reused = (f" The pre-training is the target of `{origin['zoo']}`, trained by this recipe's `target_run` and "
              "reused (`specdec train target --pretrained`).") if origin else ""
    return [
        "",
        "The target's second phase fine-tunes the pre-trained weights against their own loops (sequence-level "
        "unlikelihood, Welleck et al. 2020, `train/unlikelihood.py`): at each step the model greedily completes "
        f"{settings['prompts_per_step']} training-split prompts as it stands, and every token of those completions "
        f"that carries a loop to {settings['min_loop_tokens']} tokens or more gets the loss -log(1 - p), beside "
        f"the next-token loss on a corpus batch. On the {SELECTION_PROMPTS} selection prompts (held out, not the "
        "card's), the kept weights went from loops in "
        f"{before['selection_degenerate_share']:.0%} and first statements parsing in "
        f"{before['selection_first_statement_parses']:.0%} (pre-training, step {before.get('step', '?')}) to "
        f"{after['selection_degenerate_share']:.0%} and {after['selection_first_statement_parses']:.0%} (step "
        f"{after.get('step', tune['steps'])} of {tune['steps']}), at a validation loss of {before['val_loss']:.3f} "
        f"then {after['val_loss']:.3f} nats on the phases' own windows"
        + (f"; {after['selection_repeat_share']:.0%} of the kept weights' completions write a statement or two "
           "three times in a row" if "selection_repeat_share" in after else "") + f".{reused}",
    ]


def draft_runs(recipe: dict, draft: dict) -> str:
    """The draft's optimisation, one phase or two (corpus, then corpus mixed with the target's outputs), or
    another zoo's draft, then the mixed phase."""
    origin = draft.get("pretrained_from")
    if origin:
        return f"the draft of `{origin['zoo']}`, then {run_shape(recipe['draft_tune_run'])} (mixed)"
    if not recipe.get("draft_tune_run"):
        return run_shape(recipe["draft_run"])
    return f"{run_shape(recipe['draft_run'])} (corpus), then {run_shape(recipe['draft_tune_run'])} (mixed)"


def target_outputs_line(recipe: dict) -> list[str]:
    """The card's lines on the target-written training text, if the recipe uses it (the draft's second phase
    may have text of its own, `draft_target_outputs`)."""
    settings, own = recipe.get("target_outputs"), recipe.get("draft_target_outputs")
    if not settings or not settings["share"] or not recipe.get("draft_tune_run"):
        return []
    readers = ("" if own else "The draft's second phase, ") + "the Medusa heads and the EAGLE heads"
    readers = readers[0].upper() + readers[1:]
    lines = [f"- Target-written text: the target's greedy {settings['new_tokens']}-token completions of "
             f"{settings['prompts']} function prompts from the training files. {readers} draw "
             f"{settings['share']:.0%} of each batch from it: they are scored on the target's outputs, so they "
             "learn from them (sequence-level distillation)."]
    if own:
        lines.append(f"- The draft's second phase draws {own['share']:.0%} of each batch from completions of its own: "
                     f"the target's greedy {own['new_tokens']}-token completions of {own['prompts']} training-split "
                     "function prompts.")
    return lines


def candidates_line(draft: dict) -> list[str]:
    """How the shipped draft was chosen, when several were trained (greedy acceptance on the selection prompts)."""
    chosen = draft.get("candidates")
    if not chosen:
        return []
    def score(name: str, figure: dict | None) -> str:
        if figure is None:
            return f"{name} not scored (its run ended at the deadline)"
        part = "" if figure["prompts"] == figure["of"] else f" (on the first {figure['prompts']}, the deadline's cut)"
        return f"{name} {figure['rate']:.3f}{part}"

    scores = ", ".join(score(name, figure) for name, figure in chosen["selection_acceptance"].items())
    return [f"- the draft is `{chosen['chosen']}`, the best of {len(chosen['selection_acceptance'])} candidates "
            f"(`scripts/draft_on_gpu.py`) by greedy acceptance at k = 4 on {chosen['selection_prompts']} other "
            f"held-out prompts, which the figures above do not use: {scores}"]


def test_suites_line(corpus: dict) -> list[str]:
    """The card's line on the test suites as extra training text (none when the corpus has no test files)."""
    if not corpus.get("test_files"):
        return []
    return [f"- Plus {corpus['test_files']} files of the library's test suites, as training text only. Test files "
            "whose path hash falls in the validation share are left out altogether, so validation and the "
            "held-out prompts stay library code, the same files as without them."]


def write_model_card(zoo_dir: str | Path) -> Path:
    """Render `MODEL_CARD.md` from `recipe.json` and `training.json` (which must hold an evaluation)."""
    zoo_dir = Path(zoo_dir)
    recipe = json.loads((zoo_dir / "recipe.json").read_text())
    results = json.loads((zoo_dir / "training.json").read_text())
    ev = results["evaluation"]
    tgt, dft = results["target"], results["draft"]
    # The models' own corpus (the target stage records it, test folders included); older zoos: the tokenizer's.
    corpus = tgt.get("corpus", results["tokenizer"]["corpus"])

    def shape(s: dict) -> str:
        layers = f"{s['num_layers']} layer" + ("s" if s["num_layers"] != 1 else "")
        return (f"Llama, hidden {s['hidden_size']}, {layers}, {s['num_heads']} heads, "
                f"MLP {s['intermediate_size']}, context {s['max_position_embeddings']}")

    lines = [
        f"# Model card: {recipe['name']}",
        "",
        "A target and a draft model for teaching speculative decoding, trained from scratch by "
        "`specdec_lab/train/` on the Python standard library's source code. Code is repetitive and "
        "predictable, which is where speculative decoding shines. Small on purpose: everything runs on a "
        "laptop CPU in seconds. The completions look like Python, but the target has only "
        f"{tgt['parameters'] / 1e6:.0f}M parameters: expect plausible code, not correct programs.",
        "",
        "## Data",
        "",
        f"- {corpus['source']}, Python {corpus['python_version']}: {corpus['train_files']} training files, "
        f"{corpus['val_files']} validation files (split by a hash of the path), fingerprint "
        f"`{corpus['fingerprint']}`. Another Python version has a different standard library and fingerprint.",
        *test_suites_line(corpus),
        f"- Tokenizer: byte-level BPE, {recipe['vocab_size']} tokens (`tokenizer/`), `<|endoftext|>` = id 0; "
        "encode/decode round-trips any source exactly"
        + (" (trained on the library files only)." if corpus.get("test_files") else "."),
        *target_outputs_line(recipe),
        "",
        "## Models",
        "",
        "| | target | draft |",
        "|---|---|---|",
        f"| architecture | {shape(recipe['target'])} | {shape(recipe['draft'])} |",
        f"| parameters | {tgt['parameters'] / 1e6:.2f}M | {dft['parameters'] / 1e6:.2f}M |",
        f"| objective | next-token cross-entropy{', then plus loop unlikelihood' if 'loop_unlikelihood' in tgt else ''}"
        " | KL to the target's distribution (distillation) |",
        f"| steps x batch x length | {target_runs(recipe)} | {draft_runs(recipe, dft)} |",
        f"| tokens seen | {tgt['tokens_seen'] / 1e6:.1f}M | {dft['tokens_seen'] / 1e6:.1f}M |",
        f"| training time | {target_minutes(tgt):.0f} min | {training_minutes(dft):.0f} min |",
        f"| hardware | {target_hardware(tgt)} | {dft['hardware']} |",
        f"| validation loss (nats/token) | {ev['target_val_loss']:.3f} | {ev['draft_val_loss']:.3f} |",
        f"| validation perplexity | {ev['target_val_ppl']:.1f} | {ev['draft_val_ppl']:.1f} |",
        "",
        f"Validation loss is measured on {ev['check_windows']} (fp16 weights upcast to fp32); the test suite "
        "re-measures it, so a corrupted or swapped checkpoint fails."
        + (" Training time is the number of steps times the median step's wall time, so time the job sat "
           "paused does not count." if tgt.get("compute_seconds") else ""),
        *loop_unlikelihood_lines(recipe, tgt),
        "",
        "## Speculative decoding figures",
        "",
        f"On {ev['heldout_prompts']} held-out prompts (a function's signature and docstring from the validation "
        f"files), greedy, {ev['max_new_tokens']} new tokens:",
        "",
        f"- the target's first complete statement or block parses with `ast`: {ev['first_statement_parses']:.0%}",
        *([f"- completions that loop (one token, or one cycle of 2 to 4 tokens, repeated over {LOOP_MIN_TOKENS} "
           f"tokens or more): {ev['degenerate_share']:.0%}"] if "degenerate_share" in ev else []),
        *([f"- completions that write one stretch of up to {REPEAT_MAX_PERIOD} tokens (a statement or two) three "
           f"times in a row: {ev['repeat_share']:.0%}"] if "repeat_share" in ev else []),
        f"- draft greedy acceptance rate at k = {ev['k']}: {ev['greedy_acceptance_rate']:.3f}; "
        f"tau (tokens per target forward, bonus included): {ev['greedy_tau']:.2f}",
        f"- speculative output identical to plain greedy decoding: {ev['speculative_equals_plain']} prompts",
        f"- one single-token forward after a 128-token cached prefix ({ev['threads']} CPU threads, median): "
        f"target {ev['target_forward_ms']:.2f} ms, draft {ev['draft_forward_ms']:.2f} ms, "
        f"ratio {ev['forward_cost_ratio']:.1f}x",
        *phase_acceptance_line(dft),
        *pretrained_draft_line(dft),
        *candidates_line(dft),
        *stopped_early_line(dft),
    ]
    notes = []
    for stage in ("target", "draft"):  # each stage's hand-written notes, then what its log says
        notes += results[stage].get("notes", [])
        if "off_schedule" in results[stage]:
            notes.append(off_schedule_note(stage, results[stage]["off_schedule"]))
    if notes:
        lines += ["", "Training notes:", ""] + [f"- {note}" for note in notes]
    for section in ("medusa", "eagle", "eagle3", "eagle-vllm", "mtp"):
        if section in results and "card" in results[section]:
            lines += ["", results[section]["card"]]
        elif section.startswith("eagle") and section in results:
            lines += ["", eagle_summary(section, results[section])]
        elif section == "mtp" and section in results:
            lines += ["", mtp_summary(results[section])]
    if "drafters_compared" in results:
        lines += ["", drafters_section(results["drafters_compared"])]
    curve = scaling_curve(results)
    if curve:
        lines += ["", curve]
    if "eagle_rank_temperature" in results:
        lines += ["", rank_temperature_fit(results["eagle_rank_temperature"])]
    if "eagle_heldout" in results:
        lines += ["", eagle_table(results["eagle_heldout"])]
    lines += ["", "## Sample completions (target, greedy)", "",
              f"The first {len(ev['samples'])} of the {ev['heldout_prompts']} held-out prompts, in their fixed "
              "order (not chosen), each with the target's greedy completion.", ""]
    for sample in ev["samples"]:
        lines += ["```python", sample["prompt"] + sample["completion"], "```", ""]
    lines += [
        "## Reproduce",
        "",
        "```bash",
        "specdec train all     # tokenizer, target, draft, heads, card (resumable; see recipe.json)",
        "specdec train card    # re-measure and rewrite this card",
        "```",
        "",
    ]
    path = zoo_dir / "MODEL_CARD.md"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)  # atomic: an error mid-write leaves the old card whole
    return path


def compare_zoo_drafters(zoo_dir: str | Path, prompts: int = REGRESSION_PROMPTS, max_new_tokens: int = 64,
                         k: int = 4) -> dict:
    """Every zoo drafter as a greedy chain of `k` on the card's first `prompts` held-out prompts
    (`specdec_lab.compare`): per-depth acceptance, tau and drafting time, side by side."""
    import specdec_lab as sd
    from specdec_lab.compare import compare_drafters

    zoo_dir = Path(zoo_dir)
    pair = sd.load_pair(zoo_dir / "target", zoo_dir / "draft", device="cpu")
    ids = [pair.tokenizer(text, add_special_tokens=False)["input_ids"] for text in heldout_prompts(prompts)]
    return compare_drafters(pair, ids, max_new_tokens=max_new_tokens, k=k, zoo=zoo_dir)


def drafters_section(figures: dict) -> str:
    """The card's side-by-side table of the zoo's drafters (`compare_zoo_drafters`)."""
    from specdec_lab.compare import comparison_table

    missing = "".join(f" Not measured: `{name}/` ({reason.split(':')[0]})." for name, reason in
                      figures["skipped"].items())
    return ("## The drafters side by side\n\nEvery drafter as a greedy chain of up to "
            f"{figures['k']} tokens on the first {figures['prompts']} held-out prompts ({figures['max_new_tokens']} "
            "new tokens, the same prompts for all). Each depth's figure is the acceptance at that depth among the "
            "steps whose earlier drafted tokens were all kept; MTP drafts one token per module. Drafting time is "
            f"one reading of this machine ({figures['threads']} threads), not a benchmark.{missing}\n\n"
            + comparison_table(figures))


def build_card(zoo_dir: str | Path) -> dict:
    """Evaluate the zoo, store the figures in `training.json` and rewrite the model card."""
    evaluation = evaluate_zoo(zoo_dir)
    record_result(Path(zoo_dir), "evaluation", evaluation)
    record_result(Path(zoo_dir), "drafters_compared", compare_zoo_drafters(zoo_dir))
    write_model_card(zoo_dir)
    return evaluation
