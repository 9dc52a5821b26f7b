"""The `specdec` command: generate text, run the demo, train the zoo.

    specdec generate "def add(a, b):" --method draft --k 4
    specdec demo
    specdec train all
    specdec tune --out profile.json          # then: specdec generate ... --tuned profile.json
    specdec sweep --html sweep.html          # alpha and tau against temperature, one figure
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Prompts end without a trailing newline: the tokenizer merges a newline with the next line's indentation.
DEMO_PROMPTS = [
    'def is_prime(n):\n    """Return True if n is a prime number."""',
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
    "import os\n\n\ndef list_python_files(folder):",
]


def build_drafter(method: str, pair, k: int):
    """The drafter for a method name ("plain" returns None: autoregressive decoding)."""
    import specdec_lab as sd

    if method == "plain":
        return None
    if method == "draft":
        return sd.DraftModelDrafter(pair.draft, k=k)
    if method == "lookup":
        return sd.PromptLookupDrafter(k=k)
    if method == "lookahead":
        return sd.LookaheadDrafter()
    try:  # the heads ship with the zoo and are trained on its target
        if method == "medusa":
            return sd.MedusaDrafter.from_pretrained(sd.zoo_path() / "medusa", pair.target)
        if method == "eagle":
            return sd.EagleDrafter(sd.EagleHead.load(sd.zoo_path() / "eagle", pair.target), mode="tree",
                                   total_tokens=16)
        if method == "mtp":
            from specdec_lab.drafters.mtp import MTPDrafter

            return MTPDrafter.from_pretrained(sd.zoo_path() / "mtp", pair.target)
    except (FileNotFoundError, ValueError) as error:  # missing, unreadable, or made for another target
        raise SystemExit(f"error: {error}") from None
    raise SystemExit(f"unknown method {method!r}")


def load_for_cli(args):
    import specdec_lab as sd

    try:
        return sd.load_pair(target=args.target, draft=args.draft)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


COMPILE_HELP = ("static KV cache and torch.compile'd forwards (the first call of each shape compiles, seconds to a "
                "minute; later processes reuse inductor's on-disk cache)")


def cmd_generate(args) -> None:
    import specdec_lab as sd

    pair = load_for_cli(args)
    ids = pair.tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    if args.method == "draft" and pair.draft is None:
        raise SystemExit("error: --method draft needs a draft model (--draft PATH)")
    try:
        out = sd.generate(pair.target, ids, drafter=build_drafter(args.method, pair, args.k),
                          max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed, tuned=args.tuned,
                          compile=args.compile)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(args.prompt + pair.tokenizer.decode(out.tokens))
    print("---")
    for key, value in out.stats.summary().items():
        print(f"{key:>24}: {value}")


def cmd_demo(args) -> None:
    import torch

    import specdec_lab as sd

    torch.set_num_threads(args.threads)
    pair = load_for_cli(args)
    methods = [("plain", None), ("draft model k=4", sd.DraftModelDrafter(pair.draft, k=4)),
               ("prompt lookup", sd.PromptLookupDrafter(k=8))]
    print(f"target: {pair.target.num_parameters() / 1e6:.1f}M params, draft: "
          f"{pair.draft.num_parameters() / 1e6:.2f}M params, {args.threads} threads, greedy, "
          f"{args.max_new_tokens} new tokens per prompt\n")
    ids_list = [pair.tokenizer(p, add_special_tokens=False)["input_ids"] for p in DEMO_PROMPTS]
    sd.generate(pair.target, ids_list[0], max_new_tokens=8)  # warm-up
    totals = {}
    for name, drafter in methods:
        started = time.perf_counter()
        outs = [sd.generate(pair.target, ids, drafter=drafter, max_new_tokens=args.max_new_tokens) for ids in ids_list]
        seconds = time.perf_counter() - started
        totals[name] = (outs, seconds)
    baseline_outs, baseline_seconds = totals["plain"]
    print(f"{'method':<18}{'tokens/s':>10}{'speedup':>9}{'tau':>7}{'accept':>8}  same as plain")
    for name, (outs, seconds) in totals.items():
        tokens = sum(o.stats.new_tokens for o in outs)
        forwards = sum(o.stats.target_forwards for o in outs)
        drafted = sum(o.stats.drafted for o in outs)
        accepted = sum(o.stats.accepted for o in outs)
        same = all(o.tokens == b.tokens for o, b in zip(outs, baseline_outs, strict=True))
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        print(f"{name:<18}{tokens / seconds:>10.1f}{baseline_seconds / seconds:>8.2f}x{tokens / forwards:>7.2f}"
              f"{rate:>8}  {'yes' if same else 'NO'}")
    print("\nfirst prompt, speculative output:\n" + DEMO_PROMPTS[0]
          + pair.tokenizer.decode(totals["draft model k=4"][0][0].tokens))


ALL_STAGES = ("tokenizer", "target", "draft", "medusa", "eagle", "eagle3", "eagle-vllm", "mtp", "card")
EAGLE_STAGES = {"eagle": "eagle1", "eagle3": "eagle3", "eagle-vllm": "eagle1-vllm"}  # stage -> head variant


def run_train_stage(stage: str, recipe: str, workdir: str, max_minutes: float | None,
                    pretrained: str | None = None) -> dict:
    """Run one zoo stage and print what it reports; returns its result ("finished": False when paused)."""
    from pathlib import Path

    if stage == "card":
        from specdec_lab.train.card import build_card

        print(build_card(Path(recipe).parent))
        return {"finished": True}
    if stage == "medusa":
        from specdec_lab.train.medusa import run_medusa_stage

        result = run_medusa_stage(recipe, workdir, max_minutes)
        print(result.get("card", f"medusa: {result}"))
        return result
    if stage in EAGLE_STAGES:
        from specdec_lab.train.eagle import run_eagle_stage

        result = run_eagle_stage(EAGLE_STAGES[stage], recipe, workdir, max_minutes)
    elif stage == "mtp":
        from specdec_lab.train.mtp import run_mtp_stage

        result = run_mtp_stage(recipe, workdir, max_minutes)
    else:
        from specdec_lab.train.zoo import run_stage

        result = run_stage(stage, recipe, workdir, max_minutes, pretrained)
    print(f"{stage}: {result}")
    return result


def cmd_train(args) -> None:
    from specdec_lab.models import zoo_path

    recipe = args.recipe or str(zoo_path() / "recipe.json")
    if args.pretrained and args.stage not in ("target", "draft"):
        raise SystemExit(f"--pretrained starts the target or the draft stage from an exported model; "
                         f"it has no meaning for {args.stage!r}")
    if args.write_carry:
        from specdec_lab.train.zoo import carry_folder, write_stage_carry

        state = write_stage_carry(recipe, args.workdir, args.stage)
        print(f"{args.stage}: step {state['step']} carried to {carry_folder(Path(recipe).parent, args.stage)} "
              "(commit it; the same train command resumes from it on a machine without the checkpoint)")
        return
    for stage in ALL_STAGES if args.stage == "all" else (args.stage,):
        if not run_train_stage(stage, recipe, args.workdir, args.max_minutes, args.pretrained).get("finished", True):
            break  # paused: the same command resumes here


def cmd_bench(args) -> None:
    from specdec_lab import report
    from specdec_lab.bench import BenchConfig, run_benchmark

    config = BenchConfig(methods=args.methods.split(",") if args.methods else None, k=args.k,
                         lookup_k=args.lookup_k, tree_tokens=args.tree_tokens, adaptive_k=args.adaptive_k,
                         min_confidence=args.min_confidence, tuned=args.tuned, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p,
                         prompts=args.prompts, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         warmup=args.warmup, threads=args.threads, seed=args.seed,
                         prompt_sets=tuple(args.sets.split(",")), target=args.target, draft=args.draft,
                         compile=args.compile)
    try:
        result = run_benchmark(config)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(report.text_table(result))
    if args.json:
        print(f"wrote {report.write_json(result, args.json)}")
    if args.html:
        print(f"wrote {report.write_html(result, args.html)}")
    if args.markdown:
        print(f"wrote {report.write_atomic(args.markdown, report.markdown_report(result))}")


def cmd_sweep(args) -> None:
    from specdec_lab import report
    from specdec_lab.sweep import SweepConfig, run_sweep

    try:
        config = SweepConfig(temperatures=tuple(float(t) for t in args.temperatures.split(",")),
                             methods=args.methods.split(",") if args.methods else None, prompts=args.prompts,
                             max_new_tokens=args.max_new_tokens, seeds=args.seeds, k=args.k,
                             tree_tokens=args.tree_tokens, threads=args.threads, seed=args.seed, target=args.target,
                             draft=args.draft)
        result = run_sweep(config)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(report.sweep_table(result))
    if args.json:
        print(f"wrote {report.write_json(result, args.json)}")
    if args.html:
        print(f"wrote {report.write_sweep_html(result, args.html)}")


def writable_output(path: str, option: str = "--out") -> Path:
    """`path` checked before any work is done: a file that can be written there (its folder exists, or can be made,
    and takes new files). Exits with an error naming the path and the problem otherwise.

    path: the file to write; option: the command-line option it came from (for the message).
    """
    import tempfile

    out = Path(path)
    if out.is_dir():
        raise SystemExit(f"error: {option} {path} is a folder; give a file name, e.g. {out / 'specdec-profile.json'}")
    existing = next(p for p in (out.parent, *out.parent.parents) if p.exists())  # the folder it goes into, or above
    if not existing.is_dir():
        raise SystemExit(f"error: cannot write {option} {path}: {existing} is a file, not a folder")
    try:  # the honest test: make (and at once remove) a file where the folders would be made
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".specdec-write-test-"):
            pass
    except OSError as error:
        raise SystemExit(f"error: cannot write {option} {path}: {error.strerror or error} in {existing}; choose "
                         "another path") from None
    return out


def cmd_tune(args) -> None:
    import json

    from specdec_lab.report import write_atomic
    from specdec_lab.tune import tune

    out = writable_output(args.out)  # before the calibration, which takes minutes
    try:
        pair = load_for_cli(args) if args.target or args.draft else None
        temperatures = [float(t) for t in args.temperatures.split(",")]
        profile = tune(pair, prompts=args.prompts, max_new_tokens=args.max_new_tokens, temperatures=temperatures,
                       threads=args.threads, compile=args.compile)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    write_atomic(out, json.dumps(profile, indent=1) + "\n")  # a temporary file, then a rename: never half a profile
    print(f"wrote {args.out} (measured on: {profile['device']['cpu']}, {profile['device']['device']}, "
          f"{profile['device']['torch_threads']} threads)")


def cmd_export(args) -> None:
    from specdec_lab.export import ExportError, export

    try:
        export(args.notebook, args.out, target=args.target, draft=args.draft, prompts=args.prompts,
               max_new_tokens=args.max_new_tokens, repeats=args.repeats, threads=args.threads, force=args.force,
               vllm=args.vllm)
    except (ExportError, FileNotFoundError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target model folder or hub id (default: the shipped zoo target)")
    parser.add_argument("--draft", help="draft model folder or hub id (default: the zoo draft)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Speculative decoding: a cheap drafter proposes tokens, the target verifies them in one pass.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", help="complete a prompt and print the text and the decoding statistics")
    gen.add_argument("prompt", help="text to continue")
    gen.add_argument("--method", choices=["plain", "draft", "lookup", "lookahead", "medusa", "eagle", "mtp"],
                     default="draft", help="plain autoregressive, draft-model speculation, prompt lookup, "
                     "lookahead (Jacobi), or the zoo's Medusa heads, EAGLE head (EAGLE-2 tree) or MTP modules "
                     "(DeepSeek-V3 multi-token prediction, a chain) (default: draft)")
    gen.add_argument("--k", type=int, default=4, help="tokens drafted per step (default: 4)")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate (default: 64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    gen.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    gen.add_argument("--seed", type=int, default=0, help="random seed for sampling (default: 0)")
    gen.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    gen.add_argument("--tuned", metavar="PROFILE", help="take the draft length / tree budget from a `specdec tune` "
                     "profile (methods draft and eagle)")
    add_model_options(gen)
    gen.set_defaults(func=cmd_generate)

    demo = sub.add_parser("demo", help="plain vs speculative decoding side by side on the default models")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    demo.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    add_model_options(demo)
    demo.set_defaults(func=cmd_demo)

    train = sub.add_parser("train", help="rebuild the shipped zoo from its recipe (resumes where it stopped)")
    train.add_argument("stage", choices=["all", *ALL_STAGES],
                       help="what to train (card: re-measure the zoo and rewrite its model card; "
                            "medusa: the Medusa heads on the zoo target, with their tree and figures; "
                            "eagle / eagle3: the EAGLE-1 head / its EAGLE-3-style variant on the zoo target; "
                            "mtp: DeepSeek-V3-style multi-token prediction modules on the zoo target)")
    train.add_argument("--recipe", help="recipe JSON (default: the shipped zoo's recipe.json)")
    train.add_argument("--workdir", default="runs", help="checkpoints and logs (default: ./runs)")
    train.add_argument("--max-minutes", type=float, default=None,
                       help="pause (checkpointed) after this many minutes; run again to resume")
    train.add_argument("--pretrained", metavar="FOLDER",
                       help="target stage: take this exported target (a zoo's target/ folder, trained by the "
                            "recipe's target_run) as the pre-training and run only the recipe's target_tune phase; "
                            "draft stage: start the recipe's second phase (draft_tune_run) from this exported "
                            "draft (another zoo's draft/) instead of distilling on the corpus first")
    train.add_argument("--write-carry", action="store_true",
                       help="train nothing: copy the stage's unfinished run (fp16 weights, state, log) into the "
                            "zoo's carry/ folder, small enough to commit, to resume from on another machine")
    train.set_defaults(func=cmd_train)

    bench = sub.add_parser("bench", help="Hugging Face generate vs every method, side by side, on held-out prompts")
    bench.add_argument("--methods", help="comma-separated subset, e.g. plain,draft,hf-assisted (default: all that "
                       "exist: hf-generate plain hf-assisted draft draft-block draft-adaptive hf-lookup lookup "
                       "suffix medusa medusa-typical eagle eagle-adaptive eagle-tree eagle-tree-top eagle3-tree "
                       "mtp lookahead; the hf-generate baseline always runs)")
    bench.add_argument("--k", type=int, default=4, help="tokens drafted per step by draft models (default: 4)")
    bench.add_argument("--lookup-k", type=int, default=10, help="most tokens drafted by prompt lookup (default: 10)")
    bench.add_argument("--tree-tokens", type=int, default=16,
                       help="nodes per EAGLE-2 tree, its verification budget (default: 16)")
    bench.add_argument("--adaptive-k", type=int, default=8,
                       help="most tokens an adaptive draft (draft-adaptive, eagle-adaptive) may reach (default: 8)")
    bench.add_argument("--min-confidence", type=float, default=0.5,
                       help="adaptive drafts stop before a token whose largest draft probability is below this "
                       "(default: 0.5)")
    bench.add_argument("--tuned", metavar="PROFILE", help="a `specdec tune` profile: draft, eagle, eagle-adaptive "
                       "(its longest chain) and the eagle trees take their settings from it")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    bench.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    bench.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    bench.add_argument("--prompts", type=int, default=10, help="prompts per prompt set (default: 10)")
    bench.add_argument("--sets", default="heldout,grounded",
                       help="prompt sets: heldout (signature + docstring), grounded (output repeats the prompt)")
    bench.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: 64)")
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported (default: 3)")
    bench.add_argument("--warmup", type=int, default=1, help="untimed warm-up passes (default: 1)")
    bench.add_argument("--threads", type=int, default=2, help="torch CPU threads, pinned (default: 2)")
    bench.add_argument("--seed", type=int, default=0, help="base sampling seed; prompt i uses seed + i")
    bench.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    bench.add_argument("--json", metavar="PATH", help="write the raw figures as JSON")
    bench.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with charts")
    bench.add_argument("--markdown", metavar="PATH", help="write the tables as Markdown (what the README shows)")
    add_model_options(bench)
    bench.set_defaults(func=cmd_bench)

    sweep = sub.add_parser("sweep", help="alpha and tau against the sampling temperature for the draft model, EAGLE "
                           "chain and trees, Medusa (lossless and typical); a plotly figure with --html")
    sweep.add_argument("--temperatures", default="0,0.3,0.7,1.0,1.3",
                       help="comma-separated temperatures, 0 = greedy (default: 0,0.3,0.7,1.0,1.3)")
    sweep.add_argument("--methods", help="comma-separated subset of: draft draft-block eagle-chain eagle-tree-sampled "
                       "eagle-tree-top medusa medusa-typical (default: all)")
    sweep.add_argument("--prompts", type=int, default=3, help="held-out prompts (default: 3)")
    sweep.add_argument("--max-new-tokens", type=int, default=32, help="tokens per prompt (default: 32)")
    sweep.add_argument("--seeds", type=int, default=2, help="sampled runs per prompt and temperature (default: 2)")
    sweep.add_argument("--k", type=int, default=4, help="draft length of the chains (default: 4)")
    sweep.add_argument("--tree-tokens", type=int, default=16, help="nodes per EAGLE tree (default: 16)")
    sweep.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    sweep.add_argument("--seed", type=int, default=0, help="base sampling seed (default: 0)")
    sweep.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    sweep.add_argument("--html", metavar="PATH", help="write the figure and table as a self-contained HTML page")
    add_model_options(sweep)
    sweep.set_defaults(func=cmd_sweep)

    tune = sub.add_parser("tune", help="measure this device's cost curve and acceptance; choose k and the tree "
                          "budget that maximise predicted tokens/s; write a JSON profile")
    tune.add_argument("--out", default="specdec-profile.json",
                      help="profile to write, checked before measuring (default: specdec-profile.json)")
    tune.add_argument("--prompts", type=int, default=6, help="training-split calibration prompts (default: 6)")
    tune.add_argument("--max-new-tokens", type=int, default=48, help="tokens per calibration prompt (default: 48)")
    tune.add_argument("--temperatures", default="0,1",
                      help="comma-separated temperatures to choose for: 0 = greedy, one > 0 = sampled (default: 0,1)")
    tune.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    tune.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    add_model_options(tune)
    tune.set_defaults(func=cmd_tune)

    export = sub.add_parser("export", help="turn a completed lab notebook into a project folder: module, "
                            "benchmark against the reference, HTML report, README")
    export.add_argument("notebook", help="the completed lab notebook (.ipynb)")
    export.add_argument("--out", required=True, help="folder to create (refused if it exists, unless --force)")
    export.add_argument("--force", action="store_true", help="replace --out if it already exists")
    export.add_argument("--prompts", type=int, default=5, help="held-out prompts in the benchmark (default: 5)")
    export.add_argument("--max-new-tokens", type=int, default=32, help="tokens per prompt (default: 32)")
    export.add_argument("--repeats", type=int, default=2, help="timed repeats, medians reported (default: 2)")
    export.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    export.add_argument("--vllm", action="store_true",
                        help="lab 6: also run the exported EAGLE head in vLLM (needs `make production`)")
    add_model_options(export)
    export.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
