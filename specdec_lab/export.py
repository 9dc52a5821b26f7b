"""Turning a student's completed lab notebook into a project artifact they can keep and show.

    specdec export labs/lab01_sampling/lab01_sampling.ipynb --out my-speculative-sampling

The artifact folder holds:

- `<lab>.py`: the student's implementation as an importable module: the lab's locked setup cells (the
  helpers and small models the exercises use, without bare calls such as `torch.set_num_threads`) and the
  imports, constants, functions and classes of the solution cells (demos, plots and tests stay behind);
- `benchmark.json` and `report.html`: their code plugged into the real engine on the zoo pair, against the
  reference implementation, measured in the same run (outputs at temperature 0, tau and speed);
- `README.md`: what they built, what was measured, and how to rerun it.

Bad input (not a notebook, a corrupt file, exercises still raising NotImplementedError, a module that does
not import) is refused with a message naming the problem, and nothing is written: the folder is built in a
temporary sibling and renamed into place only when everything succeeded.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from specdec_lab import bench, decode, report
from specdec_lab.drafters import DraftModelDrafter, PromptLookupDrafter
from specdec_lab.drafters.base import DecodeState, Draft, Drafter
from specdec_lab.drafters.eagle import EagleConfig, EagleDrafter, EagleHead
from specdec_lab.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec_lab.models import ModelPair, load_pair, zoo_path
from specdec_lab.sampling import process_logits
from specdec_lab.stats import DecodeStats
from specdec_lab.tree import DraftTree
from specdec_lab.verify import TreeVerdict, Verdict

# Top-level statements kept in the module: imports, definitions (and literal constants, see below).
# Everything else (calls, prints, plots) is notebook activity.
KEPT_STATEMENTS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
NBGRADER_MARKER = re.compile(r"\s*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)\s*$")


class ExportError(Exception):
    """The notebook cannot become an artifact; the message says why and what to do."""


# ----------------------------------------------------------------------------------------------- reading


@dataclass
class Extracted:
    """The student's implementation, lifted out of the notebook.

    lab: the notebook's name (e.g. "lab01_sampling"); title: its first heading; source: the module text;
    functions: the solution functions with the first line of their docstrings.
    """

    lab: str
    title: str
    source: str
    functions: dict[str, str] = field(default_factory=dict)


def read_notebook(path: Path):
    """The notebook at `path`, validated; ExportError when it is missing, not JSON or not a notebook."""
    import nbformat

    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    try:
        notebook = nbformat.read(str(path), as_version=4)
        nbformat.validate(notebook)
    except (nbformat.reader.NotJSONError, nbformat.ValidationError, UnicodeDecodeError, ValueError, KeyError,
            AttributeError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ExportError(f"{path} is not a readable Jupyter notebook ({first_line[:200]})") from None
    return notebook


def nbgrader_role(cell) -> str:
    """"solution", "test" (a graded cell the student may not edit), "setup" (locked code) or "other"."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if meta.get("solution"):
        return "solution"
    if meta.get("grade"):
        return "test"
    if meta.get("locked"):
        return "setup"
    return "other"


def without_magics(source: str) -> str:
    """The cell's source with top-level IPython magics and shell escapes (`%...`, `!...`) removed."""
    return "\n".join("" if line.startswith(("%", "!")) else line for line in source.splitlines())


