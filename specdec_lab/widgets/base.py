"""What every course widget shares: state in plain Python, and a static fallback when no front end is attached.

A widget keeps everything it shows in ordinary attributes (so tests and graded labs can drive it by setting
a control's `.value` and reading the attributes back) and renders through `ipywidgets.HTML` values and an
`Output` for plotly figures.

Whether a browser will draw the widget is not something a kernel can know: nbconvert and papermill run the same
kernel as JupyterLab, and a front end may attach (or not) at any time. So no guess is made and no environment
variable is needed. In a Jupyter kernel, displaying a widget publishes ONE display with two representations: the
live widget and its text summary. A front end that draws widgets shows the controls; a run with none attached
(nbconvert, papermill) stores the text in the notebook, where any viewer shows it. Outside a kernel (plain Python,
terminal IPython, tests), while nbgrader grades (`NBGRADER_EXECUTION`), or with `static=True`, the summary is
printed and no widget is published. Nothing here waits on a front end: the widgets' callbacks run in the kernel,
and figures reach an `Output` widget as a state update from the kernel (`CourseWidget._show_figure`), never by
capturing a display, which would make the front end (or nbclient, standing in for one) answer on the shell channel.
"""

from __future__ import annotations

import html
import os
from abc import ABC, abstractmethod

import ipywidgets as w
import plotly.io as pio
from IPython.display import display


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where a front end may draw widgets), False in plain Python or a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def headless(static: bool | None = None) -> bool:
    """True when widgets should only print their static summaries: `static` if given; else while nbgrader runs a
    notebook (`NBGRADER_EXECUTION`) or outside a Jupyter kernel. In a kernel, False: the widget is published live
    with its summary as the text fallback of the same display (see the module docstring)."""
    if static is not None:
        return static
    return bool(os.environ.get("NBGRADER_EXECUTION")) or not in_kernel()


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
            bundle = self.ui._repr_mimebundle_()  # the live widget's view ...
            bundle["text/plain"] = self.summary()  # ... and what shows where no front end draws it
            display(bundle, raw=True)

    def show(self) -> None:
        """Display the widget (live with a text fallback in a kernel; its printed summary when headless)."""
        self._ipython_display_()

    def _show_figure(self, output: w.Output, figure) -> None:
        """Replace what `output` shows by `figure`, by setting the Output widget's `outputs` state directly.

        Never through `with output: display(...)`: that capture makes the front end (or nbclient's stand-in for
        one, when nbconvert or papermill run the notebook) send the captured outputs back to the kernel on the
        shell channel, and nbclient can then miss the cell's execute reply and wait until its timeout (seen on
        lesson 5's tree view; jupyter/nbclient#312). A state update only flows from the kernel outwards.
        """
        if self.static:
            return
        bundle = pio.renderers["plotly_mimetype"].to_mimebundle(figure.to_dict())
        bundle["text/plain"] = figure.layout.title.text or "plotly figure"
        output.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)
