"""Presenting benchmark figures: a plain-text table, the raw JSON, and one self-contained HTML report.

Everything here reads the dict that `specdec_lab.bench.run_benchmark` returns (and `export.py` builds a dict
of the same shape), so the terminal, the JSON file and the HTML report always show the same numbers.
Files are written atomically: a temporary file in the destination folder, then a rename, so a crash never
leaves half a report behind.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path

# (column title, field, format) for the text table and the HTML table.
COLUMNS = [
    ("tokens/s", "tokens_per_second", "{:.1f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("tau", "tau", "{:.2f}"),
    ("accept", "acceptance_rate", "{:.2f}"),
    ("= baseline", "outputs_equal_to_baseline", "{}"),
    ("alpha", "alpha", "{:.2f}"),
    ("vs own AR", "measured_speedup_vs_own_ar", "{:.2f}x"),
    ("predicted", "predicted_speedup", "{:.2f}x"),
    ("meas/pred", "efficiency", "{:.2f}"),
    ("meas/pred (costed)", "efficiency_costed", "{:.2f}"),
    ("x floor", "times_floor", "{:.1f}x"),
]


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same folder and a rename; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, 0o644)  # mkstemp creates owner-only files; a report is meant to be shared
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_json(result: dict, path: str | os.PathLike) -> Path:
    """The raw figures as indented JSON."""
    return write_atomic(path, json.dumps(result, indent=2) + "\n")


def cell(row: dict, field: str, pattern: str, prompts: int) -> str:
    """One table cell: '-' where a figure does not apply, 'n/N' for output equality."""
    value = row.get(field)
    if value is None:
        return "-"
    if field == "outputs_equal_to_baseline":
        return f"{value}/{prompts}"
    return pattern.format(value)


def describe_run(result: dict) -> list[str]:
    """Lines that say what was measured, on what, with which settings."""
    machine, settings, costs = result["machine"], result["settings"], result["costs"]
    lines = [
        f"machine: {machine['cpu']} ({machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads, "
        f"{machine['device']}), python {machine['python']}, torch {machine['torch']}, "
        f"transformers {machine['transformers']}, {machine['date_utc']}",
        f"settings: temperature {settings['temperature']}, k {settings['k']} (lookup k {settings['lookup_k']}), "
        f"{settings['prompts']} prompts x {settings['max_new_tokens']} new tokens, median of "
        f"{settings['repeats']} repeats, baseline {settings['baseline']}",
    ]
    if costs.get("c") is not None:
        lines.append(f"forward cost: target {costs['target_1_ms']:.2f} ms (1 token), {costs['target_k1_ms']:.2f} ms "
                     f"(k + 1 tokens, x{costs['verify_ratio']:.2f}); draft {costs['draft_1_ms']:.2f} ms; "
                     f"c = {costs['c']:.3f}")
    if costs.get("floor"):
        floor = costs["floor"]
        lines.append(f"bandwidth floor: memory reads {floor['read_gb_s']:.1f} GB/s (copy {floor['copy_gb_s']:.1f} "
                     f"GB/s, {floor['megabytes']} MB, best of {floor['trials']}); target weights "
                     f"{floor['weight_megabytes']:.1f} MB, so one plain step takes at least "
                     f"{floor['floor_ms_per_token']:.2f} ms ({floor['floor_tokens_per_second']:.0f} tokens/s); "
                     "x floor = a plain row's time per token over that floor (below 1 when the weights fit in the "
                     "caches)")
        if floor.get("half"):
            half = floor["half"]
            lines[-1] += (f"; our compiled forwards read float16 copies of the fp32 weights "
                          f"({half['weight_megabytes']:.1f} MB, the same values), at least "
                          f"{half['floor_ms_per_token']:.2f} ms "
                          f"({half['floor_tokens_per_second']:.0f} tokens/s)")
    return lines


def text_table(result: dict) -> str:
    """The whole benchmark as a terminal table, one block per prompt set."""
    lines = describe_run(result)
    for kind, block in result["sets"].items():
        lines += ["", f"{kind}: {block['prompts']} prompts, mean {block['mean_prompt_tokens']} tokens"]
        header = f"{'method':<14}" + "".join(f"{title:>{max(10, len(title) + 2)}}" for title, _, _ in COLUMNS)
        lines.append(header)
        for name, row in block["methods"].items():
            cells = [cell(row, field, pattern, block["prompts"]) for _, field, pattern in COLUMNS]
            lines.append(f"{name:<14}" + "".join(f"{c:>{max(10, len(t) + 2)}}"
                                                  for c, (t, _, _) in zip(cells, COLUMNS, strict=True)))
    for name, reason in result.get("skipped", {}).items():
        lines.append(f"skipped {name}: {reason}")
    lines.append("predicted = Leviathan et al. (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)) over the method's own "
                 "autoregressive loop; costed also charges the measured cost of verifying k + 1 tokens")
    return "\n".join(lines)


def markdown_table(result: dict, kind: str) -> str:
    """One prompt set as a Markdown table (for READMEs)."""
    block = result["sets"][kind]
    titles = ["method"] + [title for title, _, _ in COLUMNS]
    rows = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for name, row in block["methods"].items():
        cells = [cell(row, field, pattern, block["prompts"]) for _, field, pattern in COLUMNS]
        rows.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(rows)


def compile_warmups(result: dict, kind: str) -> str:
    """How long each compiled row's untimed warm-up took on one prompt set (its compiles, plus one pass over
    the prompts); '' when nothing was compiled. The first set pays the compiles, a later set only new shapes."""
    block, compiled_ours = result["sets"][kind], result["settings"].get("compile")
    warmups = {name: seconds for name, seconds in block.get("warmup_seconds", {}).items()
               if name.endswith("-compiled") or (compiled_ours and block["methods"][name]["family"] == "ours")}
    if not warmups:
        return ""
    return ("warm-up before timing (compiling, then one pass over the prompts): "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in warmups.items()))


def markdown_report(result: dict) -> str:
    """The whole benchmark as Markdown (for READMEs): what ran on what, then a table per prompt set, each
    headed by its prompt count, mean prompt length and the run's date."""
    lines = [f"- {line}" for line in describe_run(result)]
    for kind, block in result["sets"].items():
        lines += ["", f"**{kind} prompts** ({block['prompts']} prompts, mean {block['mean_prompt_tokens']:g} prompt "
                      f"tokens, {result['machine']['date_utc']})", "", markdown_table(result, kind)]
        compiling = compile_warmups(result, kind)
        if compiling:
            lines += ["", compiling]
    lines += [f"\nskipped {name}: {reason}" for name, reason in result.get("skipped", {}).items()]
    return "\n".join(lines) + "\n"


