"""Lab 6's training checks judged on the trusted side: the probes run here on the reference's namespace (or a
variant of it with some answer cells rewritten), their answers go through JSON as they would leave the sandbox,
and the judges of autograder/checks/lab06.py decide. No sandbox: this is the checker alone, so it runs in
seconds (the sandboxed end-to-end run is tests/test_autograder.py's `grading` test).

The cases: the reference passes everything; a notebook whose training functions return a made-up falling
curve (its first loss even computed honestly) without one optimizer step fails every training check; a
training function that updates the target fails the frozen-target check only; a cell that changed the target
or rebound `eagle_head` / `medusa_heads` before the probes ran costs nothing; weights of the wrong shape or
names fail with a message that says so.
"""

from __future__ import annotations

import ast
import importlib
import json
import time

import pytest
import torch

from autograder import fixtures, pipeline
from autograder.checks._common import judge

LAB = "lab06_train_drafter"
TRAINING = {"test_train_medusa", "test_train_medusa_hidden", "test_medusa_accuracy", "test_train_eagle",
            "test_train_eagle_hidden", "test_train_eagle3", "test_train_eagle3_hidden"}


@pytest.fixture(scope="module")
def lab(request):
    """The reference namespace, the checks, one student's inputs and the probe module."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.syspath_prepend(str(pipeline.AUTOGRADER / "sandbox" / "inside"))
    request.addfinalizer(monkeypatch.undo)
    probes = importlib.import_module("probes.lab06")
    ref, checks = pipeline.reference(LAB), pipeline.lab_checks(LAB)
    inputs = pipeline.check_inputs(LAB, seed=11, student="ana")
    return {"ref": ref, "checks": checks, "inputs": inputs, "probes": probes}


def definitions(source: str) -> str:
    """The functions and classes of an answer cell, without the cell's own driver code (which trains for
    seconds and, in a variant that trains the target, would change the shared reference's target)."""
    keep = [node for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    return "\n\n".join(ast.unparse(node) for node in keep)


def variant(ref: dict, overrides: dict[str, str] | None = None) -> dict:
    """A copy of the reference namespace in which every code answer cell's definitions run again (the solution's,
    or `overrides`: cell -> source), so that each function sees the copy and the rewritten functions. The written
    answer (a markdown cell graded by a person) is prose, not code."""
    ns = dict(ref)
    cells = [fixtures.grade_id(c) for c in fixtures.solution_notebook(LAB).cells
             if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    for cell in cells:
        source = (overrides or {}).get(cell) or fixtures.solution_source(LAB, cell)
        exec(compile(definitions(source), f"<variant {cell}>", "exec"), ns)  # noqa: S102 - our own test code
    return ns


def grade(lab: dict, ns: dict, only: set[str] | None = None) -> dict[str, str | None]:
    """grade id -> None when the check passes, else its message; the probes run on `ns`."""
    out = {}
    for gid, check in lab["checks"].items():
        if only is not None and gid not in only:
            continue
        answer = json.loads(json.dumps(getattr(lab["probes"], check.probe)(ns, lab["inputs"][gid])))
        verdict = judge(check, lab["inputs"][gid], answer, lab["ref"])
        out[gid] = None if verdict.passed else verdict.message
    return out


def target_state(ref: dict) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in ref["target"].state_dict().items()}


def test_reference_passes_every_check_and_the_judging_is_quick(lab):
    ref, checks, inputs = lab["ref"], lab["checks"], lab["inputs"]
    answers = {gid: json.loads(json.dumps(getattr(lab["probes"], c.probe)(ref, inputs[gid])))
               for gid, c in checks.items()}
    for gid, check in checks.items():  # the first pass builds what the trusted side keeps per process
        judge(check, inputs[gid], answers[gid], ref)
    started = time.perf_counter()
    failed = {gid: v.message for gid, check in checks.items()
              if not (v := judge(check, inputs[gid], answers[gid], ref)).passed}
    seconds = time.perf_counter() - started
    print(f"lab 6: the trusted side judged one student in {seconds:.2f} s")
    assert failed == {}
    assert seconds < 5, "40 students are judged one at a time under the trusted lock: keep lab 6's judging short"


def test_made_up_curve_without_training_fails_every_training_check(lab):
    fake = fixtures.LABS[LAB].variants["trains_nothing"]
    assert fake.lost == TRAINING
    changed = {cell: fixtures.replace_function(fixtures.solution_source(LAB, cell), definition)
               for cell, definition in fake.functions.items()}
    verdicts = grade(lab, variant(lab["ref"], changed))
    assert {gid for gid, message in verdicts.items() if message} == TRAINING, verdicts
    assert "measured your trained weights" in verdicts["test_train_eagle"]
    assert "should come from the training that produced these weights" in verdicts["test_train_medusa_hidden"]
    assert "held-out sentences" in verdicts["test_train_medusa"]


def mistake_source(name: str) -> dict[str, str]:
    mistake = fixtures.LABS[LAB].mistakes[name]
    return {mistake.cell: fixtures.solution_source(LAB, mistake.cell).replace(mistake.old, mistake.new)}


def test_training_the_target_fails_the_frozen_check_only(lab):
    ref = lab["ref"]
    before = target_state(ref)
    verdicts = grade(lab, variant(ref, mistake_source("target_not_frozen")))
    assert {gid for gid, message in verdicts.items() if message} == {"test_train_eagle3_hidden"}, verdicts
    assert "changed the target's weights" in verdicts["test_train_eagle3_hidden"]
    after = target_state(ref)
    assert all(torch.equal(before[name], after[name]) for name in before), "the probes restore the target"


@pytest.mark.parametrize("name", sorted(fixtures.LABS[LAB].mistakes))
def test_each_classic_mistake_loses_exactly_its_tests(lab, name):
    """The fixtures' promises, checked here without a sandbox (the end-to-end test grades them sandboxed)."""
    verdicts = grade(lab, variant(lab["ref"], mistake_source(name)))
    lost = {gid for gid, message in verdicts.items() if message}
    expected = fixtures.LABS[LAB].mistakes[name].lost
    assert lost == expected, {gid: verdicts[gid] for gid in lost ^ expected}


def test_a_changed_target_or_rebound_heads_in_the_namespace_cost_nothing(lab):
    """What a notebook's later cells leave behind: a target that an unfrozen training moved, and `eagle_head` /
    `medusa_heads` rebound to untrained heads. The probes reset the target and train heads of their own."""
    ref = lab["ref"]
    ns = dict(ref)
    ns["eagle_head"], ns["medusa_heads"] = ref["EagleHead"](seed=1), ref["MedusaHeads"](num_heads=3)
    before = target_state(ref)
    try:
        with torch.no_grad():
            ref["target"].lm_head.weight.add_(0.5)
        verdicts = grade(lab, ns, only=TRAINING | {"test_medusa_accuracy_hidden", "test_eagle_loss_hidden",
                                                    "test_ttt_hidden"})
    finally:
        ref["target"].load_state_dict(before)
    assert {gid: message for gid, message in verdicts.items() if message} == {}


def test_weights_of_the_wrong_shape_or_names_fail_with_a_clear_message(lab):
    ref, checks, inputs = lab["ref"], lab["checks"], lab["inputs"]
    gid = "test_train_eagle_hidden"
    answer = json.loads(json.dumps(lab["probes"].train_eagle(ref, inputs[gid])))
    assert judge(checks[gid], inputs[gid], answer, ref).passed

    def verdict(edit) -> str:
        broken = json.loads(json.dumps(answer))
        edit(broken[0])
        result = judge(checks[gid], inputs[gid], broken, ref)
        assert not result.passed
        return result.message

    def transpose(case):
        weight = torch.tensor(case["head"]["fc.weight"]["tensor"])
        case["head"]["fc.weight"] = {"tensor": weight.T.tolist(), "shape": [64, 32], "dtype": "torch.float32"}

    assert "the weight 'fc.weight' has shape (64, 32), expected (32, 64)" in verdict(transpose)
    assert "should be named" in verdict(lambda case: case["head"].pop("down.weight"))
    huge = {"tensor": [], "shape": [20_000, 20_000], "dtype": "torch.float32"}
    assert "has shape (20000, 20000)" in verdict(lambda case: case["head"].update({"fc.weight": huge}))
    assert "changed the target's weights" in verdict(
        lambda case: case["target"]["lm_head.weight"]["tensor"][0].__setitem__(0, 9.0))
