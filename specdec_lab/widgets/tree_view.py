"""The tree view: what a tree drafter (Medusa, EAGLE-2) proposed at each step, and which path the target kept.

Feed it the `StepRecord`s of a run (`generate(..., on_step=records.append)`) whose drafts are trees
(`Draft.parents` set), or (tree, accepted path) pairs built by hand. A slider walks through the steps; a
drop-down picks one root-to-leaf path to read as text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as w
import torch

from specdec_lab import viz
from specdec_lab.decode import StepRecord
from specdec_lab.tree import DraftTree
from specdec_lab.widgets.base import CourseWidget, show_token


def trees_from_records(records: Sequence[StepRecord]) -> list[tuple[DraftTree, list[int]]]:
    """The (draft tree, accepted node path) of every step of a run; chain drafts count as one-path trees.

    records: the `StepRecord`s that `generate(on_step=...)` reported.
    """
    steps = []
    for record in records:
        draft, verdict = record.draft, record.verdict
        if draft.parents is not None:
            tree = DraftTree.from_parents(draft.tokens, draft.parents)
            steps.append((tree, list(getattr(verdict, "path", []))))
        else:
            steps.append((DraftTree.chain(draft.tokens), list(range(verdict.accepted))))
    return steps


class TreeView(CourseWidget):
    """Slider over a run's draft trees (starting at the first non-empty one); the accepted path is drawn in green.

    steps: (DraftTree, accepted node indices) per step, e.g. from `trees_from_records`; decode: token ids ->
    text (a tokenizer's `decode`); static: force the text-only mode. State: `position`, `tree`, `accepted`,
    `figure`, `paths` (every root-to-leaf path as text), `selected_path` (the drop-down's choice; at first the path
    through the accepted tokens).
    """

    def __init__(self, steps: Sequence[tuple[DraftTree, list[int]]], decode: Callable[[list[int]], str],
                 static: bool | None = None):
        super().__init__(static)
        if not steps:
            raise ValueError("no draft trees to show: run generate(..., on_step=records.append) with a drafter first")
        self.steps, self.decode = list(steps), decode
        first = next((i for i, (tree, _) in enumerate(self.steps) if len(tree)), 0)  # skip empty drafts
        self.step = w.IntSlider(value=first + 1, min=1, max=len(self.steps), description="step",
                                continuous_update=False)
        self.path_choice = w.Dropdown(description="path", layout={"width": "500px"})
        self.readout = w.HTML()
        self.plot = w.Output()
        self.step.observe(self._update, names="value")
        self.path_choice.observe(self._update_path, names="value")
        self.ui = w.VBox([w.HBox([self.step, self.path_choice]), self.readout, self.plot])
        self._update()

    @classmethod
    def from_records(cls, records: Sequence[StepRecord], decode: Callable[[list[int]], str],
                     static: bool | None = None) -> TreeView:
        """A tree view of a recorded run (see `trees_from_records`)."""
        return cls(trees_from_records(records), decode, static)

    def _text(self, nodes: Sequence[int]) -> str:
        return self.decode(self.tree.tokens[list(nodes)].tolist()) if nodes else ""

    def _update(self, change=None) -> None:
        self.position = self.step.value - 1
        self.tree, self.accepted = self.steps[self.position]
        labels = [self.decode([t]) for t in self.tree.tokens.tolist()]
        self.figure = viz.draft_tree(self.tree.parents.tolist(), labels, self.accepted,
                                     title=f"Step {self.step.value}: {len(self.tree)} candidates, "
                                           f"{len(self.accepted)} accepted (green)")
        paths = self.tree.paths()
        self.paths = [self._text(path) for path in paths]
        self.path_choice.options = [(repr(text), i) for i, text in enumerate(self.paths)]
        # New options leave a Dropdown blank: show the path the readout names, the one through the accepted tokens.
        through_accepted = (i for i, path in enumerate(paths) if path[: len(self.accepted)] == self.accepted)
        self.path_choice.value = next(through_accepted, 0) if paths else None
        self._update_path()
        self._show_figure(self.plot, self.figure)

    def _update_path(self, change=None) -> None:
        index = self.path_choice.value if self.path_choice.value is not None else 0
        self.selected_path = self.paths[index] if self.paths else ""
        self.readout.value = (f"{len(self.tree)} nodes, depth {self.tree.max_depth}, {len(self.paths)} paths; "
                              f"accepted: <code>{show_token(self._text(self.accepted))}</code>; "
                              f"selected path: <code>{show_token(self.selected_path)}</code>")

    def summary(self) -> str:
        return (f"step {self.step.value}/{len(self.steps)}: {len(self.tree)} nodes, depth {self.tree.max_depth}, "
                f"{len(self.paths)} root-to-leaf paths; accepted {len(self.accepted)} tokens: "
                f"{self._text(self.accepted)!r}")


def toy_tree(tokens: Sequence[int], parents: Sequence[int]) -> DraftTree:
    """A `DraftTree` from plain lists (for hand-made examples in lessons and tests)."""
    return DraftTree.from_parents(torch.tensor(list(tokens), dtype=torch.long), list(parents))