def figures(result: dict) -> list:
    """The report's plotly figures, in the course style (`viz.style`): speedup, tau, tokens/s per method and set;
    acceptance per draft position."""
    import plotly.graph_objects as go

    from specdec_lab import viz

    sets = result["sets"]
    bars = []
    for field, title, y_title in (("speedup", "Speedup over Hugging Face generate (same run)", "speedup (x)"),
                                  ("tau", "Mean accepted tokens per target forward (tau, AR = 1)", "tau"),
                                  ("tokens_per_second", "Tokens per second (median of repeats)", "tokens / s")):
        figure = go.Figure([go.Bar(name=kind, x=list(block["methods"]), y=[r[field] for r in block["methods"].values()])
                            for kind, block in sets.items()])
        figure.update_layout(barmode="group")
        bars.append(viz.style(figure, title, "method", y_title))
    position = go.Figure()
    for kind, block in sets.items():
        for name, row in block["methods"].items():
            rates = row["per_position_acceptance"]
            if rates:
                position.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                                              name=f"{name} ({kind})"))
    viz.style(position, "Survival per draft position: share of steps that kept every draft token up to it",
              "draft position", "kept 1..i / drafted i")
    position.update_yaxes(range=[0, 1.05])
    position.update_layout(legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"})
    return [bars[0], bars[1], position, bars[2]]


def html_table(result: dict, kind: str) -> str:
    """One prompt set as an HTML table."""
    block = result["sets"][kind]
    head = "".join(f"<th>{html.escape(t)}</th>" for t in ["method", "", *[title for title, _, _ in COLUMNS]])
    body = []
    for name, row in block["methods"].items():
        cells = [cell(row, field, pattern, block["prompts"]) for _, field, pattern in COLUMNS]
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in [name, row["label"], *cells])
                    + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def html_report(result: dict, title: str = "Speculative decoding benchmark", intro: str = "") -> str:
    """One self-contained HTML page: plotly.js embedded once, the charts, the tables, the run's description."""
    charts = [figure.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, figure in enumerate(figures(result))]
    tables = "".join(f"<h2>{html.escape(kind)}: {block['prompts']} prompts</h2>{html_table(result, kind)}"
                     for kind, block in result["sets"].items())
    skipped = "".join(f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>"
                      for name, reason in result.get("skipped", {}).items())
    about = "".join(f"<p>{html.escape(line)}</p>" for line in describe_run(result))
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;"
             "text-align:right}td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{intro}{about}{tables}"
            + (f"<h2>Skipped</h2><ul>{skipped}</ul>" if skipped else "")
            + "".join(charts) + "</body></html>\n")


def write_html(result: dict, path: str | os.PathLike, title: str = "Speculative decoding benchmark",
               intro: str = "") -> Path:
    """Write the HTML report (charts and tables, plotly.js included) to `path`; `intro` is trusted HTML."""
    return write_atomic(path, html_report(result, title, intro))


# ----------------------------------------------------------------------------------------------- the sweep


def sweep_table(result: dict) -> str:
    """`specdec sweep`'s figures as a terminal table: per method, alpha and tau at each temperature."""
    temperatures = result["settings"]["temperatures"]
    settings = result["settings"]
    lines = [f"{settings['prompts']} held-out prompts x {settings['max_new_tokens']} new tokens, {settings['seeds']} "
             f"seeds per prompt when sampling, k {settings['k']}, tree budget {settings['tree_tokens']}",
             f"{'method':<20}" + "".join(f"{f'T={t:g}':>14}" for t in temperatures) + "   (alpha / tau)"]
    for name, row in result["methods"].items():
        cells = "".join(f"{f'{a:.2f} / {t:.2f}':>14}" for a, t in zip(row["alpha"], row["tau"], strict=True))
        lines.append(f"{name:<20}{cells}" + ("" if row["lossless"] else "   LOSSY"))
    lines += [f"skipped {name}: {reason}" for name, reason in result.get("skipped", {}).items()]
    return "\n".join(lines)


def write_sweep_html(result: dict, path: str | os.PathLike,
                     title: str = "Acceptance against temperature") -> Path:
    """Write `specdec sweep`'s figure and table into one self-contained HTML page (plotly.js embedded)."""
    from specdec_lab import viz

    figure = viz.acceptance_vs_temperature(result["methods"]).to_html(full_html=False, include_plotlyjs=True)
    table = html.escape(sweep_table(result))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            "<body style='font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em'>"
            f"<h1>{html.escape(title)}</h1>{figure}<pre>{table}</pre>"
            "<p>Dashed lines are LOSSY (their output is not distributed as the target's).</p></body></html>\n")
    return write_atomic(path, page)
