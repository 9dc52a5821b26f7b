"""The alpha / gamma / c explorer: move three sliders, watch the expected tokens per step and speedup change.

alpha is the acceptance rate, gamma the draft length, c the cost of a draft step relative to a target forward.
The heatmap shows the whole speedup surface for the current c, with a marker at the chosen (alpha, gamma).
"""

from __future__ import annotations

import ipywidgets as w

from specdec_lab import theory, viz
from specdec_lab.widgets.base import CourseWidget


class SpeedupExplorer(CourseWidget):
    """Sliders for alpha, gamma and c; state in `tau`, `speedup`, `best_gamma`, `best_speedup` and `figure`.

    alpha: initial acceptance rate; gamma: initial draft length; c: initial cost ratio; max_gamma: the
    gamma slider's (and the surface's) upper end; static: force (True) or forbid (False) the text-only mode.
    """

    def __init__(self, alpha: float = 0.8, gamma: int = 4, c: float = 0.1, max_gamma: int = 12,
                 static: bool | None = None):
        super().__init__(static)
        self.max_gamma = max_gamma
        self.alpha = w.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="alpha",
                                   continuous_update=False)
        self.gamma = w.IntSlider(value=gamma, min=1, max=max_gamma, description="gamma", continuous_update=False)
        self.c = w.FloatSlider(value=c, min=0.0, max=1.0, step=0.01, description="c", continuous_update=False)
        self.readout = w.HTML()
        self.plot = w.Output()
        for control in (self.alpha, self.gamma, self.c):
            control.observe(self._update, names="value")
        self.ui = w.VBox([w.HBox([self.alpha, self.gamma, self.c]), self.readout, self.plot])
        self._update()

    def _update(self, change=None) -> None:
        alpha, gamma, c = self.alpha.value, self.gamma.value, self.c.value
        self.tau = theory.expected_tokens_per_step(alpha, gamma)
        self.speedup = theory.expected_speedup(alpha, gamma, c)
        self.best_gamma = theory.optimal_gamma(alpha, c, self.max_gamma)
        self.best_speedup = theory.expected_speedup(alpha, self.best_gamma, c)
        self.figure = viz.speedup_heatmap(c, alpha, gamma, self.max_gamma)
        verdict = "faster" if self.speedup > 1 else "slower"
        advice = (f"{self.best_gamma} ({self.best_speedup:.2f}x)" if self.best_gamma
                  else "0: do not speculate, every draft length loses time")
        self.readout.value = (
            f"<b>E[tokens per target forward]</b> = {self.tau:.2f} &nbsp; "
            f"<b>expected speedup</b> = {self.speedup:.2f}x ({verdict} than the target alone) &nbsp; "
            f"<b>best gamma</b> at this alpha and c: {advice}"
        )
        self._show_figure(self.plot, self.figure)

    def summary(self) -> str:
        return (f"alpha={self.alpha.value:.2f} gamma={self.gamma.value} c={self.c.value:.2f}: "
                f"E[tokens/forward]={self.tau:.2f}, expected speedup={self.speedup:.2f}x, "
                f"best gamma={self.best_gamma} ({self.best_speedup:.2f}x)")
