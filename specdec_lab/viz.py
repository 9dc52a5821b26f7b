"""Plotly figures for the lessons, widgets and reports, all in one visual style.

Every function returns a plain `plotly.graph_objects.Figure` (no front end needed to build one) styled by
`style`: the same fonts, margins and, above all, the same colour for the same idea everywhere: the target p
is always blue, the draft q orange, the residual purple; accepted tokens green, rejected red, resampled
purple, bonus gold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from specdec_lab import theory

COLORS = {
    "target": "#1f77b4",     # p
    "draft": "#ff7f0e",      # q
    "residual": "#9467bd",   # norm(max(0, p - q))
    "accepted": "#2ca02c",
    "rejected": "#d62728",
    "resampled": "#9467bd",
    "bonus": "#e6a700",
    "theory": "#555555",     # closed-form predictions, drawn dashed
    "measured": "#1f77b4",
}
SEQUENCE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
FONT = "Inter, Helvetica, Arial, sans-serif"


def style(fig: go.Figure, title: str, x_title: str = "", y_title: str = "", height: int = 380) -> go.Figure:
    """Apply the course style to `fig` and return it.

    title: the figure's title (say what it shows, not what it is); x_title / y_title: axis labels with units;
    height: pixels.
    """
    fig.update_layout(
        title={"text": title, "x": 0.02, "xanchor": "left"}, template="plotly_white", height=height,
        font={"family": FONT, "size": 13}, margin={"l": 60, "r": 20, "t": 60, "b": 50},
        colorway=SEQUENCE, legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
        bargap=0.2,
    )
    fig.update_xaxes(title_text=x_title, showgrid=False)
    fig.update_yaxes(title_text=y_title, gridcolor="#e5e5e5", zeroline=False)
    return fig


def _vector(values: torch.Tensor | Sequence[float]) -> list[float]:
    return values.detach().float().cpu().tolist() if isinstance(values, torch.Tensor) else [float(v) for v in values]


def pq_bars(p: torch.Tensor | Sequence[float], q: torch.Tensor | Sequence[float], labels: Sequence[str] | None = None,
            top: int = 12, title: str = "Target p, draft q and the residual norm(max(0, p - q))") -> go.Figure:
    """Grouped bars of p, q and the residual over the `top` tokens most likely under p or q.

    p, q: probability vectors over the same vocabulary; labels: a display string per token id (default: the
    ids); top: how many tokens to show; title: figure title. The residual is what a rejection resamples from.
    """
    p_list, q_list = _vector(p), _vector(q)
    if len(p_list) != len(q_list):
        raise ValueError(f"p and q must cover the same vocabulary, got {len(p_list)} and {len(q_list)} entries")
    p_t, q_t = torch.tensor(p_list), torch.tensor(q_list)
    residual = (p_t - q_t).clamp(min=0)
    residual = residual / residual.sum() if residual.sum() > 0 else residual
    shown = torch.maximum(p_t, q_t).argsort(descending=True)[:top].tolist()
    names = [repr(labels[i]) if labels is not None else str(i) for i in shown]
    fig = go.Figure()
    series = (("target p", p_t, "target"), ("draft q", q_t, "draft"), ("residual", residual, "residual"))
    for name, values, key in series:
        fig.add_bar(x=names, y=[float(values[i]) for i in shown], name=name, marker_color=COLORS[key])
    overlap = float(theory.acceptance_probability(p_t, q_t))
    return style(fig, f"{title}<br><sup>acceptance probability sum min(p, q) = {overlap:.3f}</sup>",
                 "token", "probability")


def acceptance_by_position(survival: Sequence[float], conditional: Sequence[float], alpha: float | None = None,
                           title: str = "Acceptance per draft position, read two ways") -> go.Figure:
    """Two panels per draft position i = 1, 2, ...: the conditional acceptance and the survival.

    Left, conditional: of the steps that reached position i (positions 1 .. i - 1 all kept), the share that kept
    i too; the i.i.d. model predicts a flat alpha. Right, survival: of the steps that drafted position i, the share
    that kept everything up to and including i; the i.i.d. model predicts alpha^i. Reading survival against a flat
    alpha (or conditional against alpha^i) says the opposite of the truth about later positions.
    survival: `DecodeStats.per_position_acceptance`; conditional: `DecodeStats.conditional_acceptance` (same
    length); alpha: if given, the i.i.d. model's prediction is drawn on both panels; title: figure title.
    """
    if len(survival) != len(conditional):
        raise ValueError(f"survival and conditional must cover the same positions, got {len(survival)} and "
                         f"{len(conditional)} values")
    positions = [str(i + 1) for i in range(len(survival))]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "conditional: kept at i, given i was reached", "survival: kept from the start through i"))
    fig.add_bar(x=positions, y=list(conditional), name="measured: accepted at i / reached i",
                marker_color=COLORS["accepted"], row=1, col=1)
    fig.add_bar(x=positions, y=list(survival), name="measured: kept 1..i / steps that drafted i",
                marker_color=COLORS["measured"], row=1, col=2)
    if alpha is not None:
        fig.add_scatter(x=positions, y=[alpha] * len(positions), name=f"i.i.d. model: alpha = {alpha:.2f}",
                        mode="lines+markers", line={"color": COLORS["theory"], "dash": "dash"}, row=1, col=1)
        fig.add_scatter(x=positions, y=[alpha ** (i + 1) for i in range(len(positions))],
                        name="i.i.d. model: alpha^i", mode="lines+markers",
                        line={"color": COLORS["theory"], "dash": "dot"}, row=1, col=2)
    fig.update_yaxes(range=[0, 1.05])
    fig = style(fig, title, "", "", height=400)
    fig.update_xaxes(title_text="draft position i")
    fig.update_yaxes(title_text="accepted / reached", row=1, col=1)
    fig.update_yaxes(title_text="share of steps", row=1, col=2)
    fig.update_layout(margin={"t": 90}, legend={"y": -0.3, "yanchor": "top", "x": 0.0, "xanchor": "left"})
    return fig


def tau_histogram(accepted_per_step: Sequence[int] | Mapping[int, int], gamma: int | None = None,
                  alpha: float | None = None, title: str = "Tokens emitted per target forward") -> go.Figure:
    """Histogram of tokens emitted per verification step (accepted draft tokens + 1).

    accepted_per_step: `DecodeStats.accepted_per_step` (a list) or `accepted_histogram` (a dict count by
    accepted); gamma: draft length (sets the x range); alpha: if given, overlays the truncated-geometric
    prediction of the i.i.d. model.
    """
    counts = dict(accepted_per_step) if isinstance(accepted_per_step, Mapping) else {}
    if not isinstance(accepted_per_step, Mapping):
        for a in accepted_per_step:
            counts[int(a)] = counts.get(int(a), 0) + 1
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no verification steps to plot: accepted_per_step is empty")
    top = gamma if gamma is not None else max(counts)
    xs = list(range(top + 1))
    fig = go.Figure(go.Bar(x=[a + 1 for a in xs], y=[counts.get(a, 0) / total for a in xs], name="measured",
                           marker_color=COLORS["measured"]))
    if alpha is not None:
        predicted = [alpha**a * (1 - alpha) if a < top else alpha**top for a in xs]
        fig.add_scatter(x=[a + 1 for a in xs], y=predicted, name=f"i.i.d. model, alpha = {alpha:.2f}",
                        mode="lines+markers", line={"color": COLORS["theory"], "dash": "dash"})
    mean = sum((a + 1) * n for a, n in counts.items()) / total
    return style(fig, f"{title}<br><sup>mean tau = {mean:.2f} over {total} steps</sup>", "tokens per step",
                 "share of steps")


def speedup_curves(alphas: Sequence[float], c: float, max_gamma: int = 10,
                   title: str | None = None) -> go.Figure:
    """Expected speedup against draft length gamma, one curve per acceptance rate, for cost ratio c.

    alphas: acceptance rates to draw; c: draft-step cost / target-forward cost; max_gamma: longest draft.
    The best gamma of each curve is marked.
    """
    gammas = list(range(max_gamma + 1))
    fig = go.Figure()
    for i, alpha in enumerate(alphas):
        colour = SEQUENCE[i % len(SEQUENCE)]
        fig.add_scatter(x=gammas, y=[theory.expected_speedup(alpha, g, c) for g in gammas], mode="lines+markers",
                        name=f"alpha = {alpha:.2f}", line={"color": colour})
        best = theory.optimal_gamma(alpha, c, max_gamma)
        fig.add_scatter(x=[best], y=[theory.expected_speedup(alpha, best, c)], mode="markers", showlegend=False,
                        marker={"symbol": "star", "size": 14, "color": colour})
    fig.add_hline(y=1.0, line={"color": COLORS["theory"], "dash": "dot"})
    return style(fig, title or f"Expected speedup vs draft length (c = {c:g}; stars: best gamma)",
                 "gamma (tokens drafted per step)", "speedup over target-only decoding")


def speedup_heatmap(c: float, alpha: float | None = None, gamma: int | None = None, max_gamma: int = 12,
                    steps: int = 41) -> go.Figure:
    """The expected speedup surface over (alpha, gamma) for cost ratio c, as a heatmap with a 1x contour.

    c: draft-to-target cost ratio; alpha / gamma: if both given, a marker at that point; max_gamma: rows up
    to this draft length; steps: alpha resolution in [0, 1].
    """
    alphas = [i / (steps - 1) for i in range(steps)]
    gammas = list(range(1, max_gamma + 1))
    grid = theory.speedup_grid(alphas, gammas, c)
    fig = go.Figure(go.Heatmap(x=alphas, y=gammas, z=grid, colorscale="Viridis", colorbar={"title": "speedup"},
                               hovertemplate="alpha %{x:.2f}<br>gamma %{y}<br>speedup %{z:.2f}x<extra></extra>"))
    fig.add_contour(x=alphas, y=gammas, z=grid, contours={"start": 1, "end": 1, "coloring": "none",
                    "showlabels": True}, line={"color": "white", "dash": "dash"}, showscale=False, hoverinfo="skip",
                    name="break-even")
    if alpha is not None and gamma is not None:
        fig.add_scatter(x=[alpha], y=[gamma], mode="markers", name="you are here",
                        marker={"symbol": "x", "size": 14, "color": COLORS["rejected"]})
    return style(fig, f"Expected speedup over (alpha, gamma) at c = {c:g} (dashed: break-even 1x)",
                 "alpha (acceptance rate)", "gamma (draft length)", height=420)


def empirical_vs_target(counts: Mapping[int, int] | Sequence[int], p: torch.Tensor | Sequence[float],
                        q: torch.Tensor | Sequence[float] | None = None, labels: Sequence[str] | None = None,
                        title: str = "What speculative sampling emits vs the target p") -> go.Figure:
    """Bars of an empirical token distribution next to the target p (and the draft q, if given).

    counts: how often each token id was emitted (dict id -> count, or a list indexed by id); p: the target
    distribution the counts should match; q: the draft distribution, for contrast; labels: token strings.
    """
    p_list = _vector(p)
    count_of = dict(counts) if isinstance(counts, Mapping) else dict(enumerate(counts))
    total = sum(count_of.values())
    if total == 0:
        raise ValueError("counts are empty: draw at least one sample")
    names = [repr(labels[i]) if labels is not None else str(i) for i in range(len(p_list))]
    fig = go.Figure()
    fig.add_bar(x=names, y=p_list, name="target p", marker_color=COLORS["target"])
    fig.add_bar(x=names, y=[count_of.get(i, 0) / total for i in range(len(p_list))], name=f"emitted ({total} draws)",
                marker_color=COLORS["accepted"])
    if q is not None:
        fig.add_bar(x=names, y=_vector(q), name="draft q", marker_color=COLORS["draft"], opacity=0.6)
    return style(fig, title, "token", "probability")


def cost_per_forward(tokens: Sequence[int], milliseconds: Sequence[float],
                     title: str = "One forward pass: time vs tokens processed") -> go.Figure:
    """Measured forward time and the implied tokens/s as the number of tokens per forward grows.

    tokens: tokens fed per forward; milliseconds: measured time of one such forward (same order).
    """
    fig = go.Figure()
    fig.add_bar(x=[str(n) for n in tokens], y=list(milliseconds), name="ms per forward",
                marker_color=COLORS["target"])
    fig.add_scatter(x=[str(n) for n in tokens], y=[1000 * n / ms for n, ms in zip(tokens, milliseconds, strict=True)],
                    name="tokens scored per second", yaxis="y2", mode="lines+markers",
                    line={"color": COLORS["accepted"]})
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "tokens / s", "showgrid": False})
    return style(fig, title, "tokens per forward (k)", "milliseconds")


def cost_curves(tokens: Sequence[int], curves: Mapping[str, Sequence[float]], floor_ms: float | None = None,
                title: str = "One forward: eager against compiled") -> go.Figure:
    """Several measured forward-cost curves (ms against tokens fed) on one chart, with the bandwidth floor.

    tokens: tokens fed per forward; curves: name -> milliseconds per forward (same order as tokens);
    floor_ms: weights / memory bandwidth, the least a forward can take when it streams every weight (a line).
    """
    fig = go.Figure()
    for i, (name, milliseconds) in enumerate(curves.items()):
        fig.add_scatter(x=list(tokens), y=list(milliseconds), name=name, mode="lines+markers",
                        line={"color": SEQUENCE[i % len(SEQUENCE)]})
    if floor_ms is not None:
        fig.add_hline(y=floor_ms, line={"dash": "dot", "color": COLORS["theory"]},
                      annotation_text=f"bandwidth floor {floor_ms:.2f} ms", annotation_position="bottom right")
    fig.update_yaxes(rangemode="tozero")
    return style(fig, title, "tokens per forward", "milliseconds")


def scaling_curves(curves: Mapping[str, Sequence[Mapping[str, float]]], depths: Sequence[int] = (1, 4),
                   title: str = "Head agreement against training tokens") -> go.Figure:
    """Heads' agreement with the target against the tokens they trained on (a small scaling curve).

    curves: head name -> its run's evaluations, each {"tokens": tokens seen, "acc1": agreement at depth 1, ...}
    (the zoo's `training.json` keeps them as "learning_curve"); depths: which unroll depths to draw (solid: the
    first, dashed: the others).
    """
    fig = go.Figure()
    for i, (name, points) in enumerate(curves.items()):
        for j, depth in enumerate(depths):
            fig.add_scatter(x=[point["tokens"] for point in points], y=[point[f"acc{depth}"] for point in points],
                            name=f"{name}, depth {depth}", mode="lines+markers",
                            line={"color": SEQUENCE[i % len(SEQUENCE)], "dash": "solid" if j == 0 else "dash"})
    fig.update_xaxes(type="log")
    return style(fig, title, "training tokens", "agreement with the target's top token")


def roofline(peak_flops: float, bandwidth: float, points: Mapping[str, float] | None = None,
             title: str = "Roofline: attainable compute vs arithmetic intensity") -> go.Figure:
    """A roofline: attainable FLOP/s = min(peak, intensity * bandwidth), on log axes, with labelled points.

    peak_flops: compute peak in FLOP/s; bandwidth: memory bandwidth in bytes/s; points: name -> arithmetic
    intensity (FLOPs per byte moved), drawn on the roof.
    """
    ridge = peak_flops / bandwidth
    intensities = [ridge * 2.0**e for e in range(-10, 5)]
    fig = go.Figure(go.Scatter(x=intensities, y=[min(peak_flops, i * bandwidth) for i in intensities], mode="lines",
                               name="roof", line={"color": COLORS["theory"]}))
    for i, (name, intensity) in enumerate((points or {}).items()):
        fig.add_scatter(x=[intensity], y=[min(peak_flops, intensity * bandwidth)], mode="markers+text", name=name,
                        text=[name], textposition="top left", marker={"size": 11, "color": SEQUENCE[i % 8]})
    fig.add_vline(x=ridge, line={"dash": "dot", "color": COLORS["theory"]})
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return style(fig, f"{title}<br><sup>ridge point {ridge:.0f} FLOPs/byte: left of it, memory-bound</sup>",
                 "arithmetic intensity (FLOPs / byte)", "attainable FLOP/s")


def tree_layout(parents: Sequence[int]) -> tuple[list[int], list[float]]:
    """Depth (x) and vertical slot (y) of each node of a draft tree given by `parents` (-1 = root's child).

    parents: parents[i] is the index of node i's parent, or -1 when node i hangs off the last accepted token;
    a parent must come before its children. Leaves get consecutive slots; an inner node sits at the mean of
    its children.
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if parent >= node or parent < -1:
            raise ValueError(f"parents[{node}] = {parent}: a parent must be -1 or an earlier node")
        children.setdefault(parent, []).append(node)
    depth = [0] * len(parents)
    y = [0.0] * len(parents)
    next_slot = [0.0]

    def place(node: int) -> float:
        kids = children.get(node, [])
        if not kids:
            slot, next_slot[0] = next_slot[0], next_slot[0] + 1
            return slot
        return sum(place_child(kid, node) for kid in kids) / len(kids)

    def place_child(kid: int, node: int) -> float:
        depth[kid] = depth[node] + 1 if node >= 0 else 1
        y[kid] = place(kid)
        return y[kid]

    place(-1)
    return depth, y


def draft_tree(parents: Sequence[int], labels: Sequence[str], accepted: Sequence[int] = (),
               title: str = "Draft tree (green: the accepted path)") -> go.Figure:
    """The draft tree with the accepted path highlighted.

    parents: parent index per node (-1 = child of the last accepted token); labels: text per node;
    accepted: node indices on the accepted root-to-node path.
    """
    if len(labels) != len(parents):
        raise ValueError(f"need one label per node: {len(labels)} labels for {len(parents)} nodes")
    depth, y = tree_layout(parents)
    kept = set(accepted)
    fig = go.Figure()
    for node, parent in enumerate(parents):
        x0, y0 = (depth[parent], y[parent]) if parent >= 0 else (0, sum(y) / max(len(y), 1))
        on_path = node in kept and (parent < 0 or parent in kept)
        fig.add_scatter(x=[x0, depth[node]], y=[y0, y[node]], mode="lines", showlegend=False, hoverinfo="skip",
                        line={"color": COLORS["accepted"] if on_path else "#cccccc", "width": 3 if on_path else 1})
    colours = [COLORS["accepted"] if n in kept else COLORS["draft"] for n in range(len(parents))]
    fig.add_scatter(x=[0], y=[sum(y) / max(len(y), 1)], mode="markers+text", text=["context"],
                    textposition="middle left", marker={"size": 12, "color": COLORS["target"]}, showlegend=False)
    fig.add_scatter(x=depth, y=y, mode="markers+text", text=list(labels), textposition="middle right",
                    marker={"size": 12, "color": colours}, showlegend=False,
                    hovertext=[f"node {n}, parent {p}" for n, p in enumerate(parents)], hoverinfo="text")
    fig.update_yaxes(visible=False)
    fig.update_xaxes(dtick=1)
    return style(fig, title, "depth (tokens after the context)", "", height=max(300, 28 * (max(y, default=0) + 2)))


def batch_scaling(batches: Sequence[int], plain: Sequence[float], speculative: Sequence[float],
                  title: str = "Plain and speculative decoding as the batch grows") -> go.Figure:
    """Tokens/s of plain and speculative decoding against the batch size, each speculative point labelled with
    its speedup over plain decoding at the same batch size.

    batches: the batch sizes (log-scaled axis); plain / speculative: all sequences' tokens per second at each;
    title: figure title.
    """
    batches, plain, speculative = list(batches), [float(v) for v in plain], [float(v) for v in speculative]
    fig = go.Figure()
    fig.add_scatter(x=batches, y=plain, name="plain", mode="lines+markers", line={"color": COLORS["theory"]})
    fig.add_scatter(x=batches, y=speculative, name="speculative (draft model)", mode="lines+markers+text",
                    line={"color": COLORS["accepted"]}, textposition="top center",
                    text=[f"{s / p:.2f}x" for s, p in zip(speculative, plain, strict=True)])
    style(fig, title, "batch size (sequences decoded together)", "tokens / s (all sequences)")
    fig.update_xaxes(type="log", tickvals=batches, ticktext=[str(b) for b in batches])
    return fig


def acceptance_vs_temperature(rows: Mapping[str, Mapping],
                              title: str = "Acceptance against temperature: who keeps the gain as sampling heats up"
                              ) -> go.Figure:
    """Two panels, alpha and tau against the sampling temperature, one line per method (LOSSY methods dashed).

    rows: per method name, a mapping with "label", "lossless" (bool) and equal-length lists "temperature",
    "alpha" (share of verified draft positions kept) and "tau" (tokens per target forward), as
    `specdec_lab.sweep.run_sweep` returns under "methods"; title: figure title.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("alpha: draft positions kept / verified", "tau: tokens per target forward"))
    for index, (name, row) in enumerate(rows.items()):
        color = SEQUENCE[index % len(SEQUENCE)]
        dash = "solid" if row["lossless"] else "dash"
        for column, field in ((1, "alpha"), (2, "tau")):
            fig.add_scatter(x=list(row["temperature"]), y=list(row[field]), mode="lines+markers", name=row["label"],
                            legendgroup=name, showlegend=column == 1, line={"color": color, "dash": dash},
                            row=1, col=column)
    style(fig, title, height=440)
    fig.update_xaxes(title_text="temperature (0 = greedy)")
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0.0},
                      margin={"b": 110})
    return fig
