"""Check-yourself quizzes: question banks as JSON data files, graded in plain Python, shown as a widget.

A bank file (`lessons/quizzes/NN_topic.json`) holds a title and a list of questions of three kinds:

    {"id": "q1", "kind": "single",   "prompt": "...", "explanation": "...",
     "options": [{"text": "...", "correct": true, "feedback": "why this is right"},
                 {"text": "...", "correct": false, "feedback": "why this is wrong"}]}
    {"id": "q2", "kind": "multiple", ... same options, any number of them correct (at least one)}
    {"id": "q3", "kind": "numeric",  "prompt": "...", "answer": 3.36, "tolerance": 0.01, "explanation": "...",
     "mistakes": [{"value": 2.36, "feedback": "that forgets the bonus token"}]}

`Question.check(response)` grades a response (an option index, a collection of indices, or a number) and says
why; `QuizBank.answers()` gives the key, so graded labs can score the same questions. `Quiz` is the widget.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import ipywidgets as w

from specdec_lab.viz import COLORS
from specdec_lab.widgets.base import CourseWidget

KINDS = ("single", "multiple", "numeric")

# ipywidgets draws option labels on one line of fixed height (a checkbox's cut at 300 px with an ellipsis, a radio
# option running past the cell edge). Inside a quiz (class `specdec-quiz`) they wrap and take the full width.
QUIZ_CSS = """<style>
.specdec-quiz .widget-radio-box label, .specdec-quiz .widget-checkbox .widget-label-basic {
  white-space: normal; overflow: visible; text-overflow: clip; height: auto; line-height: 1.4; margin: 2px 0; }
.specdec-quiz .widget-checkbox { height: auto; }
</style>"""
FULL_WIDTH = {"width": "100%"}


@dataclass
class Option:
    """One choice: its text, whether it is correct, and the feedback a student who picks it sees."""

    text: str
    correct: bool
    feedback: str


@dataclass
class Mistake:
    """A typical wrong numeric answer and what it reveals (shown when a response lands near `value`)."""

    value: float
    feedback: str


@dataclass
class Feedback:
    """The grade of one response: correct or not, per-answer messages, and the question's explanation."""

    correct: bool
    messages: list[str]
    explanation: str


@dataclass
class Question:
    """One quiz question (see the module docstring for the file format).

    id: unique within its bank; kind: "single", "multiple" or "numeric"; prompt: the question (HTML allowed);
    explanation: shown after any attempt; options: the choices (choice kinds); answer / tolerance: the numeric
    key and the accepted absolute error; mistakes: typical wrong numbers with targeted feedback.
    """

    id: str
    kind: str
    prompt: str
    explanation: str
    options: list[Option] = field(default_factory=list)
    answer: float | None = None
    tolerance: float = 0.0
    mistakes: list[Mistake] = field(default_factory=list)

    @property
    def key(self) -> int | tuple[int, ...] | float:
        """The correct response: an option index (single), a sorted tuple of indices (multiple), or a number."""
        if self.kind == "numeric":
            return self.answer
        correct = tuple(i for i, option in enumerate(self.options) if option.correct)
        return correct[0] if self.kind == "single" else correct

    def check(self, response) -> Feedback:
        """Grade `response`: an option index (single), a collection of option indices (multiple), or a number.

        Raises ValueError for a response of the wrong shape (an index out of range, text for a number).
        """
        if self.kind == "numeric":
            return self._check_numeric(response)
        chosen = {response} if self.kind == "single" else set(response) if isinstance(response, Collection) else None
        if chosen is None or not all(isinstance(i, int) and 0 <= i < len(self.options) for i in chosen):
            raise ValueError(f"question {self.id!r}: a {self.kind} response must be "
                             f"{'an option index' if self.kind == 'single' else 'a collection of option indices'} "
                             f"in 0..{len(self.options) - 1}, got {response!r}")
        messages = [self.options[i].feedback for i in sorted(chosen)]
        if self.kind == "multiple":
            missed = [i for i, option in enumerate(self.options) if option.correct and i not in chosen]
            if missed:
                messages.append(f"You left out {len(missed)} correct option(s).")
        correct = chosen == {i for i, option in enumerate(self.options) if option.correct}
        return Feedback(correct, messages, self.explanation)

    def _check_numeric(self, response) -> Feedback:
        if isinstance(response, bool) or not isinstance(response, (int, float)) or math.isnan(response):
            raise ValueError(f"question {self.id!r}: a numeric response must be a number, got {response!r}")
        if abs(response - self.answer) <= self.tolerance:
            return Feedback(True, ["Right."], self.explanation)
        for mistake in self.mistakes:
            if abs(response - mistake.value) <= max(self.tolerance, 1e-9):
                return Feedback(False, [mistake.feedback], self.explanation)
        direction = "too low" if response < self.answer else "too high"
        return Feedback(False, [f"Not quite: {response:g} is {direction}."], self.explanation)


