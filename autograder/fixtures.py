"""Simulated submissions for every lab, generated from the solution notebooks (nothing is stored by hand).

For each lab: the solution, the blank release, one submission per classic mistake (the solution with one
edit), and adversarial submissions that try to earn points without the work or to break the grader. Each
fixture says which test cells it must lose (`lost`); the end-to-end tests grade them all through nbgrader
and compare. `python -m autograder fixtures LAB DEST` writes them out for inspection.
"""

from __future__ import annotations

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
class LabFixtures:
    """What the fixtures of one lab need to know (`honest`: alternative correct answers,
    cell -> source; None for the lab's built-in rewrite of the solution).

    target_cell: the solution cell the adversarial fixtures attack; target_tests: the test cells that fail when
    that cell defines nothing; reference_import: a cell that imports the course's own implementation instead
    of writing it; mistakes: the classic mistakes of this lab.
    """

    target_cell: str
    target_tests: set[str]
    reference_import: str
    mistakes: dict[str, Mistake] = field(default_factory=dict)
    honest: dict[str, str | None] = field(default_factory=dict)


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
    attack("lying_objects", sources.LIAR + f"\n\ndef {target}(*args, **kwargs):\n    return Liar()\n")
    attack("writes_gradebook", sources.WRITE_GRADEBOOK + blank_stub)
    attack("kills_grader", sources.KILL_GRADER + blank_stub, lost=every, exact=False)
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
        },
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
        target_tests={"test_formulas", "test_formulas_hidden"},
        reference_import=("from specdec_lab.theory import expected_speedup, expected_tokens_per_step\n"),
        mistakes={
            "greedy_draft_softmax_q": Mistake("draft", "token = int(torch.multinomial(q, 1, generator=generator))",
                                              "token = int(q.argmax())",
                                              {"test_draft_sampling_hidden", "test_step_lossless_hidden"}),
            "temperature_only_on_target": Mistake("draft", "q = probs(forward(model, feed, cache)[-1], temperature)",
                                                  "q = probs(forward(model, feed, cache)[-1], min(temperature, 1.0) "
                                                  "and 1.0)", {"test_draft_temperature_hidden"}),
            "temperature_only_on_draft": Mistake("speculative_step", "dec.target_cache), dec.temperature)",
                                                 "dec.target_cache), min(dec.temperature, 1.0) and 1.0)",
                                                 {"test_step_lossless_hidden"}),
            "cache_not_rolled_back": Mistake("speculative_step", "    crop(dec.target_cache, context + accepted)\n",
                                             "", {"test_step", "test_step_cache_hidden", "test_generate_eos_hidden"}),
            "cache_rolled_back_too_far": Mistake("speculative_step", "crop(dec.target_cache, context + accepted)",
                                                 "crop(dec.target_cache, context + accepted - 1)",
                                                 {"test_step", "test_step_cache_hidden"}),
            "emits_past_eos": Mistake("generate", "    if eos in new:\n        new = new[: new.index(eos) + 1]\n",
                                      "", {"test_generate_eos_hidden"}),
            "bonus_not_counted": Mistake("formulas", "(1 - alpha ** (k + 1)) / (1 - alpha)",
                                         "(1 - alpha ** k) / (1 - alpha)", {"test_formulas_hidden"}),
            "verifies_against_draft": Mistake("speculative_step", "emitted = verify(drafted, p, q, dec.generator)",
                                              "emitted = verify(drafted, torch.cat([q, p[-1:]]), q, dec.generator)",
                                              {"test_step_cache_hidden", "test_step_lossless_hidden",
                                               "test_generate_eos_hidden"}),
            "reports_q_at_temperature_one": Mistake(
                "draft", "q = probs(forward(model, feed, cache)[-1], temperature)\n"
                         "        token = int(torch.multinomial(q, 1, generator=generator))",
                "logits = forward(model, feed, cache)[-1]\n"
                "        token = int(torch.multinomial(probs(logits, temperature), 1, generator=generator))\n"
                "        q = probs(logits, 1.0 if temperature else 0.0)",
                {"test_draft_sampling_hidden", "test_draft_temperature_hidden", "test_step_lossless_hidden"}),
        },
        honest={"speculative_step": None},
    ),
    "lab03_trees": LabFixtures(
        target_cell="tree_attention_mask",
        target_tests={"test_mask", "test_mask_hidden"},
        reference_import=("from specdec_lab.tree import slot_visibility\n\n\n"
                          "def tree_attention_mask(parents):\n    return slot_visibility(tuple(parents))\n"),
        mistakes={
            "mask_parent_only": Mistake("tree_attention_mask", "node = parents[node]",
                                        "node = parents[node] if node == i else -1", {"test_mask_hidden"}),
            "mask_without_self": Mistake("tree_attention_mask", "mask[i, node] = True", "mask[i, node] = node != i",
                                         {"test_mask", "test_mask_hidden"}),
            "positions_by_index": Mistake("tree_position_ids", "return torch.tensor(depth, dtype=torch.long) + start",
                                          "return torch.arange(len(parents)) + start", {"test_positions_hidden"}),
            "bonus_from_first_node": Mistake("verify_tree", "return path, wanted",
                                             "return path, predictions[path[0]] if path else wanted",
                                             {"test_verify_tree", "test_verify_tree_bonus_hidden"}),
            "medusa_one_head": Mistake("medusa_tree", "head_top[len(choice) - 1][choice[-1]]",
                                       "head_top[0][choice[-1]]",
                                       {"test_medusa", "test_medusa_hidden"}),
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
                                          "test_dynamic_tree_hidden"}),
            "head_positions_from_zero": Mistake("head_forward", "    position_ids = positions[None]",
                                                "    position_ids = torch.arange(len(tokens))[None]",
                                                {"test_head", "test_head_hidden"}),
            "feature_token_misaligned": Mistake("eagle_chain", "torch.tensor(tokens[1:]), torch.arange(n)",
                                                "torch.tensor(tokens[:-1]), torch.arange(n)",
                                                {"test_chain", "test_chain_hidden", "test_chain_loop"}),
            "chain_feeds_target_feature": Mistake("eagle_chain", "head_forward(head, feature[None]",
                                                  "head_forward(head, features[-1:]",
                                                  {"test_chain", "test_chain_hidden"}),
            "chain_cache_reset": Mistake("eagle_chain", "torch.tensor([n + i]), cache)[0]",
                                         "torch.tensor([n + i]), head.new_cache())[0]",
                                         {"test_chain", "test_chain_hidden", "test_chain_loop"}),
            "parents_not_renumbered": Mistake("select_nodes", "[position[parents[node]] if parents[node] != -1 else -1 "
                                              "for node in kept]", "[parents[node] for node in kept]",
                                              {"test_select", "test_select_hidden"}),
            "ranked_by_local_probability": Mistake("dynamic_tree", "scores.append(score + child_logp)",
                                                   "scores.append(child_logp)",
                                                   {"test_dynamic_tree", "test_dynamic_tree_hidden", "test_tree_loop"}),
            "frontier_not_pruned": Mistake("dynamic_tree", "key=lambda i: (-scores[i], i))[:top_k]",
                                           "key=lambda i: (-scores[i], i))", {"test_dynamic_tree",
                                                                              "test_dynamic_tree_hidden"}),
            "tree_ignores_ancestors": Mistake("dynamic_tree", "                while parents[path[0]] != -1:\n"
                                              "                    path.insert(0, parents[path[0]])\n", "",
                                              {"test_dynamic_tree", "test_dynamic_tree_hidden"}),
        },
    ),
}
