"""What every course widget shares: state in plain Python, and a static fallback when no front end is attached.

A widget keeps everything it shows in ordinary attributes (so tests and graded labs can drive it by setting
a control's `.value` and reading the attributes back) and renders through `ipywidgets.HTML` values and an
`Output` for plotly figures. When no browser front end can draw it (nbgrader sets `NBGRADER_EXECUTION` while
grading; `static=True` asks for it explicitly) displaying the widget prints a text summary instead.
"""

from __future__ import annotations

import html
import os
from abc import ABC, abstractmethod

import ipywidgets as w
from IPython.display import display


def headless(static: bool | None = None) -> bool:
    """True when widgets should print static summaries: `static` if given, else whether nbgrader is running
    (`NBGRADER_EXECUTION`) or `SPECDEC_STATIC_WIDGETS` is set (the lesson tests set it)."""
    if static is not None:
        return static
    return bool(os.environ.get("NBGRADER_EXECUTION") or os.environ.get("SPECDEC_STATIC_WIDGETS"))


def show_token(text: str) -> str:
    """A token's text made visible in HTML: spaces as '·', newlines as '⏎', tabs as '⇥', HTML escaped."""
    visible = text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥")
    return html.escape(visible) if visible else "∅"


class CourseWidget(ABC):
    """Base class: subclasses build `self.ui` (an ipywidgets box) and implement `summary()` (plain text)."""

    ui: w.Widget

    def __init__(self, static: bool | None = None):
        self.static = headless(static)

    @abstractmethod
    def summary(self) -> str:
        """The widget's current state as plain text (what headless runs print)."""

    def _ipython_display_(self) -> None:
        if self.static:
            print(self.summary())
        else:
            display(self.ui)

    def show(self) -> None:
        """Display the widget (or print its static summary when headless)."""
        self._ipython_display_()

    def _show_figure(self, output: w.Output, figure) -> None:
        """Replace what `output` shows by `figure` (only with a front end: headless Outputs stay empty)."""
        if self.static:
            return
        output.clear_output(wait=True)
        with output:
            display(figure)
