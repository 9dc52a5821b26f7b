"""The judges of labs 1, 3 and 4 against shortcuts, without a sandbox: the probes run here on the reference's
namespace (or on a copy of it where one function is replaced by a shortcut), the judges decide.

What is shown: the reference passes every check; no check's inputs carry an expected value, by name or by value;
a histogram that samples p without the student's verify fails (lab 1 and lab 3); an EAGLE chain fed at the wrong
positions fails although its argmax tokens agree, while an honest chain computed another way passes; lab 1
answered from the call's own inputs earns nothing.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from autograder import fixture_sources, fixtures, pipeline
from autograder.checks._common import decode
from tests.test_autograder import call_here

LABS = ["lab01_sampling", "lab03_trees", "lab04_eagle"]
# Keys under which an expected value would travel (the old inputs used "expected", "greedy", "path", "token", "why").
ANSWER_KEYS = {"expected", "greedy", "wanted", "answer", "answers", "path", "token", "why", "solution", "result"}


@pytest.fixture(autouse=True)
def probes_path(monkeypatch):
    monkeypatch.syspath_prepend(str(pipeline.AUTOGRADER / "sandbox" / "inside"))


def probes_of(lab: str):
    return importlib.import_module(f"probes.{lab.split('_')[0]}")


def public(inputs: dict) -> dict:
    """What the sandbox receives of a check's inputs (never the "secret" part)."""
    return {k: v for k, v in inputs.items() if k not in ("secret", "measured")}


def run_checks(lab: str, ns: dict, only: set[str] | None = None, seed: int = 5) -> dict[str, tuple]:
    """grade id -> (inputs, plain answer, verdict) for the checks of `lab` (or those in `only`), the probes run on
    the namespace `ns` (the reference's, or a copy with a shortcut), the judges on the reference."""
    probes, ref = probes_of(lab), pipeline.reference(lab)
    inputs = pipeline.check_inputs(lab, seed=seed, student="solution")
    out = {}
    for gid, check in pipeline.lab_checks(lab).items():
        if only is None or gid in only:
            answer = call_here(probes, check, inputs[gid], ns)
            out[gid] = (inputs[gid], answer, pipeline.judged(check, inputs[gid], answer, ref))
    return out


