"""Step through one speculative decoding run, one verification step at a time.

Each step shows what the drafter proposed, the target's verdict on every drafted token (accepted, rejected,
and the token the target adds itself: after a rejection the target's correction, resampled from the residual when
sampling or its own argmax ("corrected") at temperature 0, or a bonus token when all were kept), the
probabilities p(x) and q(x) behind each verdict, and the running tau (tokens per target forward).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as w
import torch

from specdec_lab.decode import StepRecord, generate
from specdec_lab.drafters import Drafter, DraftModelDrafter
from specdec_lab.viz import COLORS
from specdec_lab.widgets.base import CourseWidget, show_token


@dataclass
class TokenVerdict:
    """One token of a step: its id and text, its verdict, and p(x), q(x) at its position (q is None for the
    target's own token)."""

    token: int
    text: str
    verdict: str  # "accepted", "rejected", "resampled" (sampling), "corrected" (temperature 0) or "bonus"
    p: float
    q: float | None


@dataclass
class StepView:
    """What one verification step did: the verdict per drafted token plus the target's own token, the tokens
    it emitted, tau over the run so far (the prefill forward included, as in `DecodeStats`), and how many
    tokens were drafted."""

    tokens: list[TokenVerdict]
    emitted: list[int]
    running_tau: float
    drafted: int

    @property
    def accepted(self) -> int:
        return sum(t.verdict == "accepted" for t in self.tokens)


def describe_step(record: StepRecord, decode: Callable[[list[int]], str], greedy: bool = False) -> list[TokenVerdict]:
    """Turn a `StepRecord` into per-token verdicts with p(x) and q(x).

    record: what `generate(on_step=...)` reported; decode: token ids -> text; greedy: the run decoded at
    temperature 0, where the target's token after a rejection is its argmax ("corrected"), not a draw from the
    residual ("resampled"). q(x) is the draft's processed probability (1.0 for a deterministic or greedy draft,
    whose q is one-hot).
    """
    draft, verdict, p = record.draft.tokens.tolist(), record.verdict, record.target_probs
    rows = []
    for i, token in enumerate(draft[: verdict.accepted + 1]):
        q = float(record.draft.probs[i, token]) if record.draft.probs is not None else 1.0
        kind = "accepted" if i < verdict.accepted else "rejected"
        rows.append(TokenVerdict(token, decode([token]), kind, float(p[i, token]), q))
    extra = verdict.next_token
    correction = "corrected" if greedy else "resampled"
    rows.append(TokenVerdict(extra, decode([extra]), correction if verdict.resampled else "bonus",
                             float(p[verdict.accepted, extra]), None))
    return rows


def verdict_color(verdict: str) -> str:
    """The course colour of a verdict (a greedy correction wears the resampled token's colour)."""
    return COLORS["resampled" if verdict == "corrected" else verdict]


class StepThrough(CourseWidget):
    """A step-through of `generate` with a drafter: controls for prompt, k, temperature and seed; buttons for
    previous / next / run (to the last step). Any control change re-runs the generation from the start.

    target: the target causal LM; tokenizer: its tokenizer (encode/decode); draft_model: a draft LM for
    `DraftModelDrafter` (or give `make_drafter(k)` to step through another drafter); prompt, k, temperature,
    seed: initial control values; max_new_tokens: length of each run; static: force the text-only mode.
    State: `steps` (one `StepView` per verification step), `position` (index of the step shown),
    `prompt_ids`, `output` (the `GenerationOutput`), `busy` (True while a run is under way: the controls are
    disabled and the old step is greyed out under a note).
    """

    def __init__(self, target: torch.nn.Module, tokenizer, draft_model: torch.nn.Module | None = None,
                 make_drafter: Callable[[int], Drafter] | None = None, prompt: str = "def ", k: int = 4,
                 temperature: float = 0.8, seed: int = 0, max_new_tokens: int = 32, static: bool | None = None):
        super().__init__(static)
        if (draft_model is None) == (make_drafter is None):
            raise ValueError("give exactly one of draft_model (for DraftModelDrafter) or make_drafter(k)")
        self.target, self.tokenizer, self.max_new_tokens = target, tokenizer, max_new_tokens
        self.make_drafter = make_drafter or (lambda k: DraftModelDrafter(draft_model, k))
        self.prompt = w.Textarea(value=prompt, description="prompt", continuous_update=False,
                                 layout={"width": "600px"})
        label = {"description_width": "initial"}  # the label's own width: "temperature" in full, not "temperat…"
        self.k = w.IntSlider(value=k, min=1, max=8, description="k", continuous_update=False, style=label)
        self.temperature = w.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.05, description="temperature",
                                         continuous_update=False, style=label)
        self.seed = w.IntText(value=seed, description="seed", style=label, layout={"width": "140px"})
        self.previous_button = w.Button(description="◀ previous")
        self.next_button = w.Button(description="next ▶")
        self.run_button = w.Button(description="run ▶▶", tooltip="show the run up to its last step")
        self.view = w.HTML()
        self.busy = False
        for control in (self.prompt, self.k, self.temperature, self.seed):
            control.observe(self._regenerate, names="value")
        self.previous_button.on_click(lambda _: self.go_to(self.position - 1))
        self.next_button.on_click(lambda _: self.go_to(self.position + 1))
        self.run_button.on_click(lambda _: self.go_to(len(self.steps) - 1))
        self.ui = w.VBox([self.prompt, w.HBox([self.k, self.temperature, self.seed]),
                          w.HBox([self.previous_button, self.next_button, self.run_button]), self.view])
        self._regenerate()

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _set_busy(self, busy: bool) -> None:
        """Show that a run is under way (controls disabled, the old step greyed under a note) or over."""
        self.busy = busy
        for control in (self.prompt, self.k, self.temperature, self.seed, self.previous_button, self.next_button,
                        self.run_button):
            control.disabled = busy
        if busy and self.view.value:
            self.view.value = (f"<div class='specdec-busy'><b>⏳ running the new settings…</b>"
                               f"<div style='opacity:0.35'>{self.view.value}</div></div>")

    def _regenerate(self, change=None) -> None:
        self._set_busy(True)
        try:
            self._generate()
        finally:
            self._set_busy(False)
        self.go_to(0)

    def _generate(self) -> None:
        self.prompt_ids = self.tokenizer.encode(self.prompt.value) or [0]
        records: list[StepRecord] = []
        self.output = generate(self.target, self.prompt_ids, drafter=self.make_drafter(self.k.value),
                               max_new_tokens=self.max_new_tokens, temperature=self.temperature.value,
                               seed=self.seed.value, on_step=records.append)
        # 1 when a prefill forward emitted the first token on its own; 0 when the first draft was verified in
        # the prefill forward itself (drafters that draft from the prompt).
        self.prefill_tokens = len(self.output.tokens) - sum(len(record.emitted) for record in records)
        forwards = emitted = self.prefill_tokens
        self.steps: list[StepView] = []
        for record in records:
            forwards, emitted = forwards + 1, emitted + len(record.emitted)
            self.steps.append(StepView(describe_step(record, self._decode, greedy=self.temperature.value == 0),
                                       record.emitted, emitted / forwards,
                                       len(record.draft)))

    def go_to(self, position: int) -> None:
        """Show step `position` (clamped to the run's steps)."""
        self.position = max(0, min(position, len(self.steps) - 1))
        self.view.value = self._render()

    @property
    def current(self) -> StepView | None:
        """The step shown now (None when the run had no verification step)."""
        return self.steps[self.position] if self.steps else None

    def text_so_far(self) -> str:
        """Prompt plus the tokens emitted up to and including the step shown."""
        first = self.output.tokens[: self.prefill_tokens]
        later = [t for step in self.steps[: self.position + 1] for t in step.emitted]
        return self._decode(self.prompt_ids + first + later)

    def _render(self) -> str:
        step = self.current
        if step is None:
            return "<i>no verification step: the run ended at the prefill</i>"
        chips = " ".join(
            f"<span style='background:{verdict_color(t.verdict)};color:white;padding:2px 5px;border-radius:4px;"
            f"font-family:monospace'>{show_token(t.text)}</span>" for t in step.tokens)
        rows = "".join(
            f"<tr><td>{i + 1}</td><td style='font-family:monospace'>{show_token(t.text)}</td>"
            f"<td>{'' if t.q is None else f'{t.q:.3f}'}</td><td>{t.p:.3f}</td>"
            f"<td>{'' if t.q is None else f'{min(1.0, t.p / t.q):.3f}'}</td>"
            f"<td style='color:{verdict_color(t.verdict)}'><b>{t.verdict}</b></td></tr>"
            for i, t in enumerate(step.tokens))
        return (f"<b>step {self.position + 1} / {len(self.steps)}</b> &nbsp; accepted {step.accepted} of "
                f"{step.drafted} drafted, "
                f"running tau = {step.running_tau:.2f}<br>{chips}"
                "<table><tr><th>#</th><th>token</th><th>q(x)</th><th>p(x)</th><th>min(1, p/q)</th><th>verdict</th>"
                f"</tr>{rows}</table><pre style='white-space:pre-wrap'>{html.escape(self.text_so_far())}</pre>")

    def summary(self) -> str:
        step = self.current
        head = (f"k={self.k.value} temperature={self.temperature.value} seed={self.seed.value}: "
                f"{len(self.steps)} verification steps, tau={self.output.stats.mean_accepted_tokens:.2f}")
        if step is None:
            return head
        verdicts = ", ".join(f"{t.text!r}:{t.verdict}" for t in step.tokens)
        return f"{head}\nstep {self.position + 1}: {verdicts} (running tau {step.running_tau:.2f})"
