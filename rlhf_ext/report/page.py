"""Assemble the report: load runs and evaluations, compute the tables and headline, build the
figures, and write one self-contained HTML file (plotly.js inlined once, no network access).

Sections, in order: run table (with the computed configuration differences), headline,
training dynamics (x axis switch step / wall-clock, moving-average window), evaluation over
checkpoints (bands = bootstrap 95% intervals) with the paired-comparison table, incidents, and
notes about the data (unreadable lines, evaluations that match no run).

File size: plotly.js is ~4.8 MB; the data adds at most about 0.5 MB per run for 10,000 steps
(17 panels x (800 raw + 400 smoothed points + 9 moving-average windows), float32) and the sample
viewer at most :data:`.samples.SAMPLE_BUDGET_BYTES` (2 MiB) in all, so a report of 10 runs x 10,000
steps with their rollout samples stays under :data:`SIZE_BOUND_BYTES` (tested).

The pieces: :mod:`.collect` (the data: :class:`ReportData`), :mod:`.sections` (tables and panels as
HTML), :mod:`.incidents`, and the page's style and script as files in :mod:`.assets`
(``page.css``, ``page.js``). This module puts them on one page: :func:`render_html`,
:func:`write_report`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional, Sequence

from . import assets, sample_viewer
from .collect import ReportData, collect, measured_min_effect, sample_payload, say, template_notes
from .figures import (BUDGET_KNOTS, DynamicsFigure, budget_axes, dynamics_figure, eval_figures, run_colors,
                      timing_figure, training_eval_figures, wall_unit, window_choices)
from .incidents import incident_rows
from .sections import (PLOTLY_CONFIG, escape as _e, figure_div, groups_section, incidents_table, missing_div,
                       pair_table, run_table)

__all__ = ["SIZE_BOUND_BYTES", "ReportData", "collect", "render_html", "write_report", "incident_rows",
           "budget_axes", "BUDGET_KNOTS", "sample_payload", "template_notes", "measured_min_effect", "PLOTLY_CONFIG"]

SIZE_BOUND_BYTES = 14 * 1024 * 1024
"""Upper bound on the file size of a 10-run x 10,000-step report (plotly.js and the sample viewer's answers included)."""


def render_html(data: ReportData, title: Optional[str] = None, command: Optional[str] = None) -> str:
    """The report page as one HTML string."""
    from plotly.offline import get_plotlyjs

    import rlhf_ext

    runs = data.runs
    colors = run_colors(len(runs))
    windows, default_window = window_choices(runs)
    unit, wall_label = wall_unit(runs)
    title = title or "RL runs: " + ", ".join(r.name for r in runs)

    dyn_parts, dyn_ids, smoothing = [], [], {}
    for pd in data.panels:
        if pd.empty:
            if not pd.panel.only_if_logged:
                dyn_parts.append(missing_div(pd.panel.id, pd.panel.title, pd.note))
            continue
        df: DynamicsFigure = dynamics_figure(pd, runs, colors, windows, default_window, unit)
        dyn_ids.append(df.div_id)
        smoothing[df.div_id] = df.smoothing
        div = figure_div(df.div_id, df.figure)
        if pd.note:
            div = div[:-len("</div>")] + f'<p class="note">{_e(pd.note)}</p></div>'
        dyn_parts.append(div)
    timing = timing_figure(runs, colors)
    if timing is None:
        dyn_parts.append(missing_div("timing", "Mean time per step by phase", "No run logged timing/* keys."))
    else:
        dyn_parts.append(figure_div(*timing))

    eval_parts = [figure_div(div_id, fig) for div_id, fig in eval_figures(data.points, runs, colors)]
    eval_parts += [figure_div(div_id, fig) for div_id, fig in training_eval_figures(runs, colors)]
    if not data.evals and eval_parts:
        eval_html = f'<div class="grid">{"".join(eval_parts)}</div>'
    elif not data.evals:
        eval_html = ('<p class="note" id=evals-none>No evaluations given. Evaluate checkpoints with <code>evalkit</code> '
                     "and pass the output directories with <code>--evals</code>.</p>")
    elif not eval_parts:
        eval_html = '<p class="note" id=evals-none>None of the evaluations given could be placed on a run (see Notes).</p>'
    else:
        eval_html = f'<div class="grid">{"".join(eval_parts)}</div>'
    eval_html += "<h3 style='font-size:14px;margin:16px 0 6px'>Paired comparisons</h3>" + pair_table(data.pairs, data.min_effect.describe() if data.min_effect else "")

    notes = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    notes += [f"evaluation {ev.path} not shown: {why}" for ev, why in data.unplaced]
    notes += data.template_notes
    notes += data.sample_notes
    if any(r.wall_time_s is None for r in runs if len(r.steps)):
        notes.append("some runs record no elapsed time: they are absent when the x axis is wall-clock time")
    notes_html = ("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>") if notes else \
        '<p class="note">Nothing unusual in the records.</p>'

    budget = budget_axes(runs)
    budget_modes = [m for m in ("samples", "tokens") if any(m in b for b in budget.values())]
    blob = {"dynamics": dyn_ids, "smoothing": smoothing, "wallLabel": wall_label, "budget": budget,
            "budgetLabels": {"samples": "samples generated", "tokens": "tokens generated"}}
    budget_opts = "".join(f'<option value="{m}">{m} generated</option>' for m in budget_modes)
    blob_json = json.dumps(blob, separators=(",", ":")).replace("</", "<\\/")
    window_opts = "".join(f'<option value="{w}"{" selected" if w == default_window else ""}>'
                          f'{"off (raw)" if w == 1 else f"{w} steps"}</option>' for w in windows)
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    sub = f"generated {generated} by rlhf_ext {rlhf_ext.__version__}"
    if command:
        sub += f" \u00b7 <code style='color:#cbd5e1'>{_e(command)}</code>"
    headline_html = ("<ul class=headline id=headline>" + "".join(f"<li>{_e(s)}</li>" for s in data.headline)
                     + "</ul>") if data.headline else '<p class="note" id=headline>No metric to summarise.</p>'
    plotly_js = get_plotlyjs()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{assets.text('page.css')}{sample_viewer.CSS}</style>
<script type="text/javascript">{plotly_js}</script></head>
<body data-xaxis="step" data-window="{default_window}">
<header><h1>{_e(title)}</h1><div class="sub">{sub}</div></header>
<nav><a href="#runs">Runs</a><a href="#headline-section">Headline</a><a href="#groups">Seed groups</a><a href="#dynamics">Training dynamics</a>
<a href="#evaluation">Evaluation</a><a href="#samples">Samples</a><a href="#incidents">Incidents</a><a href="#notes">Notes</a></nav>
<main>
<section id="runs"><h2>Runs</h2>{run_table(data, colors)}</section>
<section id="headline-section"><h2>Headline</h2>{headline_html}</section>
<section id="groups"><h2>Seed groups</h2>{groups_section(data, colors)}</section>
<section id="dynamics"><h2>Training dynamics</h2>
<div class="controls"><label>x axis <select id="xaxis"><option value="step" selected>step</option>
<option value="wall">{_e(wall_label)}</option>{budget_opts}</select></label>
<label>moving average <select id="window">{window_opts}</select></label>
<span class="small">thin lines: raw values; bold: moving average over the chosen number of logged steps;
red crosses: non-finite values; long runs are thinned for display (min/max per bucket)</span></div>
<div class="grid">{"".join(dyn_parts)}</div></section>
<section id="evaluation"><h2>Evaluation over checkpoints</h2>
<p class="small">Bands and error bars: bootstrap 95% intervals over problems (evalkit).</p>{eval_html}</section>
<section id="samples"><h2>Answers beside the curves</h2>{sample_viewer.section(data.samples)}</section>
<section id="incidents"><h2>Incidents</h2>{incidents_table(runs)}</section>
<section id="notes"><h2>Notes on the data</h2>{notes_html}</section>
</main>
<script type="application/json" id="rlhf-report-data">{blob_json}</script>
<script type="text/javascript">{assets.text('page.js')}</script>
<script type="text/javascript">{sample_viewer.JS}</script>
</body></html>
"""


def write_report(run_dirs: Sequence, output, eval_dirs: Sequence = (), names: Optional[Sequence[str]] = None,
                 title: Optional[str] = None, quiet: bool = True, command: Optional[str] = None,
                 min_effect_points: Optional[float] = None) -> Path:
    """Build the report of ``run_dirs`` (and evalkit ``eval_dirs``) and write it to ``output``."""
    data = collect(run_dirs, eval_dirs, names, quiet=quiet, min_effect_points=min_effect_points)
    say("building the page", quiet)
    text = render_html(data, title=title, command=command)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    return output
