"""What a student sees of the widgets and the benchmark report, as far as Python can see it: option labels that
wrap at the full width instead of being cut, labels shown whole, a visible busy state while a run is under way,
a drop-down that starts on the path its readout names, and report charts in the course style. (The browser
suite, tests/test_browser.py, checks the same things drawn.)"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from specdec_lab import report, viz
from specdec_lab.drafters import DraftModelDrafter
from specdec_lab.models import zoo_path
from specdec_lab.widgets import Quiz, StepThrough, TreeView, toy_tree
from specdec_lab.widgets.quiz import QUIZ_CSS

LONG = "a long option that says a great deal about acceptance rates, " * 4
OPTIONS = [{"text": LONG, "correct": True, "feedback": "f"}, {"text": "b", "correct": False, "feedback": "g"}]

BANK = {
    "title": "layout", "lesson": "99_layout",
    "questions": [
        {"id": "one", "kind": "single", "prompt": "pick", "explanation": "e",
         "options": OPTIONS},
        {"id": "many", "kind": "multiple", "prompt": "pick", "explanation": "e",
         "options": OPTIONS},
    ],
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))


def test_quiz_options_take_the_full_width_and_wrap(tmp_path):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(BANK))
    quiz = Quiz(str(path), static=False)
    radio, boxes = quiz.controls["one"], quiz.controls["many"]
    assert radio.layout.width == "100%"  # was max-content: a long option ran past the cell edge
    assert all(box.layout.width == "100%" and box.description == option["text"]
               for box, option in zip(boxes, BANK["questions"][1]["options"], strict=True))  # was 300 px, cut
    assert "specdec-quiz" in quiz.ui._dom_classes and quiz.ui.layout.width == "100%"
    assert QUIZ_CSS in quiz.ui.children[0].value  # the rule that lets labels wrap ships with the quiz
    assert "white-space: normal" in QUIZ_CSS and "text-overflow: clip" in QUIZ_CSS


def test_step_through_labels_whole_and_busy_while_running(llama_factory, tokenizer):
    target = llama_factory(vocab_size=4096, hidden_size=32, num_layers=1, seed=3)
    draft = llama_factory(vocab_size=4096, hidden_size=32, num_layers=1, seed=4)
    seen, made = [], {}

    def make_drafter(k: int) -> DraftModelDrafter:  # called at the start of every run: record what shows then
        if "widget" in made:
            widget = made["widget"]
            seen.append((widget.busy, widget.next_button.disabled, widget.temperature.disabled, widget.view.value))
        return DraftModelDrafter(draft, k)

    widget = made["widget"] = StepThrough(target, tokenizer, make_drafter=make_drafter, prompt="def f(x):", k=2,
                                          max_new_tokens=8, static=False)
    for control in (widget.k, widget.temperature, widget.seed):
        assert control.style.description_width == "initial"  # the label's own width: no "temperat…"
    assert not widget.busy and not widget.next_button.disabled and not widget.temperature.disabled
    shown = widget.view.value
    assert shown.startswith("<b>step 1 /")
    widget.temperature.value = 0.0  # a re-run: the old step stays visible, greyed under a note
    busy, next_disabled, slider_disabled, view = seen[0]
    assert busy and next_disabled and slider_disabled
    assert "running the new settings" in view and shown in view and "opacity" in view
    assert not widget.busy and widget.view.value.startswith("<b>step 1 /")
    assert not any(control.disabled for control in (widget.prompt, widget.k, widget.seed, widget.run_button))


def test_step_through_is_not_left_busy_by_a_failed_run(llama_factory, tokenizer):
    target = llama_factory(vocab_size=4096, hidden_size=32, num_layers=1, seed=3)
    calls = []

    def make_drafter(k: int):
        calls.append(k)
        if len(calls) > 1:
            raise RuntimeError("drafter broke")
        return DraftModelDrafter(target, k)

    widget = StepThrough(target, tokenizer, make_drafter=make_drafter, k=2, max_new_tokens=4, static=False)
    with pytest.raises(RuntimeError, match="drafter broke"):
        widget.k.value = 3
    assert not widget.busy and not widget.k.disabled


def test_tree_view_drop_down_starts_on_the_path_the_readout_names(tokenizer):
    ids = tokenizer.encode(" def class import return")
    tree = toy_tree(ids[:4], [-1, 0, 0, -1])  # paths: (0, 1), (0, 2), (3,); the target kept 0 then 2
    view = TreeView([(tree, [0, 2]), (tree, []), (tree, [3])], tokenizer.decode, static=False)
    assert view.path_choice.value == 1 and view.path_choice.label == repr(view.paths[1])
    assert view.selected_path == view.paths[1] and view.paths[1] in view.readout.value.replace("·", " ")
    view.step.value = 2  # nothing accepted: the first path
    assert view.path_choice.value == 0 and view.selected_path == view.paths[0]
    view.step.value = 3
    assert view.path_choice.value == 2 and view.selected_path == tokenizer.decode([ids[3]])


def test_report_charts_use_the_course_style():
    row = {"speedup": 1.5, "tau": 2.5, "tokens_per_second": 100.0, "per_position_acceptance": [0.9, 0.7]}
    result = {"sets": {"heldout": {"methods": {"draft": row, "plain": {**row, "per_position_acceptance": []}}}}}
    reference = viz.style(viz.go.Figure(), "reference")
    for figure in report.figures(result):
        layout = figure.layout
        assert layout.template == reference.layout.template  # plotly_white, not plotly's default
        assert layout.font.family == viz.FONT and list(layout.colorway) == viz.SEQUENCE
        assert layout.title.x == reference.layout.title.x and layout.title.text
        assert layout.yaxis.title.text  # every axis says what it counts
