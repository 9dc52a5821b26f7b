"""Simulated submissions for every lab, generated from the solution notebooks (nothing is stored by hand).

For each lab: the solution, the blank release, one submission per classic mistake (the solution with one
edit), and adversarial submissions that try to earn points without the work or to break the grader. Each
fixture says which test cells it must lose (`lost`); the end-to-end tests grade them all through nbgrader
and compare. `python -m autograder fixtures LAB DEST` writes them out for inspection.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import fixture_sources as sources
from autograder.gradebook import SOLUTIONS

SOLUTION_REGION = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", re.M)


@dataclass
class Mistake:
    """The solution with `old` replaced by `new` in the solution cell `cell`; it must lose exactly `lost`."""

    cell: str
    old: str
    new: str
    lost: set[str]


@dataclass
class Variant:
    """The solution with several cells changed; it must lose exactly `lost`. functions: cell -> a definition that
    replaces the function of the same name in that solution cell (the rest of the cell, such as the code that
    trains the notebook's own head, is kept); after: cell -> a scratch cell inserted right after that cell."""

    lost: set[str]
    kind: str = "attack"
    functions: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)


def replace_function(source: str, definition: str) -> str:
    """`source` with its top-level function named as the one in `definition` replaced by `definition`."""
    name = ast.parse(definition).body[0].name
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    lines = source.splitlines(keepends=True)
    return "".join(lines[:start]) + definition + "".join(lines[node.end_lineno:])


@dataclass
class LabFixtures:
    """What the fixtures of one lab need to know (`honest`: alternative correct answers,
    cell -> source; None for the lab's built-in rewrite of the solution).

    target_cell: the solution cell the adversarial fixtures attack; target_tests: the test cells that fail when
    that cell defines nothing; reference_import: a cell that imports the course's own implementation instead
    of writing it; mistakes: the classic mistakes of this lab; blank_answers: name -> {cell: source}, a blank
    notebook with only those cells answered, by code that skips the method (it must earn nothing); variants:
    name -> Variant, the solution with several cells changed (each states exactly what it loses).
    """

    target_cell: str
    target_tests: set[str]
    reference_import: str
    mistakes: dict[str, Mistake] = field(default_factory=dict)
    honest: dict[str, str | None] = field(default_factory=dict)
    blank_answers: dict[str, dict[str, str]] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)


@dataclass
class Fixture:
    """One simulated submission: `notebook` (None for a file that is not a notebook, see `raw`), and the test
    cells it must lose (`lost`; None means every test). `exact`: the lost set is exact, not an upper bound on
    what it may earn (adversarial fixtures that can also disturb later cells only promise no unearned points).
    `kind`: "honest" (must lose only `lost`), "mistake" (a classic mistake) or "attack"."""

    name: str
    notebook: nbformat.NotebookNode | None
    lost: set[str] | None
    exact: bool = True
    raw: bytes | None = None
    kind: str = "mistake"


