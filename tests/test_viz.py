"""The plotly figures: they carry the numbers they are given (and derived ones computed correctly), in the
course style, and reject malformed input with a clear message."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch

from specdec_lab import DecodeStats, theory, viz


def test_pq_bars_show_p_q_and_residual():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.3, 0.1, 0.4])
    fig = viz.pq_bars(p, q, labels=["a", "b", "c", "d"], top=4)
    assert isinstance(fig, go.Figure)
    bars = {trace.name: dict(zip(trace.x, trace.y, strict=True)) for trace in fig.data}
    assert bars["target p"]["'a'"] == pytest.approx(0.5)
    assert bars["draft q"]["'d'"] == pytest.approx(0.4)
    # residual = norm(max(0, p - q)) = [0.3, 0, 0.1, 0] / 0.4
    assert bars["residual"]["'a'"] == pytest.approx(0.75) and bars["residual"]["'c'"] == pytest.approx(0.25)
    assert "0.600" in fig.layout.title.text  # sum min(p, q)
    assert fig.data[0].marker.color == viz.COLORS["target"] and fig.layout.template.layout.font is not None
    with pytest.raises(ValueError, match="same vocabulary"):
        viz.pq_bars(p, q[:3])


def test_acceptance_by_position_compares_each_reading_with_its_own_prediction():
    # Steps (drafted, accepted): survival = [3/4, 2/4, 1/4], conditional = [3/4, 2/3, 1/2].
    stats = DecodeStats()
    for drafted, accepted in [(3, 2), (3, 3), (3, 0), (3, 1)]:
        stats.record_step(drafted, accepted)
    fig = viz.acceptance_by_position(stats.per_position_acceptance, stats.conditional_acceptance, alpha=0.7)
    traces = {trace.name: trace for trace in fig.data}
    conditional = traces["measured: accepted at i / reached i"]
    survival = traces["measured: kept 1..i / steps that drafted i"]
    assert list(conditional.y) == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    assert list(survival.y) == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    # Each reading sits next to its own i.i.d. prediction, on its own panel: a flat alpha for the conditional
    # acceptance, alpha^i for survival (the old chart drew survival against a flat alpha).
    flat, power = traces["i.i.d. model: alpha = 0.70"], traces["i.i.d. model: alpha^i"]
    assert list(flat.y) == pytest.approx([0.7] * 3) and flat.yaxis == conditional.yaxis
    assert list(power.y) == pytest.approx([0.7, 0.49, 0.343]) and power.yaxis == survival.yaxis
    assert conditional.xaxis != survival.xaxis
    panels = [a.text for a in fig.layout.annotations]
    assert any("given i was reached" in t for t in panels) and any("from the start" in t for t in panels)
    with pytest.raises(ValueError, match="same positions"):
        viz.acceptance_by_position([0.5], [])


def test_tau_histogram():
    fig = viz.tau_histogram([0, 2, 2, 3], gamma=3, alpha=0.5)
    assert list(fig.data[0].x) == [1, 2, 3, 4] and list(fig.data[0].y) == [0.25, 0.0, 0.5, 0.25]
    assert sum(fig.data[1].y) == pytest.approx(1.0)  # the truncated geometric sums to one
    assert "mean tau = 2.75" in fig.layout.title.text
    assert list(viz.tau_histogram({1: 3, 0: 1}).data[0].y) == [0.25, 0.75]
    with pytest.raises(ValueError, match="empty"):
        viz.tau_histogram([])


def test_speedup_figures_use_the_theory():
    fig = viz.speedup_curves([0.6, 0.9], c=0.1, max_gamma=6)
    curve, star = fig.data[0], fig.data[1]
    assert curve.y[3] == pytest.approx(theory.expected_speedup(0.6, 3, 0.1))
    assert star.x[0] == theory.optimal_gamma(0.6, 0.1, 6)
    heat = viz.speedup_heatmap(0.2, alpha=0.7, gamma=3, max_gamma=5, steps=11)
    assert heat.data[0].z[2][7] == pytest.approx(theory.expected_speedup(0.7, 3, 0.2))
    assert (heat.data[-1].x[0], heat.data[-1].y[0]) == (0.7, 3)


def test_empirical_cost_and_roofline():
    fig = viz.empirical_vs_target({0: 30, 2: 10}, [0.7, 0.1, 0.2], q=[0.2, 0.4, 0.4])
    assert list(fig.data[1].y) == [0.75, 0.0, 0.25] and len(fig.data) == 3
    fig = viz.cost_per_forward([1, 4], [5.0, 6.0])
    assert list(fig.data[1].y) == pytest.approx([200.0, 4000 / 6])
    fig = viz.roofline(1e12, 1e11, {"decode": 1.0, "prefill": 100.0})
    assert fig.data[1].y[0] == pytest.approx(1e11) and fig.data[2].y[0] == pytest.approx(1e12)


def test_tree_layout_and_figure():
    depth, y = viz.tree_layout([-1, 0, 0, -1, 3])
    assert depth == [1, 2, 2, 1, 2]
    assert y[0] == pytest.approx((y[1] + y[2]) / 2) and y[3] == y[4]
    fig = viz.draft_tree([-1, 0, 0], ["a", "b", "c"], accepted=[0, 2])
    nodes = fig.data[-1]
    assert list(nodes.marker.color) == [viz.COLORS["accepted"], viz.COLORS["draft"], viz.COLORS["accepted"]]
    with pytest.raises(ValueError, match="earlier node"):
        viz.tree_layout([0])
    with pytest.raises(ValueError, match="one label per node"):
        viz.draft_tree([-1], [])


def test_cost_curves_draw_every_curve_and_the_floor():
    from specdec_lab import viz

    fig = viz.cost_curves([1, 4, 8], {"eager": [5.0, 6.0, 7.0], "compiled": [3.0, 3.5, 4.0]}, floor_ms=2.3)
    assert [trace.name for trace in fig.data] == ["eager", "compiled"]
    assert list(fig.data[1].y) == [3.0, 3.5, 4.0]
    assert any("2.30 ms" in (a.text or "") for a in fig.layout.annotations)


def test_scaling_curves_draw_each_head_at_each_depth():
    from specdec_lab import viz

    curve = [{"tokens": 1e6, "acc1": 0.4, "acc4": 0.3}, {"tokens": 2e6, "acc1": 0.5, "acc4": 0.45}]
    fig = viz.scaling_curves({"eagle": curve, "eagle3": curve[::-1]})
    assert [trace.name for trace in fig.data] == ["eagle, depth 1", "eagle, depth 4", "eagle3, depth 1",
                                                  "eagle3, depth 4"]
    assert list(fig.data[1].y) == [0.3, 0.45] and list(fig.data[2].x) == [2e6, 1e6]
