"""The lesson widgets, driven through their controls (setting `.value`, clicking buttons), with assertions on
the state they keep in Python. Runs headless: displaying a widget prints its static summary."""

from __future__ import annotations

import json

import ipywidgets as w
import pytest
import torch
from transformers import AutoTokenizer

from specdec_lab import theory
from specdec_lab.decode import generate
from specdec_lab.drafters import DraftModelDrafter, PromptLookupDrafter
from specdec_lab.models import zoo_path
from specdec_lab.widgets import Quiz, SpeedupExplorer, StepThrough, TreeView, base, toy_tree, trees_from_records
from specdec_lab.widgets.base import headless, in_kernel
from specdec_lab.widgets.quiz import parse_bank, validation_problems

VOCAB = 4096  # the zoo tokenizer's vocabulary, so random models can use it


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))


@pytest.fixture(scope="module")
def pair(llama_factory):
    """A random target and a draft that is a noisy copy of it (so some tokens are accepted, some not)."""
    target = llama_factory(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, logit_scale=3.0)
    draft = llama_factory(vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3, logit_scale=3.0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(1.0 * parameter.std() * torch.randn(parameter.shape, generator=generator))
    return target, draft


def test_headless_switch(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert not in_kernel() and headless()  # pytest is no Jupyter kernel: summaries are printed
    monkeypatch.setattr(base, "in_kernel", lambda: True)
    assert not headless()  # in a kernel: live widget, with its text as the fallback
    assert headless(True)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert headless()
    assert not headless(False)


def test_in_a_kernel_one_display_carries_the_widget_and_its_text(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setattr(base, "in_kernel", lambda: True)
    explorer = SpeedupExplorer(alpha=0.8, gamma=4, c=0.1)
    assert not explorer.static
    shown = []
    monkeypatch.setattr(base, "display", lambda obj, **kwargs: shown.append((obj, kwargs)))
    explorer.show()
    [(bundle, kwargs)] = shown
    # A front end that draws widgets picks the view; nbconvert / papermill store the text, which viewers show.
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.ui.model_id
    assert bundle["text/plain"] == explorer.summary() and kwargs == {"raw": True}


def test_figures_reach_their_output_widget_as_state_never_by_capture(monkeypatch):
    # Capturing a display into an Output widget makes the front end (or nbclient) send the outputs back to the
    # kernel on the shell channel, which can leave nbclient waiting for a reply until its timeout. Forbid it.
    def no_capture(self):
        raise AssertionError("a display was captured into an Output widget")

    monkeypatch.setattr(w.Output, "__enter__", no_capture)
    monkeypatch.setattr(w.Output, "clear_output", lambda self, *a, **k: no_capture(self))
    monkeypatch.setattr(base, "in_kernel", lambda: True)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    explorer = SpeedupExplorer(alpha=0.8, gamma=4, c=0.1)
    explorer.alpha.value = 0.6  # a slider move redraws the figure
    [shown] = explorer.plot.outputs
    assert shown["output_type"] == "display_data"
    assert shown["data"]["application/vnd.plotly.v1+json"]["data"][-1]["x"] == [0.6]  # the "you are here" marker
    view = TreeView([(toy_tree([5, 6, 7], [-1, 0, 0]), [0, 2])], decode=lambda ids: " ".join(map(str, ids)))
    assert len(view.plot.outputs) == 1


def test_explorer_follows_its_sliders(capsys):
    explorer = SpeedupExplorer(alpha=0.8, gamma=4, c=0.1, static=True)
    assert explorer.tau == pytest.approx(theory.expected_tokens_per_step(0.8, 4))
    explorer.alpha.value = 0.5
    explorer.gamma.value = 2
    explorer.c.value = 0.3
    assert explorer.tau == pytest.approx(1.75)
    assert explorer.speedup == pytest.approx(1.75 / 1.6)
    assert explorer.best_gamma == theory.optimal_gamma(0.5, 0.3, explorer.max_gamma)
    assert "1.09x" in explorer.readout.value
    marker = explorer.figure.data[-1]
    assert (marker.x[0], marker.y[0]) == (0.5, 2)
    explorer.c.value = 1.0  # a draft as slow as the target never pays
    assert explorer.speedup < 1 and explorer.best_gamma == 0
    assert "do not speculate" in explorer.readout.value
    explorer.show()
    assert "expected speedup" in capsys.readouterr().out


def test_step_through_calls_a_greedy_correction_corrected_not_resampled(pair, tokenizer):
    target, draft = pair
    widget = StepThrough(target, tokenizer, draft_model=draft, prompt="def f(x):", k=3, temperature=0.0,
                         max_new_tokens=24, static=True)
    ends = [step.tokens[-1].verdict for step in widget.steps]
    assert "corrected" in ends and "resampled" not in ends  # at temperature 0 nothing is drawn from a residual
    assert all(step.tokens[-1].verdict == "corrected" for step in widget.steps if step.accepted < step.drafted)
    widget.go_to(ends.index("corrected"))
    assert "corrected" in widget.view.value and "resampled" not in widget.view.value


def test_step_through_records_verdicts_and_moves(pair, tokenizer, capsys):
    target, draft = pair
    widget = StepThrough(target, tokenizer, draft_model=draft, prompt="def f(x):", k=3, temperature=1.0, seed=1,
                         max_new_tokens=24, static=True)
    reference = generate(target, widget.prompt_ids, drafter=DraftModelDrafter(draft, 3), max_new_tokens=24,
                         temperature=1.0, seed=1)
    assert widget.output.tokens == reference.tokens
    # The first draft is verified in the prefill forward: every target forward is a step.
    assert widget.position == 0 and len(widget.steps) == reference.stats.target_forwards
    assert widget.steps[-1].running_tau == pytest.approx(reference.stats.mean_accepted_tokens)
    for step in widget.steps:
        verdicts = [t.verdict for t in step.tokens]
        assert verdicts[: step.accepted] == ["accepted"] * step.accepted
        assert verdicts[-1] in ("resampled", "bonus")
        assert (verdicts[-1] == "bonus") == (step.accepted == step.drafted)
        if verdicts[-1] == "resampled":
            assert verdicts[-2] == "rejected"
        assert [t.token for t in step.tokens if t.verdict != "rejected"] == step.emitted[: len(step.emitted)]
        assert all(0 <= t.p <= 1 for t in step.tokens)
    assert widget.steps[-1].running_tau == pytest.approx(reference.stats.mean_accepted_tokens)
    assert {t.verdict for s in widget.steps for t in s.tokens} >= {"accepted", "rejected", "resampled"}

    widget.next_button.click()
    widget.next_button.click()
    assert widget.position == 2
    widget.previous_button.click()
    assert widget.position == 1 and "step 2 /" in widget.view.value
    widget.run_button.click()
    assert widget.position == len(widget.steps) - 1
    assert widget.text_so_far() == tokenizer.decode(widget.prompt_ids + widget.output.tokens)
    widget.next_button.click()  # past the end stays at the end
    assert widget.position == len(widget.steps) - 1

    widget.k.value = 1  # any control change re-runs from the first step
    assert widget.position == 0 and all(step.drafted <= 1 for step in widget.steps)
    widget.temperature.value = 0.0
    greedy = generate(target, widget.prompt_ids, max_new_tokens=24)
    assert widget.output.tokens == greedy.tokens  # greedy speculative decoding = greedy target decoding
    widget.prompt.value = "import os"
    assert widget.prompt_ids == tokenizer.encode("import os")
    widget.show()
    assert "verification steps" in capsys.readouterr().out


def test_step_through_takes_other_drafters(pair, tokenizer):
    target, _ = pair
    widget = StepThrough(target, tokenizer, make_drafter=lambda k: PromptLookupDrafter(max_ngram=2, k=k),
                         prompt="a = b; a = b; a = b; a =", temperature=0.0, max_new_tokens=12, static=True)
    assert widget.steps and all(t.q in (None, 1.0) for s in widget.steps for t in s.tokens)
    with pytest.raises(ValueError, match="exactly one"):
        StepThrough(target, tokenizer, static=True)


def test_tree_view_walks_steps_and_paths(tokenizer, capsys):
    ids = tokenizer.encode(" def class import return")
    # root -> a -> b, root -> a -> c, root -> d : three paths; the target kept a, c
    tree = toy_tree([ids[0], ids[1], ids[2], ids[3]], [-1, 0, 0, -1])
    chain = toy_tree([ids[3], ids[0]], [-1, 0])
    view = TreeView([(tree, [0, 2]), (chain, [])], tokenizer.decode, static=True)
    assert view.position == 0 and len(view.paths) == 3
    assert view.paths == [tokenizer.decode([ids[0], ids[1]]), tokenizer.decode([ids[0], ids[2]]),
                          tokenizer.decode([ids[3]])]
    green = [node for node, colour in enumerate(view.figure.data[-1].marker.color) if colour == "#2ca02c"]
    assert green == [0, 2]
    view.path_choice.value = 1
    assert view.selected_path == tokenizer.decode([ids[0], ids[2]])
    view.step.value = 2
    assert view.tree is chain and view.accepted == [] and len(view.paths) == 1
    view.show()
    assert "accepted 0 tokens" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no draft trees"):
        TreeView([], tokenizer.decode)
    starts_empty = TreeView([(toy_tree([], []), []), (chain, [0])], tokenizer.decode, static=True)
    assert starts_empty.step.value == 2 and starts_empty.accepted == [0]  # the first non-empty step is shown


def test_trees_from_a_chain_run(pair):
    target, draft = pair
    records = []
    generate(target, [5, 6, 7], drafter=DraftModelDrafter(draft, 3), max_new_tokens=10, on_step=records.append)
    steps = trees_from_records(records)
    assert len(steps) == len(records)
    for (tree, path), record in zip(steps, records, strict=True):
        assert tree.max_depth == len(record.draft) and path == list(range(record.verdict.accepted))


BANK = {
    "title": "t", "lesson": "99_test",
    "questions": [
        {"id": "one", "kind": "single", "prompt": "pick b", "explanation": "b it is",
         "options": [{"text": "a", "correct": False, "feedback": "not a"},
                     {"text": "b", "correct": True, "feedback": "yes b"}]},
        {"id": "many", "kind": "multiple", "prompt": "pick a and c", "explanation": "a and c",
         "options": [{"text": "a", "correct": True, "feedback": "a ok"},
                     {"text": "b", "correct": False, "feedback": "b no"},
                     {"text": "c", "correct": True, "feedback": "c ok"}]},
        {"id": "num", "kind": "numeric", "prompt": "3.36?", "answer": 3.36, "tolerance": 0.01, "explanation": "sum",
         "mistakes": [{"value": 2.36, "feedback": "forgot the bonus"}]},
    ],
}


def test_question_grading_and_answer_key():
    bank = parse_bank(BANK)
    assert bank.answers() == {"one": 1, "many": (0, 2), "num": 3.36}
    one, many, num = bank.questions
    assert one.check(1).correct and one.check(1).messages == ["yes b"]
    assert not one.check(0).correct and one.check(0).explanation == "b it is"
    assert many.check([0, 2]).correct
    partial = many.check([0])
    assert not partial.correct and "left out 1" in partial.messages[-1]
    assert not many.check([0, 1, 2]).correct
    assert num.check(3.365).correct and not num.check(3.5).correct
    assert num.check(2.36).messages == ["forgot the bonus"]
    assert "too low" in num.check(1.0).messages[0]
    assert bank.score({"one": 1, "many": (0, 2), "num": 2.0}) == (2, 3)
    with pytest.raises(ValueError, match="option index"):
        one.check(5)
    with pytest.raises(ValueError, match="must be a number"):
        num.check("three")
    with pytest.raises(KeyError, match="no question"):
        bank.question("nope")


def test_bank_validation_names_the_problems():
    broken = json.loads(json.dumps(BANK))
    broken["questions"][0]["options"][0]["correct"] = True  # two correct answers for a single choice
    broken["questions"][2]["mistakes"][0]["value"] = 3.365  # a "mistake" that is graded correct
    broken["questions"][1]["id"] = "one"
    problems = validation_problems(broken)
    assert any("exactly one correct" in p for p in problems)
    assert any("within the tolerance" in p for p in problems)
    assert any("duplicate id" in p for p in problems)
    with pytest.raises(ValueError, match="invalid quiz bank"):
        parse_bank(broken)


def test_quiz_widget_driven_by_its_controls(tmp_path, capsys):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(BANK))
    quiz = Quiz(str(path), static=True)
    assert quiz.check("one") is None and "Choose an answer" in quiz.feedback["one"].value
    quiz.controls["one"].value = 0
    assert not quiz.check("one").correct and "not a" in quiz.feedback["one"].value
    quiz.controls["one"].value = 1
    assert quiz.check("one").correct and quiz.score == 1
    quiz.controls["many"][0].value = True
    quiz.controls["many"][2].value = True
    assert quiz.response("many") == (0, 2)
    quiz.controls["num"].value = "2.36"
    quiz.check("num")
    assert not quiz.results["num"].correct and "forgot the bonus" in quiz.feedback["num"].value
    quiz.controls["num"].value = "three"
    assert quiz.check("num") is None and "not a number" in quiz.feedback["num"].value
    quiz.controls["num"].value = "3.36"
    # the button does what check() does
    buttons = [child for box in quiz.ui.children[1:] for child in box.children if hasattr(child, "on_click")]
    for button in buttons:
        button.click()
    assert quiz.score == 3 and set(quiz.results) == {"one", "many", "num"}
    quiz.show()
    out = capsys.readouterr().out
    assert "3 questions" in out and "(b) b" in out