def solution_notebook(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(SOLUTIONS / lab / f"{lab}.ipynb", as_version=4)


def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def is_test(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def test_ids(lab: str) -> set[str]:
    """Every test cell of `lab` (visible and hidden)."""
    return {grade_id(c) for c in solution_notebook(lab).cells if is_test(c)}


def solved(release: nbformat.NotebookNode, lab: str, overrides: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The release notebook with every solution cell filled in as the solution does (or from `overrides`)."""
    answers = {grade_id(c): SOLUTION_REGION.sub("", c.source) for c in solution_notebook(lab).cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    answers.update(overrides or {})
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        if grade_id(cell) in answers and cell.metadata["nbgrader"].get("solution"):
            cell.source = answers[grade_id(cell)]
    return nb


def solution_source(lab: str, cell: str) -> str:
    return next(SOLUTION_REGION.sub("", c.source) for c in solution_notebook(lab).cells if grade_id(c) == cell)


def fixtures(lab: str, release: nbformat.NotebookNode) -> list[Fixture]:
    """All simulated submissions of `lab`, built from its solution and its `release` notebook."""
    spec = LABS[lab]
    every = test_ids(lab)
    target = spec.target_cell
    target_source = solution_source(lab, target)
    blank_stub = "# YOUR CODE HERE\nraise NotImplementedError()"
    out = [Fixture("solution", solved(release, lab), set(), kind="honest"),
           Fixture("blank", nbformat.from_dict(release), None)]
    for name, mistake in spec.mistakes.items():
        source = solution_source(lab, mistake.cell)
        if mistake.old not in source:
            raise ValueError(f"{lab} mistake {name}: {mistake.old!r} is not in the solution of {mistake.cell}")
        out.append(Fixture(name, solved(release, lab, {mistake.cell: source.replace(mistake.old, mistake.new)}),
                           mistake.lost))
    for name, cells in spec.blank_answers.items():  # nothing implemented; a few answers made up from the inputs
        shortcut = nbformat.from_dict(release)
        for cell in shortcut.cells:
            if grade_id(cell) in cells and cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = cells[grade_id(cell)]
        out.append(Fixture(name, shortcut, None, kind="attack"))
    for name, variant in spec.variants.items():
        changed = solved(release, lab, {cell: replace_function(solution_source(lab, cell), definition)
                                        for cell, definition in variant.functions.items()})
        for cell, scratch in variant.after.items():
            at = next(i for i, c in enumerate(changed.cells) if grade_id(c) == cell)
            changed.cells.insert(at + 1, nbformat.v4.new_code_cell(scratch))
        out.append(Fixture(name, changed, variant.lost, kind=variant.kind))

    def attack(name: str, source: str, lost: set[str] | None = None, exact: bool = True) -> None:
        out.append(Fixture(name, solved(release, lab, {target: source}),
                           spec.target_tests if lost is None else lost, exact, kind="attack"))

    def honest(name: str, notebook: nbformat.NotebookNode, lost: set[str] | None = None) -> None:
        out.append(Fixture(name, notebook, lost or set(), kind="honest"))

    # The kernel's own defences: a loop, exits, a flood, a memory bomb, a fork bomb.
    attack("infinite_loop", "while True:\n    pass\n" + target_source)
    attack("sys_exit", "import sys\nsys.exit(1)\n" + target_source)
    attack("raise_system_exit", "raise SystemExit(0)\n" + target_source)
    attack("os_exit", "import os\nos._exit(1)\n" + target_source, lost=every, exact=False)
    attack("stdout_flood", "for _ in range(200_000):\n    print('flood ' * 20)\n" + target_source, lost=set())
    attack("memory_bomb", "hoard = []\nwhile True:\n    hoard.append(torch.ones(1 << 26))\n" + target_source,
           exact=False)
    attack("fork_bomb", sources.FORK_BOMB + target_source, exact=False)
    # Earning points without the work: the reference, the solutions on disk, the checker, lying objects.
    attack("imports_reference", spec.reference_import)
    attack("reads_solutions", sources.READ_SOLUTIONS.format(lab=lab, name=target))
    attack("interpreter_tricks", sources.INTERPRETER_TRICKS + blank_stub)
    attack("patches_probes", sources.PATCH_PROBES + blank_stub, exact=False)  # it garbles its other answers too
    attack("monkeypatch_module", "torch.allclose = lambda *args, **kwargs: True\n"
                                 "torch.equal = lambda *args, **kwargs: True\n" + blank_stub)
    attack("lying_objects", sources.LIAR + f"\n\ndef {target}(*args, **kwargs):\n    return Liar()\n",
           exact=False)  # later exercises that call the lying function fail too
    attack("writes_gradebook", sources.WRITE_GRADEBOOK + blank_stub)
    attack("kills_grader", sources.KILL_GRADER + blank_stub, lost=every, exact=False)
    attack("forges_channel", sources.FORGE_CHANNEL + blank_stub, exact=False)  # it may spoil its other answers
    attack("cpu_hogs", sources.CPU_HOGS + target_source, lost=set(), exact=False)  # its own cells slow down
    attack("disk_filler", sources.DISK_FILLER + target_source, lost=set(), exact=False)
    attack("huge_shape", sources.HUGE_SHAPE.format(name=target))
    # Broken files and edited lab cells.
    deleted = solved(release, lab, {target: blank_stub})
    deleted.cells = [c for c in deleted.cells if not is_test(c)]
    out.append(Fixture("deleted_tests", deleted, spec.target_tests))
    edited = solved(release, lab, {target: blank_stub})
    for cell in edited.cells:
        if is_test(cell):
            cell.source = "pass"
            cell.metadata["nbgrader"]["points"] = 100
    out.append(Fixture("edited_tests", edited, spec.target_tests))
    out.append(Fixture("corrupt_file", None, None, raw=b'{"cells": [{"cell_type": "code", "sour'))
    newer = nbformat.writes(solved(release, lab))
    newer = newer.replace('"nbformat_minor": 5', '"nbformat_minor": 99', 1).replace(
        '"cell_type": "code",', '"cell_type": "code", "x-future-field": {"a": 1},', 1)
    out.append(Fixture("newer_schema", None, set(), raw=newer.encode(), kind="honest"))
    # Honest habits that must grade as correct work.
    habits = solved(release, lab)
    for cell in habits.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = "from __future__ import annotations\n\n" + cell.source
    honest("future_import", habits)
    scratch = solved(release, lab)
    anchor = next(i for i, c in enumerate(scratch.cells) if grade_id(c) == target)
    scratch.cells.insert(anchor + 1, nbformat.v4.new_code_cell(sources.SCRATCH))
    honest("scratch_cells", scratch)
    pasted = solved(release, lab)
    foreign = nbformat.v4.new_code_cell("def helper_from_another_lab(x):\n    return x\n", metadata={
        "nbgrader": {"grade_id": "medusa_tree_other_lab", "solution": True, "grade": False, "locked": False,
                     "schema_version": 3}})
    pasted.cells.insert(anchor + 1, foreign)
    honest("pasted_helper_cell", pasted)
    changed = solved(release, lab)
    for cell in changed.cells:
        if grade_id(cell) == target:
            cell.metadata = {"tags": ["mine"], "nbgrader": {"grade_id": target, "solution": True, "locked": True,
                                                            "schema_version": 1}}
    honest("changed_metadata", changed)
    saved = solved(release, lab)  # a plotly figure's worth of saved outputs: 25 MB, discarded on reading
    first_code = next(c for c in saved.cells if c.cell_type == "code")
    first_code.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "x" * (25 << 20)})]
    honest("big_saved_outputs", saved)
    unfinished = solved(release, lab)
    first_md = next(i for i in range(anchor, -1, -1) if unfinished.cells[i].cell_type == "markdown")
    section_end = next((i for i in range(anchor + 1, len(unfinished.cells))
                        if unfinished.cells[i].cell_type == "markdown"), len(unfinished.cells))
    del unfinished.cells[first_md:section_end]
    honest("deleted_section", unfinished, spec.target_tests)
    for cell, source in spec.honest.items():
        source = source or solution_source(lab, cell).replace("dec.tokens.extend(emitted)", "dec.tokens += emitted")
        honest(f"alternative_{cell}", solved(release, lab, {cell: source}))
    for fixture in out:
        if fixture.lost is not None and not fixture.lost <= every:
            raise ValueError(f"{lab} fixture {fixture.name} names unknown tests {fixture.lost - every}")
    return out


def write(fixtures_: list[Fixture], dest: Path) -> None:
    """Write fixtures as "<name>_<lab>.ipynb" files into `dest` (the flat LMS layout `grade` accepts)."""
    dest.mkdir(parents=True, exist_ok=True)
    for fixture in fixtures_:
        path = dest / f"{fixture.name.replace('_', '-')}_submission.ipynb"
        if fixture.notebook is None:
            path.write_bytes(fixture.raw or b"")
        else:
            nbformat.write(fixture.notebook, path)


LABS: dict[str, LabFixtures] = {
    "lab01_sampling": LabFixtures(
        target_cell="process_logits",
        variants={"zero_d_tensors": Variant(set(), kind="honest", after={"verify": sources.ZERO_D_TENSORS})},
        target_tests={"test_process_logits", "test_process_logits_hidden"},
        reference_import=("from specdec_lab.sampling import SamplingConfig, process_logits as reference\n\n\n"
                          "def process_logits(logits, temperature, top_k=None):\n"
                          "    return reference(logits, SamplingConfig(temperature, top_k))\n"),
        mistakes={
            "pq_swapped": Mistake("accepted_count", "u[i] * q[i, token] < p[i, token]",
                                  "u[i] * p[i, token] < q[i, token]",
                                  {"test_accepted_count", "test_accepted_count_hidden", "test_verify",
                                   "test_verify_rejection_hidden", "test_histogram", "test_histogram_hidden"}),
            "residual_not_normalised": Mistake("residual", "return excess / total if total > 0 else p",
                                               "return excess if total > 0 else p",
                                               {"test_residual", "test_residual_hidden"}),
            "residual_not_clipped": Mistake("residual", "excess = (p - q).clamp(min=0)", "excess = p - q",
                                            {"test_residual", "test_residual_hidden", "test_verify_rejection_hidden",
                                             "test_histogram", "test_histogram_hidden"}),
            "bonus_missing": Mistake("verify", "return draft_tokens[:n].tolist() + [int(extra)]",
                                     "return draft_tokens[:n].tolist() + ([int(extra)] if n < k else [])",
                                     {"test_verify", "test_verify_bonus_hidden"}),
            "bonus_wrong_position": Mistake("verify", "torch.multinomial(p[k], 1", "torch.multinomial(p[k - 1], 1",
                                            {"test_verify", "test_verify_bonus_hidden"}),
            # block verification's classic mistakes: the weight not capped at 1, the residual not scaled by w_tau
            "block_weight_uncapped": Mistake("verify_block", "min(weights[-1] * float(p[i, x] / q[i, x]), 1.0)",
                                             "weights[-1] * float(p[i, x] / q[i, x])",
                                             {"test_verify_block_hidden", "test_verify_block_lossless_hidden"}),
            "block_residual_unscaled": Mistake("verify_block", "(weights[i] * p[i] - q[i]).clamp(min=0)",
                                               "(p[i] - q[i]).clamp(min=0)",
                                               {"test_verify_block_hidden", "test_verify_block_lossless_hidden"}),
            # the shortcut: the counts sampled from p directly, never verified (they still approach p)
            "histogram_without_verify": Mistake("first_token_histogram",
                                                "counts[verify(x, p_rows, q[None], generator)[0]] += 1",
                                                "counts[int(torch.multinomial(p, 1, generator=generator))] += 1",
                                                {"test_histogram", "test_histogram_hidden"}),
        },
        blank_answers={"answers_from_inputs": sources.ANSWERS_FROM_INPUTS},
        honest={"process_logits": (
            "def process_logits(logits, temperature, top_k=None):\n"
            "    if temperature == 0:\n"
            "        rows = logits.reshape(-1, logits.shape[-1])\n"
            "        out = torch.zeros(rows.shape)\n"
            "        for r in range(rows.shape[0]):\n"
            "            out[r, int(torch.argmax(rows[r]))] = 1.0\n"
            "        return out.reshape(logits.shape)\n"
            "    scaled = logits / temperature\n"
            "    if top_k:\n"
            "        kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]\n"
            "        scaled = torch.where(scaled < kth, torch.full_like(scaled, -math.inf), scaled)\n"
            "    return scaled.softmax(dim=-1)\n")},
    ),
    "lab02_loop": LabFixtures(
        target_cell="formulas",
        variants={
            # plain greedy decoding that reports the forwards a speculative loop would have taken
            "greedy_passed_off_as_loop": Variant({"test_generate_eos_hidden"},
                                                 functions={"generate": sources.GREEDY_AS_LOOP}),
            # a step that never drafts: right tokens, one per target forward (and alpha 0)
            "step_never_drafts": Variant({"test_step_cache_hidden", "test_generate_eos_hidden",
                                          "test_measure_hidden"},
                                         functions={"speculative_step": sources.STEP_NEVER_DRAFTS}),
            # alpha from one run, tau from another (generate's): the tau no longer follows from the alpha
            "tau_from_another_run": Variant({"test_measure", "test_measure_hidden"}, kind="mistake",
                                            functions={"measure_alpha_and_tau": sources.TAU_FROM_ANOTHER_RUN}),
            # the same counts read off the decoder's length, returned as 0-d tensors
            "measure_from_lengths": Variant(set(), kind="honest",
                                            functions={"measure_alpha_and_tau": sources.MEASURE_FROM_LENGTHS}),
        },
        target_tests={"test_formulas", "test_formulas_hidden"},
        reference_import=("from specdec_lab.theory import expected_speedup, expected_tokens_per_step\n"),
        mistakes={
            "greedy_draft_softmax_q": Mistake("draft", "token = int(torch.multinomial(q, 1, generator=generator))",
                                              "token = int(q.argmax())",
                                              {"test_draft_sampling_hidden", "test_step_lossless_hidden"}),
            "temperature_only_on_target": Mistake("draft", "q = probs(forward(model, feed, cache)[-1], temperature)",
                                                  "q = probs(forward(model, feed, cache)[-1], min(temperature, 1.0) "
                                                  "and 1.0)",
                                                  {"test_draft", "test_draft_sampling_hidden",
                                                   "test_draft_temperature_hidden"}),
            "temperature_only_on_draft": Mistake("speculative_step", "dec.target_cache), dec.temperature)",
                                                 "dec.target_cache), min(dec.temperature, 1.0) and 1.0)",
                                                 {"test_step_lossless_hidden"}),
            "cache_not_rolled_back": Mistake("speculative_step", "    crop(dec.target_cache, context + accepted)\n",
                                             "", {"test_step", "test_step_cache_hidden", "test_generate",
                                                  "test_generate_eos_hidden", "test_measure_hidden"}),
            "cache_rolled_back_too_far": Mistake("speculative_step", "crop(dec.target_cache, context + accepted)",
                                                 "crop(dec.target_cache, context + accepted - 1)",
                                                 {"test_step", "test_step_cache_hidden", "test_generate",
                                                  "test_generate_eos_hidden", "test_measure_hidden"}),
            "emits_past_eos": Mistake("generate", "    if eos in new:\n        new = new[: new.index(eos) + 1]\n",
                                      "", {"test_generate", "test_generate_eos_hidden"}),
            "bonus_not_counted": Mistake("formulas", "(1 - alpha ** (k + 1)) / (1 - alpha)",
                                         "(1 - alpha ** k) / (1 - alpha)",
                                         {"test_formulas", "test_formulas_hidden"}),
            "verifies_against_draft": Mistake("speculative_step", "emitted = verify(drafted, p, q, dec.generator)",
                                              "emitted = verify(drafted, torch.cat([q, p[-1:]]), q, dec.generator)",
                                              {"test_step", "test_step_cache_hidden", "test_step_lossless_hidden",
                                               "test_generate", "test_generate_eos_hidden", "test_measure_hidden"}),
            # alpha as accepted / drafted over all positions (the engines' "acceptance rate"), not the first's
            "alpha_over_all_drafted": Mistake("measure_alpha_and_tau", "return first_kept / steps, emitted / steps",
                                              "return (emitted - steps) / (k * steps), emitted / steps",
                                              {"test_measure_hidden"}),
            "reports_q_at_temperature_one": Mistake(
                "draft", "q = probs(forward(model, feed, cache)[-1], temperature)\n"
                         "        token = int(torch.multinomial(q, 1, generator=generator))",
                "logits = forward(model, feed, cache)[-1]\n"
                "        token = int(torch.multinomial(probs(logits, temperature), 1, generator=generator))\n"
                "        q = probs(logits, 1.0 if temperature else 0.0)",
                {"test_draft", "test_draft_sampling_hidden", "test_draft_temperature_hidden"}),
        },
        honest={"speculative_step": None},
    ),
    "lab03_trees": LabFixtures(
        target_cell="tree_attention_mask",
        variants={
            "numpy_integers": Variant(set(), kind="honest", after={"verify_tree": sources.NUMPY_TREE}),
            # right logits, one forward per node instead of one for the whole tree
            "tree_node_by_node": Variant({"test_tree_logits_hidden"},
                                         functions={"tree_logits": sources.TREE_NODE_BY_NODE}),
        },
        # the 4D mask and the forward are built on tree_attention_mask: without it they fail too
        target_tests={"test_mask", "test_mask_hidden", "test_mask4d", "test_mask4d_hidden", "test_tree_logits",
                      "test_tree_logits_hidden"},
        reference_import=("from specdec_lab.tree import slot_visibility\n\n\n"
                          "def tree_attention_mask(parents):\n    return slot_visibility(tuple(parents))\n"),
        mistakes={
            "mask_parent_only": Mistake("tree_attention_mask", "node = parents[node]",
                                        "node = parents[node] if node == i else -1",
                                        {"test_mask", "test_mask_hidden", "test_mask4d_hidden", "test_tree_logits",
                                         "test_tree_logits_hidden"}),
            "mask_without_self": Mistake("tree_attention_mask", "mask[i, node] = True", "mask[i, node] = node != i",
                                         {"test_mask", "test_mask_hidden", "test_mask4d", "test_mask4d_hidden",
                                          "test_tree_logits", "test_tree_logits_hidden"}),
            "positions_by_index": Mistake("tree_position_ids", "return torch.tensor(depth, dtype=torch.long) + start",
                                          "return torch.arange(len(parents)) + start",
                                          {"test_positions", "test_positions_hidden", "test_tree_logits",
                                           "test_tree_logits_hidden"}),
            "bonus_from_first_node": Mistake("verify_tree", "return path, wanted",
                                             "return path, predictions[path[0]] if path else wanted",
                                             {"test_verify_tree", "test_verify_tree_hidden",
                                              "test_verify_tree_bonus_hidden"}),
            "medusa_one_head": Mistake("medusa_tree", "head_top[len(choice) - 1][choice[-1]]",
                                       "head_top[0][choice[-1]]",
                                       {"test_medusa", "test_medusa_hidden"}),
            "mask4d_hides_context": Mistake("tree_mask_4d", "torch.ones(n, past, dtype=torch.bool)",
                                            "torch.zeros(n, past, dtype=torch.bool)",
                                            {"test_mask4d", "test_mask4d_hidden", "test_tree_logits",
                                             "test_tree_logits_hidden"}),
            "mask4d_as_booleans": Mistake("tree_mask_4d", "mask[~visible] = torch.finfo(dtype).min",
                                          "mask[visible] = 1",
                                          {"test_mask4d", "test_mask4d_hidden", "test_tree_logits",
                                           "test_tree_logits_hidden"}),
            "forward_positions_by_index": Mistake("tree_logits", "position_ids=tree_position_ids(parents, past)[None]",
                                                  "position_ids=torch.arange(past, past + len(tokens))[None]",
                                                  {"test_tree_logits", "test_tree_logits_hidden"}),
            "siblings_not_renormalised": Mistake(
                "verify_tree_sampling",
                "            draft[x] = 0\n            draft = draft / draft.sum() if draft.sum() > 0 else draft\n", "",
                {"test_verify_sampling", "test_verify_sampling_hidden", "test_verify_sampling_depth_hidden",
                 "test_histogram_hidden"}),
            "residual_not_updated": Mistake("verify_tree_sampling",
                                            "            target = residual(target, draft)\n", "",
                                            {"test_verify_sampling", "test_verify_sampling_hidden",
                                             "test_verify_sampling_depth_hidden", "test_histogram_hidden"}),
            "sampling_pq_swapped": Mistake("verify_tree_sampling", "draft[x] < target[x]", "target[x] < draft[x]",
                                           {"test_verify_sampling", "test_verify_sampling_hidden",
                                            "test_verify_sampling_depth_hidden", "test_histogram",
                                            "test_histogram_hidden"}),
            "bonus_from_parent": Mistake(
                "verify_tree_sampling", "return path, int(torch.multinomial(target, 1, generator=generator))",
                "return path, int(torch.multinomial(target if children else p[parents[node] + 1], 1, "
                "generator=generator))",
                {"test_verify_sampling", "test_verify_sampling_hidden", "test_verify_sampling_depth_hidden"}),
            # the shortcut: the first token sampled from p directly, the tree never verified (it still approaches p)
            "histogram_without_verify": Mistake(
                "first_token_histogram",
                "path, token = verify_tree_sampling(children, [-1] * width, p_rows, q_rows, generator)",
                "path, token = [], int(torch.multinomial(p, 1, generator=generator))",
                {"test_histogram", "test_histogram_hidden"}),
        },
    ),
    "lab04_eagle": LabFixtures(
        target_cell="eagle_chain",
        target_tests={"test_chain", "test_chain_hidden", "test_chain_loop"},
        reference_import=("from specdec_lab.drafters.eagle import EagleDrafter\n\n\n"
                          "def eagle_chain(head, features, tokens, k):\n"
                          "    return EagleDrafter(head, depth=k).propose(features, tokens)\n"),
        mistakes={
            "no_token_shift": Mistake("eagle_training_pairs", "features[:-1], tokens[1:], features[1:]",
                                      "features[:-1], tokens[:-1], features[1:]", {"test_pairs", "test_pairs_hidden"}),
            "head_without_mask": Mistake("head_forward", "attention_mask=causal_mask(len(tokens), "
                                         "cache.get_seq_length())", "attention_mask=None",
                                         {"test_head", "test_head_hidden", "test_dynamic_tree",
                                          "test_dynamic_tree_hidden", "test_tree_loop"}),
            # every drafted feature at position 0: the drafts' probabilities change (their tokens often not)
            "head_positions_from_zero": Mistake("head_forward", "    position_ids = positions[None]",
                                                "    position_ids = torch.arange(len(tokens))[None]",
                                                {"test_head", "test_head_hidden", "test_chain_hidden",
                                                 "test_chain_loop", "test_dynamic_tree", "test_dynamic_tree_hidden",
                                                 "test_tree_loop"}),
            "feature_token_misaligned": Mistake("eagle_chain", "torch.tensor(tokens[1:]), torch.arange(n)",
                                                "torch.tensor(tokens[:-1]), torch.arange(n)",
                                                {"test_chain", "test_chain_hidden", "test_chain_loop"}),
            "chain_feeds_target_feature": Mistake("eagle_chain", "head_forward(head, feature[None]",
                                                  "head_forward(head, features[-1:]",
                                                  {"test_chain", "test_chain_hidden", "test_chain_loop"}),
            "chain_cache_reset": Mistake("eagle_chain", "torch.tensor([n + i]), cache)[0]",
                                         "torch.tensor([n + i]), head.new_cache())[0]",
                                         {"test_chain", "test_chain_hidden", "test_chain_loop"}),
            # each predicted feature fed one position early: the argmax tokens (visible test) stay, the
            # probabilities do not
            "chain_wrong_positions": Mistake("eagle_chain", "torch.tensor([n + i]), cache)[0]",
                                             "torch.tensor([n + i - 1]), cache)[0]",
                                             {"test_chain_hidden", "test_chain_loop"}),
            "parents_not_renumbered": Mistake("select_nodes", "[position[parents[node]] if parents[node] != -1 else -1 "
                                              "for node in kept]", "[parents[node] for node in kept]",
                                              {"test_select", "test_select_hidden"}),
            "ranked_by_local_probability": Mistake("dynamic_tree", "scores.append(score + child_logp)",
                                                   "scores.append(child_logp)",
                                                   {"test_dynamic_tree", "test_dynamic_tree_hidden", "test_tree_loop"}),
            "frontier_not_pruned": Mistake("dynamic_tree", "key=lambda i: (-scores[i], i))[:top_k]",
                                           "key=lambda i: (-scores[i], i))", {"test_dynamic_tree",
                                                                              "test_dynamic_tree_hidden"}),
            # the right frontier nodes, numbered in index order instead of score order: the same tree (and tau),
            # its nodes in another order
            "frontier_in_index_order": Mistake("dynamic_tree", "frontier = sorted(level, key=lambda i: (-scores[i], i))"
                                               "[:top_k]", "frontier = sorted(sorted(level, key=lambda i: (-scores[i], "
                                               "i))[:top_k])", {"test_dynamic_tree", "test_dynamic_tree_hidden"}),
            "tree_ignores_ancestors": Mistake("dynamic_tree", "                while parents[path[0]] != -1:\n"
                                              "                    path.insert(0, parents[path[0]])\n", "",
                                              {"test_dynamic_tree", "test_dynamic_tree_hidden", "test_tree_loop"}),
        },
    ),
    "lab06_train_drafter": LabFixtures(
        target_cell="eagle_pairs",
        target_tests={"test_eagle_pairs", "test_eagle_pairs_hidden", "test_eagle_loss", "test_eagle_loss_hidden",
                      "test_train_eagle", "test_train_eagle_hidden"},
        reference_import=("from specdec_lab.train.eagle import unroll  # noqa: F401\n\n\n"
                          "def eagle_pairs(features, tokens, mask):\n"
                          "    valid = mask[:, 1:]\n"
                          "    return features[:, :-1][valid], tokens[:, 1:][valid], features[:, 1:][valid]\n"),
        mistakes={
            "labels_shifted_wrong_way": Mistake(
                "medusa_labels",
                "labels[:, :-shift] = tokens[:, shift:].masked_fill(~(mask[:, shift:] & mask[:, :-shift]), IGNORE)",
                "labels[:, shift:] = tokens[:, :-shift].masked_fill(~(mask[:, :-shift] & mask[:, shift:]), IGNORE)",
                # test_medusa_accuracy: its medusa_accuracy (on the wrong labels) misreports the trained heads
                {"test_medusa_labels", "test_medusa_labels_hidden", "test_medusa_loss_hidden",
                 "test_train_medusa_hidden", "test_medusa_accuracy", "test_medusa_accuracy_hidden"}),
            "loss_on_padding": Mistake("medusa_loss", "labels = medusa_labels(tokens, mask, k)",
                                       "labels = medusa_labels(tokens, torch.ones_like(mask), k)",
                                       {"test_medusa_loss_hidden", "test_train_medusa_hidden"}),
            "pairs_at_same_position": Mistake("eagle_pairs", "tokens[:, 1:][valid]", "tokens[:, :-1][valid]",
                                              {"test_eagle_pairs", "test_eagle_pairs_hidden", "test_eagle_loss_hidden",
                                               "test_train_eagle", "test_train_eagle_hidden"}),
            # the classic MTP mistakes: the label shifted by the depth (it then repeats the input token), the input
            # token taken one position early, rows whose label is padding kept
            "mtp_label_shifted_by_depth": Mistake("mtp_pairs", "tokens[:, shift:][valid]", "tokens[:, depth:-1][valid]",
                                                  {"test_mtp_pairs", "test_mtp_pairs_hidden"}),
            "mtp_token_one_early": Mistake("mtp_pairs", "tokens[:, depth:-1][valid], tokens", "tokens[:, depth - 1:-2]"
                                           "[valid], tokens", {"test_mtp_pairs", "test_mtp_pairs_hidden"}),
            "mtp_rows_on_padding": Mistake("mtp_pairs", "valid = mask[:, shift:]",
                                           "valid = torch.ones_like(mask[:, shift:])",
                                           {"test_mtp_pairs", "test_mtp_pairs_hidden"}),
            "target_not_frozen": Mistake("train_eagle3",
                                         "    target.requires_grad_(False)\n"
                                         "    optimizer = torch.optim.AdamW(head.parameters(), lr=lr)",
                                         "    optimizer = torch.optim.AdamW([*head.parameters(), "
                                         "*target.parameters()], lr=lr)", {"test_train_eagle3_hidden"}),
            # the same in train_medusa, whose answer cell then moves the notebook's target for every later cell
            # (the probes reset it); heads trained beside a moving output layer also miss with the real one
            "medusa_trains_target": Mistake("train_medusa",
                                            "    target.requires_grad_(False)  # frozen: only the heads learn\n"
                                            "    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr)",
                                            "    optimizer = torch.optim.AdamW([*heads.parameters(), "
                                            "*target.parameters()], lr=lr)",
                                            {"test_train_medusa_hidden", "test_medusa_accuracy"}),
            "ttt_leaks_true_features": Mistake("ttt_losses", "feature = head(feature[:, : length - s], tokens[:, s:])",
                                               "feature = head(fused[:, s - 1 : length - 1], tokens[:, s:])",
                                               {"test_ttt_hidden", "test_train_eagle3_hidden"}),
        },
        honest={
            "medusa_labels": (
                "def medusa_labels(tokens, mask, k):\n"
                "    labels = torch.full(tokens.shape, IGNORE, dtype=torch.long)\n"
                "    rows, length = tokens.shape\n"
                "    for b in range(rows):\n"
                "        for t in range(length - k - 1):\n"
                "            if mask[b, t] and mask[b, t + k + 1]:\n"
                "                labels[b, t] = tokens[b, t + k + 1]\n"
                "    return labels\n"),
            "eagle_pairs": (
                "def eagle_pairs(features, tokens, mask):\n"
                "    inputs, nexts, targets = [], [], []\n"
                "    for b in range(tokens.shape[0]):\n"
                "        for t in range(tokens.shape[1] - 1):\n"
                "            if mask[b, t + 1]:\n"
                "                inputs.append(features[b, t])\n"
                "                nexts.append(int(tokens[b, t + 1]))\n"
                "                targets.append(features[b, t + 1])\n"
                "    return torch.stack(inputs), torch.tensor(nexts), torch.stack(targets)\n"),
        },
        variants={
            # made-up falling curves (the first loss honest) without one optimizer step: every training check
            "trains_nothing": Variant({"test_train_medusa", "test_train_medusa_hidden", "test_medusa_accuracy",
                                       "test_train_eagle", "test_train_eagle_hidden", "test_train_eagle3",
                                       "test_train_eagle3_hidden"}, functions=sources.FAKE_TRAINING),
            # an experiment after the answer that rebinds the trained heads' names: nothing
            "rebinds_trained_heads": Variant(set(), kind="honest", after={"train_eagle": sources.REBIND_HEADS}),
        },
    ),
    "lab05_lookahead": LabFixtures(
        target_cell="prompt_lookup",
        variants={
            "numpy_integers": Variant(set(), kind="honest", after={"prompt_lookup": sources.NUMPY_LOOKUP}),
            # greedy decoding with a made-up iteration count
            "jacobi_as_greedy": Variant({"test_jacobi_hidden"},
                                        functions={"jacobi_decode": sources.JACOBI_AS_GREEDY}),
        },
        target_tests={"test_lookup", "test_lookup_hidden"},
        reference_import=("from specdec_lab.drafters.prompt_lookup import find_continuation\n\n\n"
                          "def prompt_lookup(tokens, max_ngram, k, min_ngram=1):\n"
                          "    return find_continuation(torch.tensor(tokens), max_ngram, min_ngram, k).tolist()\n"),
        mistakes={
            # suffix decoding's classic mistakes: recency instead of counts (prompt lookup's rule), no probability
            # floor, a budget that ignores the match length
            "suffix_most_recent": Mistake("suffix_draft", "key=lambda item: item[1])", "key=lambda item: item[1][1])",
                                          {"test_suffix_hidden"}),
            "suffix_no_probability_floor": Mistake("suffix_draft", "        if probability < min_probability:\n"
                                                   "            break\n", "", {"test_suffix", "test_suffix_hidden"}),
            "suffix_budget_ignores_match": Mistake("suffix_draft", "budget = min(k, math.ceil(factor * match))",
                                                   "budget = k", {"test_suffix", "test_suffix_hidden"}),
            "lookup_key_off_by_one": Mistake("prompt_lookup", "suffix = tokens[-n:]", "suffix = tokens[-n - 1 : -1]",
                                             {"test_lookup", "test_lookup_hidden"}),
            "jacobi_stops_before_fixed_point": Mistake(
                "jacobi_decode", "if refined == guesses:\n            return guesses, iterations",
                "if sum(a != b for a, b in zip(refined, guesses)) <= 1:\n            return refined, iterations",
                {"test_jacobi_hidden"}),
            "ngram_key_off_by_one": Mistake("advance_window", "[level[i] for level in levels]",
                                            "[level[i] for level in levels[1:]]",
                                            {"test_window", "test_window_hidden"}),
            "pool_not_trimmed": Mistake("pool", "pool[key] = ([continuation] + kept)[:size]",
                                        "pool[key] = [continuation] + kept", {"test_pool", "test_pool_stale_hidden"}),
            "pool_repeat_stays_stale": Mistake(
                "pool", "kept = [c for c in pool.get(key, []) if c != continuation]\n"
                        "        pool[key] = ([continuation] + kept)[:size]",
                "if continuation not in pool.get(key, []):\n"
                "            pool[key] = ([continuation] + pool.get(key, []))[:size]", {"test_pool_stale_hidden"}),
            "candidates_keyed_by_previous_token": Mistake("pool", "pool.get(tokens[-1], [])",
                                                          "pool.get(tokens[-2], [])",
                                                          {"test_pool", "test_candidates_hidden"}),
            "window_sees_candidates": Mistake("lookahead_layout", "visible[r, row : row + column + 1] = True",
                                              "visible[r, : row + column + 1] = True",
                                              {"test_layout", "test_layout_mask_hidden",
                                               "test_layout_sequential_hidden"}),
            "window_positions_by_row": Mistake("lookahead_layout", "offsets.append(1 + column + level)",
                                               "offsets.append(1 + level * width + column)",
                                               {"test_layout", "test_layout_sequential_hidden"}),
        },
        honest={
            "prompt_lookup": (
                "def prompt_lookup(tokens, max_ngram, k, min_ngram=1):\n"
                "    context = torch.tensor(tokens)\n"
                "    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):\n"
                "        windows = context[:-1].unfold(0, n, 1)\n"
                "        starts = (windows == context[-n:]).all(dim=1).nonzero().flatten()\n"
                "        if len(starts):\n"
                "            begin = int(starts[-1]) + n\n"
                "            return context[begin : begin + k].tolist()\n"
                "    return []\n"),
            "jacobi_decode": (
                "def jacobi_decode(prompt, n):\n"
                "    guesses = torch.full((n,), prompt[-1])\n"
                "    for iterations in range(1, n + 2):\n"
                "        refined = logits_of(prompt + guesses.tolist())[-n - 1 : -1].argmax(dim=-1)\n"
                "        if torch.equal(refined, guesses):\n"
                "            break\n"
                "        guesses = refined\n"
                "    return guesses.tolist(), iterations\n"),
            "pool": (
                "def update_pool(pool, ngrams, size):\n"
                "    for ngram in ngrams:\n"
                "        continuation = tuple(ngram[1:])\n"
                "        entries = pool.setdefault(ngram[0], [])\n"
                "        if continuation in entries:\n"
                "            entries.remove(continuation)\n"
                "        entries.insert(0, continuation)\n"
                "        del entries[size:]\n\n\n"
                "def select_candidates(pool, tokens, max_len):\n"
                "    return [list(c)[:max_len] for c in pool.get(tokens[-1], ())]\n"),
            "lookahead_layout": (
                "def lookahead_layout(candidate_lengths, width, levels):\n"
                "    sees, offsets = [[0]], [0]\n"
                "    for length in candidate_lengths:\n"
                "        first = len(offsets)\n"
                "        for depth in range(1, length + 1):\n"
                "            sees.append([0] + list(range(first, first + depth)))\n"
                "            offsets.append(depth)\n"
                "    window = len(offsets)\n"
                "    for level in range(levels):\n"
                "        for column in range(width):\n"
                "            sees.append([0] + [window + c for c in range(column + 1)]\n"
                "                        + [window + lower * width + column for lower in range(1, level + 1)])\n"
                "            offsets.append(1 + column + level)\n"
                "    visible = torch.zeros(len(offsets), len(offsets), dtype=torch.bool)\n"
                "    for row, seen in enumerate(sees):\n"
                "        visible[row, seen] = True\n"
                "    return offsets, visible\n"),
        },
    ),
}