@pytest.fixture(scope="module")
def reference_runs() -> dict[str, dict[str, tuple]]:
    """Every check of labs 1, 3 and 4 run once on the reference (shared by the tests below: they are slow)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(pipeline.AUTOGRADER / "sandbox" / "inside"))
        return {lab: run_checks(lab, pipeline.reference(lab)) for lab in LABS}


def with_source(lab: str, *sources: str) -> dict:
    """A copy of the reference namespace with `sources` executed on top (the functions they define replace the
    reference's; their globals are the copy, so the probes' replacements reach them)."""
    ns = dict(pipeline.reference(lab))
    for source in sources:
        exec(compile(source, f"<shortcut {lab}>", "exec"), ns)  # noqa: S102 - the fixtures' own code
    return ns


def mistake_source(lab: str, name: str) -> str:
    """The solution cell of the fixture `name` of `lab`, with its one edit."""
    mistake = fixtures.LABS[lab].mistakes[name]
    source = fixtures.solution_source(lab, mistake.cell)
    assert mistake.old in source, f"{lab} {name}: the edit no longer applies to the solution"
    return source.replace(mistake.old, mistake.new)


def nested(value):
    """Every key and every value nested in JSON-like `value` (itself included)."""
    yield None, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, None
            yield from nested(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from nested(item)


def canonical(value) -> str:
    """A comparable text of a plain value: tensors as nested lists, floats rounded, tuples as lists."""
    def norm(v):
        if isinstance(v, torch.Tensor):
            return norm(v.tolist())
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [norm(x) for x in v]
        if isinstance(v, float):
            return round(v, 6) + 0.0
        return v
    return json.dumps(norm(decode(value)), sort_keys=True)


def per_case(inputs: dict, answer) -> list:
    """The answer split by case where the check has cases (one answer per case), else the whole answer."""
    if isinstance(answer, list) and isinstance(inputs.get("cases"), list) and len(answer) == len(inputs["cases"]):
        return answer
    return [answer]


@pytest.mark.parametrize("lab", LABS)
def test_the_reference_passes_every_check(lab, reference_runs):
    failed = {gid: verdict.message for gid, (_, _, verdict) in reference_runs[lab].items() if not verdict.passed}
    assert failed == {}
    assert set(reference_runs[lab]) == set(pipeline.lab_checks(lab))


@pytest.mark.parametrize("lab", LABS)
def test_no_input_holds_an_expected_value(lab, reference_runs):
    """By name: no key of what the sandbox receives is one an expected value travels under. By value: for no
    check are the reference's answers (the lists and tensors among them, case by case) all found among the
    values nested in its inputs, so no check passes by echoing its inputs back. The old lab 1 `verify` inputs
    ("expected": the answers) and lab 4 loop inputs ("greedy") fail both."""
    readable = []
    for gid, (inputs, answer, _) in reference_runs[lab].items():
        sent = public(inputs)
        keys = {key for key, _ in nested(sent) if key is not None}
        assert not keys & ANSWER_KEYS, f"{gid}: the inputs hold {sorted(keys & ANSWER_KEYS)}"
        values = {canonical(value) for key, value in nested(sent) if key is None}
        answers = [a for a in per_case(inputs, answer) if isinstance(decode(a), list | dict | torch.Tensor)]
        if answers and all(canonical(a) in values for a in answers):
            readable.append(gid)
    assert readable == [], "these checks' answers can be read off their inputs"


def test_the_loop_continuation_is_not_in_the_loop_inputs(reference_runs):
    """Lab 4's loop judges verify against the greedy continuation: not even its first three tokens are a run of
    any token list the sandbox receives."""
    ref = pipeline.reference("lab04_eagle")
    for gid in ("test_chain_loop", "test_tree_loop"):
        inputs, answer, verdict = reference_runs["lab04_eagle"][gid]
        with torch.no_grad():
            wanted = ref["greedy"](list(inputs["prompt"]), inputs["new_tokens"])
        start = wanted[:3]
        runs = [value for key, value in nested(public(inputs)) if isinstance(value, list)
                and all(isinstance(v, int) for v in value)]
        assert not any(run[i : i + 3] == start for run in runs for i in range(len(run))), gid
        prompt = list(inputs["prompt"])
        contexts = [step["context"] for step in decode(answer)["steps"]]  # what the probe decoded along by itself
        assert verdict.passed and all(c == prompt + wanted[: len(c) - len(prompt)] for c in contexts), gid


@pytest.mark.parametrize("lab", ["lab01_sampling", "lab03_trees"])
def test_a_histogram_sampled_from_p_without_verify_fails(lab):
    """The shortcut's counts approach p, as the method's do; with the verify function broken they must follow
    q, and the shortcut's do not. The probe puts the real verify back afterwards."""
    ns = with_source(lab, mistake_source(lab, "histogram_without_verify"))
    verify_name = "verify" if lab == "lab01_sampling" else "verify_tree_sampling"
    real = ns[verify_name]
    runs = run_checks(lab, ns, only={"test_histogram", "test_histogram_hidden"})
    for gid, (_, answer, verdict) in runs.items():
        assert not verdict.passed, gid
        assert "must count what" in verdict.message, verdict.message  # failed for ignoring verify, not for p
        assert all(decode(case["counts"]).sum() > 0 for case in answer)
    assert ns[verify_name] is real, "the probe must restore the student's verify"