def raises_not_implemented(tree: ast.AST) -> bool:
    """Whether the code still contains nbgrader's placeholder `raise NotImplementedError`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id == "NotImplementedError":
                return True
    return False


def is_constant_assignment(node: ast.stmt) -> bool:
    """`NAME = <literal>` at the top level: a constant the functions may read (kept; other statements are not)."""
    if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def kept_code(source: str, tree: ast.Module, whole: bool) -> tuple[list[str], list[str]]:
    """The imports and the other kept statements of one cell, in order, without nbgrader markers.

    whole: keep every statement except bare calls (a setup cell that builds models and data the functions
    read); otherwise keep only definitions and literal constants (a solution or demo cell).
    """
    lines = source.splitlines()
    imports, statements = [], []
    for node in tree.body:
        definition = isinstance(node, KEPT_STATEMENTS) or is_constant_assignment(node)
        if definition or (whole and not isinstance(node, ast.Expr)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            code = "\n".join(line for line in lines[first - 1 : node.end_lineno] if not NBGRADER_MARKER.match(line))
            (imports if isinstance(node, ast.Import | ast.ImportFrom) else statements).append(code)
    return imports, statements


def extract(path: Path) -> Extracted:
    """The student's implementation from a completed nbgrader lab notebook (ExportError when unfinished)."""
    notebook = read_notebook(path)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    solutions = [c for c in code_cells if nbgrader_role(c) == "solution"]
    if not solutions:
        raise ExportError(f"{path} has no nbgrader solution cells: export works on the graded lab notebooks "
                          "(labs/labNN_topic/labNN_topic.ipynb)")
    imports, definitions, functions, unfinished = [], [], {}, []
    first_solution = code_cells.index(solutions[0])
    for position, cell in enumerate(code_cells):
        role = nbgrader_role(cell)
        if role not in ("setup", "solution"):
            continue
        name = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
        source = without_magics(cell.source)
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            raise ExportError(f"cell {name!r} has a syntax error on line {error.lineno}: {error.msg}") from None
        if role == "solution" and raises_not_implemented(tree):
            unfinished.append(name)
            continue
        cell_imports, cell_definitions = kept_code(source, tree, whole=role == "setup" and position < first_solution)
        imports += [line for line in cell_imports if line not in imports]
        definitions += cell_definitions
        if role == "solution":
            functions |= {node.name: (ast.get_docstring(node) or "").split("\n")[0] for node in tree.body
                          if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    if unfinished:
        raise ExportError(f"{path} is not finished: {len(unfinished)} exercise(s) still raise "
                          f"NotImplementedError ({', '.join(unfinished)}); complete them, then export")
    if not functions:
        raise ExportError(f"{path}: the solution cells define no functions to export")
    title = next((c.source.lstrip("# ").splitlines()[0] for c in notebook.cells
                  if c.cell_type == "markdown" and c.source.startswith("#")), path.stem)
    lab = re.sub(r"\W", "_", path.stem)
    if not lab.isidentifier():
        lab = "lab_" + lab
    about = (f"Extracted by `specdec export` from {path.name} on {time.strftime('%Y-%m-%d')}: the lab's setup "
             f"(without its bare calls) and the definitions of its solution cells. Functions: "
             f"{', '.join(functions)}.")
    header = f'"""{title}: my implementation.\n\n{textwrap.fill(about, 110)}\n"""\n\n'
    source = header + "\n".join(imports) + "\n\n\n" + "\n\n\n".join(definitions) + "\n"
    return Extracted(lab, title, source, functions)


def import_module_from(path: Path, name: str) -> ModuleType:
    """Import the module file at `path` under `name` without leaving it in `sys.modules`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # any failure of student code is reported, not raised through
        raise ExportError(f"the extracted module {path.name} fails to import: {type(error).__name__}: {error}") \
            from None
    finally:
        sys.modules.pop(name, None)
    return module


# ----------------------------------------------------------------------------------------------- benchmarks


@dataclass
class LabBenchmark:
    """How one lab's implementation is benchmarked against the reference.

    needs: solution functions that identify the lab; subject: what of theirs runs ("my verify"); what: one
    sentence for the README; methods: (module, config) -> the benchmark methods, named "plain" (the
    baseline every figure is relative to), "reference" (the engine's own implementation) and "yours" (the
    same job done by the student's code); own: instead of `methods`, for a lab that brings its own target
    (the drafter-training lab): (module, settings, folder) -> the benchmark dict, run on the lab's models,
    where `folder` is the artifact being written (for files of the lab's own).
    """

    needs: tuple[str, ...]
    subject: str
    what: str
    methods: Callable[[ModuleType, bench.BenchConfig], list[bench.Method]] | None = None
    own: Callable[[ModuleType, dict, Path], dict] | None = None


def student_verify_chain(verify: Callable) -> Callable:
    """The engine's chain verification rule with the student's `verify(draft_tokens, p, q, generator)` inside.

    The engine hands over processed target rows p (k + 1, V); the draft rows q are the draft model's (or
    one-hot rows when the draft is deterministic, as at temperature 0, where p is one-hot too, so a correct
    rule reproduces greedy decoding exactly).
    """

    def verify_chain(draft, logits: torch.Tensor, sampling, generator: torch.Generator) -> Verdict:
        p = process_logits(logits, sampling)
        q = draft.probs
        if q is None:
            q = torch.nn.functional.one_hot(draft.tokens, p.shape[-1]).to(p.dtype)
        emitted = [int(t) for t in verify(draft.tokens, p, q, generator)]
        accepted = len(emitted) - 1
        if accepted < 0 or emitted[:accepted] != draft.tokens[:accepted].tolist():
            raise ExportError(f"your verify returned {emitted} for the draft {draft.tokens.tolist()}: it must "
                              "return the accepted draft prefix followed by exactly one target token")
        return Verdict(accepted, emitted[-1], resampled=accepted < len(draft.tokens))

    return verify_chain


@contextlib.contextmanager
def engine_verification(verify_chain: Callable) -> Iterator[None]:
    """Run the engine's decode loop with another chain verification rule, then put the engine's back."""
    original = decode.verify_chain
    decode.verify_chain = verify_chain
    try:
        yield
    finally:
        decode.verify_chain = original


def engine_methods() -> list[bench.Method]:
    """The engine's plain decoding (the baseline) and its draft-model speculative decoding (the reference)."""
    return [
        bench.Method("plain", "specdec_lab.generate, autoregressive", "ours", "autoregressive",
                     lambda c: bench.ours_runner(c, None)),
        bench.Method("reference", "specdec_lab.generate, draft model", "ours", "chain", draft_runner,
                     draft_model=True),
    ]


def draft_runner(context: bench.BenchContext) -> bench.Runner:
    """The engine with the draft-model drafter (k from the settings)."""
    return bench.ours_runner(context, DraftModelDrafter(bench.need_draft(context), k=context.config.k))


def lab02_methods(module: ModuleType, config: bench.BenchConfig) -> list[bench.Method]:
    """The engine against the student's whole loop (`generate`, `speculative_step`) on the same models."""

    def yours(context: bench.BenchContext) -> bench.Runner:
        # Their `start` reads the module globals `target` and `draft_model`: point them at the benchmark pair.
        module.target, module.draft_model = context.pair.target, context.pair.draft
        their_step, accepted_per_step = module.speculative_step, []

        def counted_step(dec, k: int) -> list[int]:
            emitted = their_step(dec, k)
            accepted_per_step.append(len(emitted) - 1)
            return emitted

        def run(ids: list[int], seed: int) -> bench.RunResult:
            accepted_per_step.clear()
            module.speculative_step = counted_step  # their `generate` looks the step up at call time
            started = time.perf_counter()
            try:
                tokens, forwards = module.generate(list(ids), config.max_new_tokens, config.k,
                                                   temperature=config.temperature, seed=seed,
                                                   eos=context.eos_token_id)
            finally:
                module.speculative_step = their_step
            stats = DecodeStats(target_forwards=int(forwards), new_tokens=len(tokens),
                                total_seconds=time.perf_counter() - started)
            for accepted in accepted_per_step:
                stats.record_step(config.k, accepted)
            return bench.RunResult([int(t) for t in tokens], stats)

        return run

    return engine_methods() + [bench.Method("yours", "my decoding loop, draft model", "ours", "chain", yours,
                                            draft_model=True)]


def lab01_methods(module: ModuleType, config: bench.BenchConfig) -> list[bench.Method]:
    """The engine's draft-model decoding with its own verification rule and with the student's `verify`."""

    def yours(context: bench.BenchContext) -> bench.Runner:
        run, rule = draft_runner(context), student_verify_chain(module.verify)

        def run_with_your_verify(ids: list[int], seed: int) -> bench.RunResult:
            with engine_verification(rule):
                return run(ids, seed)

        return run_with_your_verify

    return engine_methods() + [bench.Method("yours", "specdec_lab.generate, draft model, my verify", "ours",
                                            "chain", yours, draft_model=True)]


class HeadChainDrafter(Drafter):
    """A thin adapter that plugs a lab-trained EAGLE head into the engine: a greedy chain of `k` tokens.

    head: the lab's `EagleHead` ((feature, token) -> next feature, with `fuse` for several layers); lm_head:
    the target's output layer; layers: the target hidden states the head's first input fuses. At every step
    the head starts from the target's feature at the last verified position and the token that followed it
    (the engine hands over the accepted positions' hidden states), then rolls on its own predictions.
    """

    needs_hidden_states = True

    def __init__(self, head: torch.nn.Module, lm_head: torch.nn.Module, k: int, layers: tuple[int, ...] = (-1,)):
        self.head, self.lm_head, self.k, self.layers = head, lm_head, k, layers
        self.feature: torch.Tensor | None = None

    def start(self, state) -> None:
        self.commit(state, 0)

    def commit(self, state, accepted: int) -> None:
        rows = [state.hidden_states[i].reshape(-1, state.hidden_states[i].shape[-1])[-1] for i in self.layers]
        self.feature = self.head.fuse(torch.cat(rows, dim=-1))

    @torch.no_grad()
    def propose(self, state, max_tokens: int) -> Draft:
        feature, token, drafted = self.feature, state.tokens[-1], []
        for _ in range(min(self.k, max_tokens)):
            feature = self.head(feature, torch.tensor(token, device=state.device))
            token = int(self.lm_head(feature).argmax())
            drafted.append(token)
        return Draft(torch.tensor(drafted, dtype=torch.long, device=state.device))


def lab06_benchmark(module: ModuleType, settings: dict, folder: Path) -> dict:
    """The drafter-training lab: EAGLE heads trained by the student's `train_eagle` (and `train_eagle3` with
    and without the training-time test) drafting for the lab's own target in `specdec_lab.generate`, greedy,
    against an untrained head and plain decoding, on held-out sentences of the lab's language. The trained
    EAGLE-1 head and the target are also written for vLLM into `folder`/vllm (and run there with
    settings["vllm"]: see `lab06_vllm`)."""
    torch.manual_seed(0)
    prompts = [s[:6] for s in module.HELDOUT[: settings["prompts"]]]
    k, new_tokens = 4, min(settings["max_new_tokens"], module.target.config.max_position_embeddings - 16)
    heads: dict[str, tuple[torch.nn.Module, tuple[int, ...]]] = {"untrained head": (module.EagleHead(seed=0), (-1,))}
    trained = module.EagleHead(seed=0)
    module.train_eagle(trained, steps=200)
    heads["my trained EAGLE head"] = (trained, (-1,))
    if hasattr(module, "train_eagle3"):
        for ttt in (1, 3):
            head = module.EagleHead(inputs=len(module.FUSED_LAYERS), seed=0)
            module.train_eagle3(head, steps=150, ttt_steps=ttt)
            heads[f"my fused head, ttt_steps={ttt}"] = (head, tuple(module.FUSED_LAYERS))
    plain = [decode.generate(module.target, p, None, new_tokens, eos_token_id=-1).tokens for p in prompts]
    methods = {}
    for name, (head, layers) in heads.items():
        head.eval()
        stats, equal = DecodeStats(), 0
        for prompt, expected in zip(prompts, plain, strict=True):
            drafter = HeadChainDrafter(head, module.target.lm_head, k, layers)
            out = decode.generate(module.target, prompt, drafter, new_tokens, eos_token_id=-1)
            equal += out.tokens == expected
            for accepted in out.stats.accepted_per_step:
                stats.record_step(k, accepted)
            stats.target_forwards += out.stats.target_forwards
            stats.new_tokens += len(out.tokens)
        summary = stats.summary()
        methods[name] = {"outputs_equal_to_baseline": equal, "tau": round(stats.mean_accepted_tokens, 3),
                         "accepted_per_step": round(stats.accepted / max(1, len(stats.accepted_per_step)), 3),
                         "per_position_acceptance": summary["per_position_acceptance"]}
    in_vllm = lab06_vllm(module, trained, prompts, plain, new_tokens, k, folder / "vllm", settings)
    if "tau" in in_vllm:
        in_vllm["ours_tau"] = methods["my trained EAGLE head"]["tau"]
    return {"machine": bench.describe_machine(settings["threads"]),
            "settings": {"prompts": len(prompts), "max_new_tokens": new_tokens, "k": k, "temperature": 0,
                         "baseline": "plain greedy decoding of the lab's target"},
            "models": {"target": {"parameters": sum(p.numel() for p in module.target.parameters()),
                                  "what": "the lab's tiny Llama, rebuilt by its setup"}},
            "methods": methods, "vllm": in_vllm}


def lab_head_as_vllm_checkpoint(head: torch.nn.Module, config) -> tuple[dict, dict[str, torch.Tensor]]:
    """Lab 6's EAGLE-1 head as the checkpoint (config.json, state) of vLLM's `EagleLlamaForCausalLM`.

    head: the lab's `EagleHead` (fc over [feature ; embedding] without a bias, then an RMSNorm, a SwiGLU MLP
    and the residual; no attention); config: the lab target's config, whose shape vLLM gives the head's one
    decoder layer. The head becomes a zoo head in layout "vllm", converted by `vllm.eagle_checkpoint`; its
    attention weights are zeros: the output projection is zero, so attention adds exactly nothing at every
    position and vLLM computes the lab's head.
    """
    from specdec_lab import vllm

    weights = {name: w.detach().float() for name, w in head.state_dict().items()}
    expected = {"fc.weight", "norm.weight", "gate.weight", "up.weight", "down.weight"}
    if set(weights) != expected:
        raise ExportError(f"the trained EAGLE head has weights {sorted(weights)}; the lab's EAGLE-1 head has "
                          f"{sorted(expected)} (a fused EAGLE-3 head does not fit vLLM's `eagle` layout)")
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    width = hidden // heads
    state = {"fc.weight": weights["fc.weight"],
             "layer.post_attention_layernorm.weight": weights["norm.weight"],
             "layer.mlp.gate_proj.weight": weights["gate.weight"],
             "layer.mlp.up_proj.weight": weights["up.weight"],
             "layer.mlp.down_proj.weight": weights["down.weight"]}
    for name, rows, columns in (("q", heads * width, hidden), ("k", kv_heads * width, hidden),
                                ("v", kv_heads * width, hidden), ("o", hidden, heads * width)):
        state[f"layer.self_attn.{name}_proj.weight"] = weights["fc.weight"].new_zeros(rows, columns)
    return vllm.eagle_checkpoint(state, {"layout": "vllm", "hidden_size": hidden, "feature_layers": [-1]},
                                 config.to_dict())


def lab06_vllm(module: ModuleType, head: torch.nn.Module, prompts: list[list[int]], plain: list[list[int]],
               new_tokens: int, k: int, folder: Path, settings: dict) -> dict:
    """Write the lab's target (`folder`/target) and the student's trained EAGLE-1 head in the checkpoint layout
    of vLLM's `eagle` method (`folder`/eagle); with settings["vllm"], decode the prompts in vLLM with them
    (greedy, chains of k, token ids only: the lab has no tokenizer). Returns what was written and, after a run,
    vLLM's tau and how many outputs equal `plain` (our plain greedy decoding), or why it did not run."""
    from specdec_lab import vllm

    module.target.save_pretrained(folder / "target")
    vllm.write_checkpoint(folder / "eagle", *lab_head_as_vllm_checkpoint(head, module.target.config))
    done: dict = {"target": "vllm/target", "eagle": "vllm/eagle", "k": k}
    if not settings.get("vllm"):
        done["not_run"] = "not asked (specdec export --vllm runs it)"
        return done
    reason = vllm.missing()
    if reason:
        done["not_run"] = reason
        return done
    spec = {"method": "eagle", "model": str(folder / "eagle"), "num_speculative_tokens": k}
    with vllm.VllmEngine(folder / "target", None, spec, threads=settings["threads"], max_num_seqs=len(prompts),
                         max_model_len=module.target.config.max_position_embeddings) as engine:
        theirs = engine.generate(prompts, new_tokens)
    equal = sum(a == b for a, b in zip(theirs.outputs, plain, strict=True))
    return done | {"version": engine.version, "tau": round(theirs.tau, 3), "outputs_equal_to_ours": equal}


def lab06_readme(extracted: Extracted, lab: LabBenchmark, result: dict, command: str) -> str:
    """The drafter-training artifact's README: the heads the student's code trained, measured in the engine."""
    functions = "\n".join(f"- `{name}`: {doc}" for name, doc in extracted.functions.items())
    settings = result["settings"]
    rows = "\n".join(f"| {name} | {m['outputs_equal_to_baseline']} of {settings['prompts']} | {m['tau']:.2f} | "
                     f"{m['accepted_per_step']:.2f} | {', '.join(f'{a:.2f}' for a in m['per_position_acceptance'])} |"
                     for name, m in result["methods"].items())
    return f"""# {extracted.title}: my implementation, measured

This folder is the project artifact of `{extracted.lab}`: the functions I wrote in the lab, extracted into
an importable module, and the drafters they train, plugged into a real speculative decoding engine.

## What I built

`{extracted.lab}.py` defines:

{functions}

## What was measured

{lab.what}. {settings['prompts']} held-out prompts, {settings['max_new_tokens']} new tokens each, greedy
(temperature 0), k = {settings['k']} drafted tokens per target forward, on {result['machine']['cpu']}.
"= plain" counts prompts whose output equals plain greedy decoding token for token (it must be all of them:
the drafter changes the speed, never the text); tau counts the tokens emitted per target forward.

| drafter | = plain | tau | accepted per step | acceptance at depth 1..{settings['k']} |
|---|---|---|---|---|
{rows}

`benchmark.json` holds the raw numbers.

{lab06_vllm_section(result["vllm"], settings["prompts"])}

## Reproduce

```
{command}
```
"""


def lab06_vllm_section(in_vllm: dict, prompts: int) -> str:
    """The README's part on vLLM: where the files are, how to load them, and the run's figures if it ran."""
    measured = (f"vLLM {in_vllm['version']} ran them on the same prompts (greedy, token ids): tau "
                f"{in_vllm['tau']:.2f} against {in_vllm['ours_tau']:.2f} in `specdec_lab.generate`; its output "
                f"equalled plain greedy decoding on {in_vllm['outputs_equal_to_ours']} of {prompts} prompts."
                if "tau" in in_vllm else f"Not run in vLLM here: {in_vllm['not_run']}.")
    return f"""## My EAGLE head in vLLM

`vllm/target/` is the lab's target and `vllm/eagle/` my trained EAGLE-1 head in the checkpoint layout of
vLLM's `eagle` method (`EagleLlamaForCausalLM`: `fc` over [embedding ; feature], one decoder layer whose
attention weights are zero, since the lab's head has none). Load them with token ids (the lab has no
tokenizer; vLLM on a CPU needs an attention head width it has kernels for, which is why the lab's target has
one head of width 32):

```python
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model="vllm/target", skip_tokenizer_init=True, dtype="float32", max_model_len=64,
          speculative_config={{"method": "eagle", "model": "vllm/eagle", "num_speculative_tokens": {in_vllm['k']}}})
llm.generate([TokensPrompt(prompt_token_ids=[1, 5, 6])], SamplingParams(temperature=0, max_tokens=16, detokenize=False))
```

{measured}"""


class StudentLookupDrafter(PromptLookupDrafter):
    """The engine's prompt-lookup drafter with the student's `prompt_lookup(tokens, max_ngram, k)` inside.

    lookup: their function (the context as a list of ids, the longest n-gram, the most tokens to draft) ->
    the drafted ids; max_ngram / k: as for `PromptLookupDrafter`.
    """

    def __init__(self, lookup: Callable, max_ngram: int, k: int):
        super().__init__(max_ngram=max_ngram, k=k)
        self.lookup = lookup

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        k = min(self.k, max_tokens)
        tokens = [int(t) for t in self.lookup(list(state.tokens), self.max_ngram, k)]
        if len(tokens) > k:
            raise ExportError(f"your prompt_lookup returned {len(tokens)} tokens when asked for at most {k}")
        return Draft(torch.tensor(tokens, dtype=torch.long, device=state.device), probs=None)


def lab05_methods(module: ModuleType, config: bench.BenchConfig) -> list[bench.Method]:
    """Plain decoding, the engine's prompt-lookup drafter, and the same drafter with the student's lookup (both
    draft at most the benchmark's k tokens per step, so the README's k is theirs)."""
    ngram, k = config.lookup_ngram, config.k
    return [
        bench.Method("plain", "specdec_lab.generate, autoregressive", "ours", "autoregressive",
                     lambda c: bench.ours_runner(c, None)),
        bench.Method("reference", "specdec_lab.generate, prompt lookup", "ours", "lookup",
                     lambda c: bench.ours_runner(c, PromptLookupDrafter(max_ngram=ngram, k=k))),
        bench.Method("yours", "specdec_lab.generate, my prompt lookup", "ours", "lookup",
                     lambda c: bench.ours_runner(c, StudentLookupDrafter(module.prompt_lookup, ngram, k))),
    ]


# Lab 3's tree: every node's children are the head's candidates of ranks 0, 1, ... (no rank skipped), so the
# children of a slot are draws without replacement from ONE distribution q (the head's), the setting of the
# lab's `verify_tree_sampling`. (rank choices as in `specdec_lab.tree.sparse_tree`)
LAB03_TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0)]