@dataclass
class QuizBank:
    """A lesson's questions. title: shown above the quiz; lesson: the notebook it belongs to."""

    title: str
    lesson: str
    questions: list[Question]

    def question(self, question_id: str) -> Question:
        """The question with this id (KeyError naming the known ids otherwise)."""
        for question in self.questions:
            if question.id == question_id:
                return question
        raise KeyError(f"no question {question_id!r} in {self.lesson!r}; ids: {[q.id for q in self.questions]}")

    def answers(self) -> dict[str, int | tuple[int, ...] | float]:
        """The answer key: question id -> `Question.key`."""
        return {question.id: question.key for question in self.questions}

    def score(self, responses: dict) -> tuple[int, int]:
        """(correct responses, number of questions) for `responses` (question id -> response; missing = wrong)."""
        right = sum(q.id in responses and q.check(responses[q.id]).correct for q in self.questions)
        return right, len(self.questions)


def validation_problems(data: dict) -> list[str]:
    """Everything wrong with a bank's JSON data (empty when it is valid): missing fields, unknown kinds,
    duplicate ids, single-choice questions without exactly one correct option, numeric keys that a listed
    mistake would also match, and missing feedback."""
    problems = [f"missing {name!r}" for name in ("title", "lesson", "questions") if name not in data]
    seen = set()
    for n, raw in enumerate(data.get("questions", [])):
        where = f"question {n} ({raw.get('id', '?')})"
        for name in ("id", "kind", "prompt", "explanation"):
            if not isinstance(raw.get(name), str) or not raw.get(name).strip():
                problems.append(f"{where}: {name!r} must be a non-empty string")
        if raw.get("id") in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(raw.get("id"))
        kind = raw.get("kind")
        if kind not in KINDS:
            problems.append(f"{where}: kind must be one of {KINDS}, got {kind!r}")
        elif kind == "numeric":
            problems += _numeric_problems(raw, where)
        else:
            problems += _choice_problems(raw, where, kind)
    return problems


def _numeric_problems(raw: dict, where: str) -> list[str]:
    answer, tolerance = raw.get("answer"), raw.get("tolerance", 0.0)
    if not isinstance(answer, (int, float)) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        return [f"{where}: numeric questions need a number 'answer' and a tolerance >= 0"]
    return [f"{where}: mistake {m.get('value')!r} lies within the tolerance of the answer"
            for m in raw.get("mistakes", [])
            if not isinstance(m.get("value"), (int, float)) or abs(m["value"] - answer) <= tolerance
            or not m.get("feedback")]


def _choice_problems(raw: dict, where: str, kind: str) -> list[str]:
    options = raw.get("options", [])
    problems = [] if len(options) >= 2 else [f"{where}: needs at least 2 options"]
    for i, option in enumerate(options):
        if not option.get("text") or not option.get("feedback") or not isinstance(option.get("correct"), bool):
            problems.append(f"{where}: option {i} needs 'text', 'feedback' and a boolean 'correct'")
    correct = sum(bool(option.get("correct")) for option in options)
    if kind == "single" and correct != 1:
        problems.append(f"{where}: a single-choice question needs exactly one correct option, has {correct}")
    if kind == "multiple" and correct < 1:
        problems.append(f"{where}: a multiple-answer question needs at least one correct option")
    return problems


def parse_bank(data: dict) -> QuizBank:
    """Build a `QuizBank` from JSON data, raising ValueError listing every problem if it is invalid."""
    problems = validation_problems(data)
    if problems:
        raise ValueError("invalid quiz bank:\n  " + "\n  ".join(problems))
    questions = [
        Question(id=q["id"], kind=q["kind"], prompt=q["prompt"], explanation=q["explanation"],
                 options=[Option(o["text"], o["correct"], o["feedback"]) for o in q.get("options", [])],
                 answer=q.get("answer"), tolerance=q.get("tolerance", 0.0),
                 mistakes=[Mistake(m["value"], m["feedback"]) for m in q.get("mistakes", [])])
        for q in data["questions"]
    ]
    return QuizBank(data["title"], data["lesson"], questions)