def test_a_chain_fed_at_the_wrong_positions_fails_although_its_tokens_agree():
    lab = "lab04_eagle"
    ns = with_source(lab, mistake_source(lab, "chain_wrong_positions"))
    runs = run_checks(lab, ns, only={"test_chain", "test_chain_hidden", "test_chain_loop"})
    assert runs["test_chain"][2].passed, "the visible cases' argmax tokens agree: tokens alone cannot tell"
    for gid in ("test_chain_hidden", "test_chain_loop"):
        verdict = runs[gid][2]
        assert not verdict.passed and "wrong position" in verdict.message, (gid, verdict.message)
        assert "expected [" not in verdict.message, "the tokens agree: the probabilities tell the error"


HONEST_CHAIN = '''def eagle_chain(head, features, tokens, k):
    # no cache kept: every step feeds the whole sequence again, and scores all positions at once
    inputs, next_tokens, drafted = list(features), list(tokens[1:]), []
    for _ in range(k):
        out = head_forward(head, torch.stack(inputs), torch.tensor(next_tokens), torch.arange(len(inputs)),
                           head.new_cache())
        token = int(logits_of(out).argmax(-1)[-1])
        drafted.append(token)
        inputs.append(out[-1])
        next_tokens.append(token)
    return drafted
'''


def test_an_honest_chain_computed_another_way_passes():
    """Without a cache, scoring every position: the same distributions within the tolerance."""
    runs = run_checks("lab04_eagle", with_source("lab04_eagle", HONEST_CHAIN),
                      only={"test_chain", "test_chain_hidden", "test_chain_loop"})
    assert {gid: v.message for gid, (_, _, v) in runs.items() if not v.passed} == {}


def test_lab1_answered_from_its_own_inputs_earns_nothing():
    """`verify` returns an expected value when the grader's case carries one, else the draft and the most likely
    next token; the histogram samples p. Every check of those two functions fails."""
    cells = fixture_sources.ANSWERS_FROM_INPUTS
    ns = with_source("lab01_sampling", cells["verify"], cells["first_token_histogram"])
    runs = run_checks("lab01_sampling", ns, only={"test_verify", "test_verify_bonus_hidden",
                                                  "test_verify_rejection_hidden", "test_histogram",
                                                  "test_histogram_hidden"})
    assert [gid for gid, (_, _, verdict) in runs.items() if verdict.passed] == []


@pytest.mark.parametrize("seed", [5, 11])
def test_lab2_alpha_and_tau_must_describe_one_run_of_the_loop(seed):
    """Lab 2 measures alpha (the first drafted token's acceptance) and tau apart, so that the formula can be held
    against them. Tau taken from another run (generate's) and alpha taken as accepted / drafted both fail the
    hidden check, whose counts are made on the trusted side; the honest answer, and the same counts read another
    way, pass. The hidden run always keeps some first draft and rejects a later one, which is what tells alpha
    from accepted / drafted."""
    lab, gid = "lab02_loop", "test_measure_hidden"
    honest = run_checks(lab, pipeline.reference(lab), only={gid}, seed=seed)[gid]
    assert honest[2].passed, honest[2].message
    lengths, k = honest[0]["secret"]["lengths"], honest[0]["k"]
    assert any(2 <= n <= k for n in lengths), lengths
    another_way = run_checks(lab, with_source(lab, fixture_sources.MEASURE_FROM_LENGTHS), only={gid}, seed=seed)
    assert another_way[gid][2].passed, another_way[gid][2].message
    other_run = run_checks(lab, with_source(lab, fixture_sources.TAU_FROM_ANOTHER_RUN), only={gid}, seed=seed)
    verdict = other_run[gid][2]
    assert not verdict.passed and "one run of your loop" in verdict.message, verdict.message
    all_drafted = run_checks(lab, with_source(lab, mistake_source(lab, "alpha_over_all_drafted")), only={gid},
                             seed=seed)
    verdict = all_drafted[gid][2]
    assert not verdict.passed and "accepted / drafted" in verdict.message, verdict.message