def lab03_drafter(pair: ModelPair) -> MedusaDrafter:
    """Medusa heads drafting LAB03_TREE: the zoo's heads when they fit the target, otherwise untrained heads
    (zero-initialised, each one a copy of the target's next-token head, as Medusa training starts)."""
    weights = next(pair.target.parameters())
    hidden = pair.target.config.hidden_size
    try:
        heads = MedusaHeads.load(zoo_path() / "medusa", weights.device, weights.dtype)
    except (FileNotFoundError, OSError, KeyError, RuntimeError):
        heads = None
    if heads is None or heads.hidden_size != hidden:
        heads = MedusaHeads(hidden, 4).to(device=weights.device, dtype=weights.dtype).eval()
    return MedusaDrafter(heads, tree=[c for c in LAB03_TREE if len(c) <= heads.num_heads])


def slot_draft_probs(tree: DraftTree, node_probs: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """(n + 1, V) the distribution each slot's children were drawn from, the lab's `q` (root first).

    node_probs: the engine's per-node q given the earlier siblings (`Draft.probs`); the first child of a slot
    was drawn from the slot's q itself. Leaves have no children: their row is uniform and never read.
    """
    if node_probs is None:
        raise ExportError("the benchmark's tree drafter gave no draft distributions to verify under sampling")
    rows = torch.full((len(tree) + 1, vocab), 1.0 / vocab, device=node_probs.device)
    for slot, children in enumerate(tree.children()):
        if children:
            rows[slot] = node_probs[children[0]]
    return rows


@contextlib.contextmanager
def engine_tree_rules(module: ModuleType) -> Iterator[None]:
    """Run the engine's tree step with the student's lab 3 code, then put the engine's back.

    The engine feeds [root] + the tree's nodes with the root not yet cached; the lab's functions take a tree
    below a cached root, so the root slot becomes node 0 of the student's tree (a child of the cached
    context) and node i becomes node i + 1. Their `tree_position_ids`, `tree_attention_mask` and `tree_mask_4d`
    build the forward's inputs; their `verify_tree` (greedy) or `verify_tree_sampling` decides.
    """
    from specdec_lab import forward

    originals = decode.tree_inputs, forward.additive_mask_over, decode.verify_tree
    current: dict[str, list[int]] = {}

    def tree_inputs(tree: DraftTree, draft, root: int, past: int):
        parents = [-1] + [parent + 1 for parent in tree.parents.tolist()]
        current["parents"] = parents
        feed = torch.cat([tree.tokens.new_tensor([root]), tree.tokens])
        positions = torch.as_tensor(module.tree_position_ids(parents, past), device=feed.device).reshape(1, -1)
        return feed, positions, torch.as_tensor(module.tree_attention_mask(parents), device=feed.device)

    def additive_mask(visible: torch.Tensor, past: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        # the export runs on the growing cache, whose mask is exactly past + fed tokens wide
        return torch.as_tensor(module.tree_mask_4d(current["parents"], past, dtype), device=visible.device)

    def verify_tree(tree: DraftTree, draft, logits: torch.Tensor, sampling, generator) -> TreeVerdict:
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        if sampling.greedy:
            best = logits.argmax(-1).tolist()
            path, token = module.verify_tree(tokens, parents, best[1:], best[0])
        else:
            p = process_logits(logits, sampling)
            q = slot_draft_probs(tree, draft.probs, p.shape[-1])
            path, token = module.verify_tree_sampling(tokens, parents, p, q, generator)
        path = [int(node) for node in path]
        if [parents[node] for node in path] != ([-1] + path)[: len(path)]:
            raise ExportError(f"your tree verification returned the path {path} for the parents {parents}: it "
                              "must be a path down from the root (each node a child of the one before)")
        last = path[-1] + 1 if path else 0
        return TreeVerdict(len(path), int(token), bool(tree.children()[last]), path)

    decode.tree_inputs, forward.additive_mask_over, decode.verify_tree = tree_inputs, additive_mask, verify_tree
    try:
        yield
    finally:
        decode.tree_inputs, forward.additive_mask_over, decode.verify_tree = originals


def lab03_methods(module: ModuleType, config: bench.BenchConfig) -> list[bench.Method]:
    """Plain decoding, the engine's Medusa tree decoding, and the same with the student's tree code inside."""

    def reference(context: bench.BenchContext) -> bench.Runner:
        return bench.ours_runner(context, lab03_drafter(context.pair))

    def yours(context: bench.BenchContext) -> bench.Runner:
        run = bench.ours_runner(context, lab03_drafter(context.pair))

        def run_with_your_tree_code(ids: list[int], seed: int) -> bench.RunResult:
            with engine_tree_rules(module):
                return run(ids, seed)

        return run_with_your_tree_code

    return [
        bench.Method("plain", "specdec_lab.generate, autoregressive", "ours", "autoregressive",
                     lambda c: bench.ours_runner(c, None)),
        bench.Method("reference", "specdec_lab.generate, Medusa tree", "ours", "tree", reference),
        bench.Method("yours", "specdec_lab.generate, Medusa tree, my mask, positions and verification", "ours",
                     "tree", yours),
    ]


# Lab 4's tree settings, the same for the engine's EAGLE-2 drafter and the student's `dynamic_tree`.
EAGLE_TREE = {"depth": 4, "top_k": 4}


def eagle_head_for(target: torch.nn.Module) -> tuple[EagleHead, str]:
    """The zoo's trained EAGLE head when it fits `target`, else an untrained stand-in built from the target itself
    (its decoder layer and norm copy the target's last ones, `fc` passes the token embedding through with a small
    seeded share of the feature: self-speculation on the target's own last layer, not the head lab 4 trains, which
    fits only the lab's tiny target). Returns the head and a phrase saying which it is."""
    try:
        return EagleHead.load(zoo_path() / "eagle", target), "the zoo's trained EAGLE head"
    except (FileNotFoundError, ValueError, RuntimeError):
        pass
    head = EagleHead(EagleConfig.from_target(target)).attach(target).eval()
    head.init_from_target_layer(target)
    hidden = head.config.hidden_size
    # Seeded on the host so every device gets the same head, then moved next to the weights.
    mixing = 0.005 * torch.randn(hidden, hidden, generator=torch.Generator(device="cpu").manual_seed(1),
                                 device="cpu") / hidden ** 0.5
    with torch.no_grad():
        identity = torch.eye(hidden, device="cpu")
        head.fc.weight.copy_(torch.cat([mixing, identity], dim=1).to(head.fc.weight))
        head.fc.bias.zero_()
    return head, "an untrained stand-in built from the target's own last layer (no zoo head fits it)"


class StudentEagleDrafter(Drafter):
    """The student's lab-4 `dynamic_tree` (with their `head_forward` inside) as an engine drafter.

    It keeps the target's features of every verified position (the engine hands over those of the newly
    accepted ones after each step) and asks the student's code for a tree after the whole context. Their tree
    is a function of the context alone, so it is verified as point masses (probs=None), lossless when sampling
    as for the engine's own EAGLE-2 trees.
    """

    needs_hidden_states = True

    def __init__(self, module: ModuleType, head: EagleHead, budget: int):
        self.module, self.head, self.budget = module, head, budget
        self.features: torch.Tensor | None = None

    def start(self, state: DecodeState) -> None:
        self.features = self.head.fuse_features(state.hidden_states)

    def commit(self, state: DecodeState, accepted: int) -> None:
        self.features = torch.cat([self.features, self.head.fuse_features(state.hidden_states)])

    def propose(self, state: DecodeState, max_tokens: int) -> Draft:
        depth = min(EAGLE_TREE["depth"], max_tokens)
        with torch.no_grad():
            tokens, parents = self.module.dynamic_tree(self.head, self.features, list(state.tokens), depth,
                                                       EAGLE_TREE["top_k"], self.budget)
        tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
        if not tokens or len(parents) != len(tokens) or any(not -1 <= p < i for i, p in enumerate(parents)):
            raise ExportError(f"your dynamic_tree returned tokens {tokens[:20]} with parents {parents[:20]}: it "
                              "must return as many parents as tokens, each -1 or an earlier node")
        return Draft(torch.tensor(tokens, device=state.device), None,
                     parents=torch.tensor(parents, device=state.device))


def lab04_methods(module: ModuleType, config: bench.BenchConfig) -> list[bench.Method]:
    """The engine's EAGLE-2 drafter against the student's `dynamic_tree` and `head_forward`, same head and tree
    settings (the engine ranks nodes at temperature 1, EAGLE-2's own ranking, as the lab does)."""
    heads: dict[int, tuple[EagleHead, str]] = {}

    def head_of(context: bench.BenchContext) -> EagleHead:
        key = id(context.pair.target)
        if key not in heads:
            heads[key] = eagle_head_for(context.pair.target)
        return heads[key][0]

    def reference(context: bench.BenchContext) -> bench.Runner:
        drafter = EagleDrafter(head_of(context), mode="tree", total_tokens=config.tree_tokens, rank_temperature=1.0,
                               **EAGLE_TREE)
        return bench.ours_runner(context, drafter)

    def yours(context: bench.BenchContext) -> bench.Runner:
        # Their `embed` and `logits_of` read the module global `target`: point it at the benchmark's target.
        module.target = context.pair.target
        return bench.ours_runner(context, StudentEagleDrafter(module, head_of(context), config.tree_tokens))

    return [
        bench.Method("plain", "specdec_lab.generate, autoregressive", "ours", "autoregressive",
                     lambda c: bench.ours_runner(c, None)),
        bench.Method("reference", "specdec_lab.generate, EAGLE-2 tree", "ours", "tree", reference),
        bench.Method("yours", "specdec_lab.generate, my EAGLE-2 tree and head forward", "ours", "tree", yours),
    ]

LAB_BENCHMARKS = [
    LabBenchmark(("head_forward", "eagle_chain", "dynamic_tree"), "my EAGLE-2 tree",
                 "my `dynamic_tree` (with my `head_forward` inside) drafts EAGLE-2 trees from the zoo's trained EAGLE "
                 "head (or, for a target the zoo head does not fit, an untrained stand-in built from its own last "
                 "layer) in `specdec_lab.generate`, against the engine's own EAGLE-2 drafter with the same head, depth "
                 f"{EAGLE_TREE['depth']}, top-k {EAGLE_TREE['top_k']} and verification budget", lab04_methods),
    LabBenchmark(("train_eagle", "eagle_loss", "eagle_pairs"), "my EAGLE head",
                 "my `train_eagle` (and `train_eagle3`) train EAGLE heads on the lab's target; each head drafts "
                 "through a thin adapter (`HeadChainDrafter`) in `specdec_lab.generate`, against an untrained head",
                 own=lab06_benchmark),
    LabBenchmark(("prompt_lookup",), "my prompt lookup",
                 "my `prompt_lookup` (longest suffix first, most recent earlier occurrence) drafts inside "
                 "`specdec_lab.generate` in place of the engine's own n-gram search, against the engine's "
                 "`PromptLookupDrafter` with the same longest n-gram and draft length (no draft model drafts)",
                 lab05_methods),
    LabBenchmark(("tree_attention_mask", "tree_position_ids", "tree_mask_4d", "verify_tree", "verify_tree_sampling"),
                 "my tree code",
                 "my tree code (`tree_position_ids`, `tree_attention_mask` and `tree_mask_4d` build the target's "
                 "one forward over a Medusa tree of 11 candidates; `verify_tree` at temperature 0 and "
                 "`verify_tree_sampling` at temperature 1 decide what is kept) replaces the engine's own in "
                 "`specdec_lab.generate`, against the engine's Medusa tree decoding with the same heads and tree",
                 lab03_methods),
    LabBenchmark(("generate", "speculative_step"), "my loop",
                 "my loop (`generate` driving `speculative_step`: draft, one target forward, roll back both caches) "
                 "runs on the benchmark's target and draft models, against `specdec_lab.generate` with the same "
                 "draft model and k", lab02_methods),
    LabBenchmark(("verify",), "my verify",
                 "my `verify` (accept/reject with the residual and the bonus token) replaces the engine's chain "
                 "verification rule in `specdec_lab.generate`, drafting with the draft model", lab01_methods),
]


def find_benchmark(functions: dict[str, str]) -> LabBenchmark:
    """The benchmark of the lab whose solution functions these are (ExportError when no lab matches)."""
    for candidate in LAB_BENCHMARKS:
        if all(name in functions for name in candidate.needs):
            return candidate
    known = "; ".join(", ".join(b.needs) for b in LAB_BENCHMARKS)
    raise ExportError(f"no benchmark knows these solution functions ({', '.join(functions)}); export supports "
                      f"the labs whose solutions define: {known}")


def run_lab_benchmark(module: ModuleType, lab: LabBenchmark, pair: ModelPair, settings: dict) -> dict:
    """The lab's methods at temperature 0 and 1 on held-out prompts, as one report dict (see report.py)."""
    sets, costs = {}, None
    for temperature in (0.0, 1.0):
        config = bench.BenchConfig(temperature=temperature, progress=False, **settings)
        context = bench.BenchContext(pair, config, decode.default_eos(pair.target))
        methods = lab.methods(module, config)
        runners = {m.name: m.build(context) for m in methods}
        prompts = bench.corpus_prompts("heldout", pair.tokenizer, config.prompts, 400)
        costs = costs or bench.forward_costs(pair, prompts[0].ids, config.k)
        try:
            records = bench.time_methods(context, runners, prompts, methods, NoProgress())
        except ExportError:
            raise
        except Exception as error:  # the student's code failed inside the engine
            raise ExportError(f"your code failed inside the engine at temperature {temperature:g}: "
                              f"{type(error).__name__}: {error}") from None
        sets[f"temperature {temperature:g}"] = bench.summarise_set(records, prompts, config, costs,
                                                                   baseline=methods[0].name)
    return {"machine": bench.describe_machine(settings["threads"]),
            "settings": bench.settings_dict(config) | {"temperature": "0 and 1", "baseline": methods[0].name},
            "models": {"target": bench.model_card(pair.target, "target"),
                       "draft": bench.model_card(pair.draft, "draft")},
            "costs": costs, "sets": sets, "skipped": {}}


class NoProgress:
    """A stand-in for a tqdm bar (the export prints one line per stage instead)."""

    def update(self, count: int) -> None:
        pass


# ----------------------------------------------------------------------------------------------- writing


def readme(extracted: Extracted, lab: LabBenchmark, result: dict, command: str) -> str:
    """The artifact's README: what the student built, how it was measured, what came out."""
    greedy, sampled = result["sets"]["temperature 0"], result["sets"]["temperature 1"]
    yours0, ref0 = greedy["methods"]["yours"], greedy["methods"]["reference"]
    yours1, ref1 = sampled["methods"]["yours"], sampled["methods"]["reference"]
    functions = "\n".join(f"- `{name}`: {doc}" for name, doc in extracted.functions.items())
    machine, models = result["machine"], result["models"]
    where = ("the zoo pair shipped with `specdec_lab`, trained on Python source" if models["target"]["zoo"]
             else f"`{models['target']['path']}` and `{models['draft']['path']}`")
    speed_ratio = yours1["tokens_per_second"] / ref1["tokens_per_second"]
    return f"""# {extracted.title}: my implementation, measured

This folder is the project artifact of `{extracted.lab}`: the functions I wrote in the lab, extracted into
an importable module, plugged into a real speculative decoding engine and measured against the reference.

## What I built

`{extracted.lab}.py` defines:

{functions}

Use it like any module: `from {extracted.lab} import {", ".join(lab.needs)}`.

## What was measured

In the benchmark, {lab.what}. The target ({models['target']['parameters'] / 1e6:.1f}M parameters) and the
draft ({models['draft']['parameters'] / 1e6:.2f}M) are {where}, on
{greedy['prompts']} held-out prompts (function signatures and docstrings the models never saw),
{result['settings']['max_new_tokens']} new tokens each, k = {result['settings']['k']} drafted tokens per step,
median of {result['settings']['repeats']} repeats, on {machine['cpu']} with {machine['torch_threads']} threads.

- **Correctness at temperature 0**: greedy speculative decoding must reproduce plain greedy decoding token
  for token. With {lab.subject} it did on {yours0['outputs_equal_to_baseline']} of {greedy['prompts']} prompts
  (the reference: {ref0['outputs_equal_to_baseline']} of {greedy['prompts']}).
- **Sampling at temperature 1**: with {lab.subject}, {yours1['tau']:.2f} tokens per target forward (tau)
  against {ref1['tau']:.2f} for the reference; acceptance rate {fmt(yours1['acceptance_rate'])} vs
  {fmt(ref1['acceptance_rate'])} (different random draws, so small differences are noise).
- **Speed** at temperature 1: {yours1['tokens_per_second']:.1f} tokens/s with {lab.subject} vs
  {ref1['tokens_per_second']:.1f} with the reference ({speed_ratio:.2f}x); {yours1['speedup']:.2f}x plain decoding.

### Temperature 0

{report.markdown_table(result, "temperature 0")}

### Temperature 1

{report.markdown_table(result, "temperature 1")}

`report.html` shows the same figures as charts (open it in a browser; it works offline) and
`benchmark.json` holds the raw numbers. Speedups are relative to plain autoregressive decoding of the same
target in the same run.

## Reproduce

```
{command}
```
"""


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ready(notebook: str | os.PathLike) -> tuple[Extracted, LabBenchmark]:
    """The checks `export` makes before it benchmarks: the notebook is a finished lab, its extracted module
    imports, and a benchmark knows its functions. Raises ExportError saying what is missing; lesson 8 calls it,
    so "ready" means `specdec export` will run."""
    extracted = extract(Path(notebook))
    with tempfile.TemporaryDirectory(prefix="specdec-ready-") as tmp:
        module_path = Path(tmp) / f"{extracted.lab}.py"
        module_path.write_text(extracted.source, encoding="utf-8")
        import_module_from(module_path, f"_specdec_ready_{extracted.lab}")
    return extracted, find_benchmark(extracted.functions)


def export(notebook: str | os.PathLike, out: str | os.PathLike, pair: ModelPair | None = None,
           target: str | None = None, draft: str | None = None, prompts: int = 5, max_new_tokens: int = 32,
           repeats: int = 2, threads: int = 2, force: bool = False, vllm: bool = False,
           log: Callable[[str], None] = print) -> Path:
    """Build the artifact folder `out` from a completed lab `notebook`; return its path.

    pair / target / draft: the models to benchmark on (default: the zoo pair); prompts, max_new_tokens,
    repeats, threads: benchmark size; force: replace an existing `out`; vllm: also run the exported head in
    vLLM (the drafter-training lab; needs `make production`); log: where progress lines go.
    Raises ExportError (and writes nothing) when the notebook is unfinished, corrupt or not a lab.
    """
    notebook, out = Path(notebook), Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists; choose another folder or pass --force to replace it")
    extracted = extract(notebook)
    log(f"extracted {', '.join(extracted.functions)} from {notebook.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        module_path = staging / f"{extracted.lab}.py"
        module_path.write_text(extracted.source, encoding="utf-8")
        module = import_module_from(module_path, f"_specdec_export_{extracted.lab}")
        lab = find_benchmark(extracted.functions)
        torch.set_num_threads(threads)
        settings = dict(prompts=prompts, max_new_tokens=max_new_tokens, repeats=repeats, threads=threads)
        command = (f"specdec export {notebook} --out {out} --prompts {prompts} --max-new-tokens {max_new_tokens} "
                   f"--repeats {repeats} --threads {threads}" + " --vllm" * vllm)
        if lab.own is not None:
            log("training drafters with your code and measuring them in the engine")
            try:
                result = lab.own(module, settings | {"vllm": vllm}, staging)
            except Exception as error:  # the student's code failed while training or drafting
                raise ExportError(f"your code failed in the benchmark: {type(error).__name__}: {error}") from None
            report.write_json(result, staging / "benchmark.json")
            (staging / "README.md").write_text(lab06_readme(extracted, lab, result, command), encoding="utf-8")
            os.chmod(staging, 0o755)
            replace_folder(staging, out)
            log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
            return out
        pair = pair or load_pair(target=target, draft=draft)
        if pair.draft is None:
            raise ExportError("the benchmark needs a draft model (the zoo draft, or --draft PATH)")
        log(f"benchmarking against the reference ({prompts} prompts x {max_new_tokens} tokens, {repeats} repeats)")
        result = run_lab_benchmark(module, lab, pair, settings)
        for role, path in (("target", target), ("draft", draft)):
            result["models"][role] |= {"path": path or str(zoo_path() / role), "zoo": path is None}
        report.write_json(result, staging / "benchmark.json")
        report.write_html(result, staging / "report.html", title=f"{extracted.title}: my implementation",
                          intro=f"<p>{lab.what.replace('`', '')}.</p>")
        (staging / "README.md").write_text(readme(extracted, lab, result, command), encoding="utf-8")
        os.chmod(staging, 0o755)
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return out


def replace_folder(new: Path, destination: Path) -> None:
    """Move the finished folder `new` to `destination`, replacing an existing one only once `new` is complete."""
    if not destination.exists():
        os.rename(new, destination)
        return
    retired = destination.with_name(f".{destination.name}.old-{os.getpid()}")
    os.rename(destination, retired)
    os.rename(new, destination)
    shutil.rmtree(retired, ignore_errors=True)