def load_bank(path: str | Path) -> QuizBank:
    """Load and validate a question bank from a JSON file (path relative to the working directory)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no quiz bank at {path.resolve()}")
    return parse_bank(json.loads(path.read_text(encoding="utf-8")))


class Quiz(CourseWidget):
    """The quiz widget: one control, one "check" button and one feedback area per question.

    bank: a `QuizBank` or the path of a bank file; static: force the text-only mode. Controls live in
    `controls[question_id]`: a RadioButtons whose value is an option index (single), a list of Checkboxes
    (multiple), or a Text holding a number (numeric). `check(question_id)` (what the button does) stores the `Feedback`
    in `results[question_id]`; `score` counts the correct ones.
    """

    def __init__(self, bank: QuizBank | str | Path, static: bool | None = None):
        super().__init__(static)
        self.bank = bank if isinstance(bank, QuizBank) else load_bank(bank)
        self.controls: dict = {}
        self.feedback: dict[str, w.HTML] = {}
        self.results: dict[str, Feedback] = {}
        boxes = [w.HTML(QUIZ_CSS + f"<h3>{html.escape(self.bank.title)}</h3>")]
        for number, question in enumerate(self.bank.questions, 1):
            boxes.append(self._question_box(number, question))
        self.ui = w.VBox(boxes, layout=FULL_WIDTH)
        self.ui.add_class("specdec-quiz")

    def _question_box(self, number: int, question: Question) -> w.VBox:
        if question.kind == "single":
            control = w.RadioButtons(options=[(o.text, i) for i, o in enumerate(question.options)], value=None,
                                     layout=FULL_WIDTH)
            shown = control
        elif question.kind == "multiple":
            control = [w.Checkbox(value=False, description=o.text, indent=False, layout=FULL_WIDTH)
                       for o in question.options]
            shown = w.VBox(control, layout=FULL_WIDTH)
        else:
            control = w.Text(value="", placeholder="a number", description="answer")
            shown = control
        self.controls[question.id] = control
        self.feedback[question.id] = w.HTML()
        button = w.Button(description="check")
        button.on_click(lambda _: self.check(question.id))
        return w.VBox([w.HTMLMath(f"<b>{number}.</b> {question.prompt}"), shown, button, self.feedback[question.id]],
                      layout=FULL_WIDTH)

    def response(self, question_id: str):
        """The current response to a question, read from its control (None when nothing is chosen yet)."""
        question, control = self.bank.question(question_id), self.controls[question_id]
        if question.kind == "multiple":
            return tuple(i for i, box in enumerate(control) if box.value)
        if question.kind == "numeric":
            text = control.value.strip()
            try:
                return float(text) if text else None
            except ValueError:
                return text  # not a number: `check` says so
        return control.value

    def check(self, question_id: str) -> Feedback | None:
        """Grade the current response to a question, store and show the feedback (None if unanswered)."""
        response = self.response(question_id)
        if response is None:
            self.feedback[question_id].value = "<i>Choose an answer first.</i>"
            return None
        try:
            result = self.bank.question(question_id).check(response)
        except ValueError:
            self.feedback[question_id].value = f"<i>{html.escape(str(response))!s} is not a number.</i>"
            return None
        self.results[question_id] = result
        colour, verdict = (COLORS["accepted"], "Correct.") if result.correct else (COLORS["rejected"], "Not yet.")
        messages = "".join(f"<li>{message}</li>" for message in result.messages)
        self.feedback[question_id].value = (f"<b style='color:{colour}'>{verdict}</b><ul>{messages}</ul>"
                                            f"<i>{result.explanation}</i>")
        return result

    @property
    def score(self) -> int:
        """How many questions were answered correctly at their last check."""
        return sum(result.correct for result in self.results.values())

    def summary(self) -> str:
        lines = [f"{self.bank.title} ({len(self.bank.questions)} questions; open the notebook in JupyterLab to "
                 "answer them interactively)"]
        for number, question in enumerate(self.bank.questions, 1):
            lines.append(f"{number}. [{question.kind}] {question.prompt}")
            lines += [f"   ({chr(97 + i)}) {option.text}" for i, option in enumerate(question.options)]
        return "\n".join(lines)
