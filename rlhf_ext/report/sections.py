"""The report page's sections as HTML fragments: the run table (with throughput and configuration
differences), seed groups, paired comparisons, incidents, and the figure panels. Every text from
the records is escaped (:func:`escape`)."""

from __future__ import annotations

import html
from typing import Optional, Sequence

import numpy as np

from .collect import ReportData
from .configdiff import algorithm_summary, format_value
from .evals import PairRow
from .figures import seed_group_figures
from .groups import has_seed_groups
from .incidents import incident_rows
from .loaded_runs import RunRecord

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


def escape(text) -> str:
    return html.escape(str(text), quote=True)


_e = escape


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "\u2014"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(x: Optional[float]) -> str:
    if x is None:
        return "\u2014"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def _last(values) -> Optional[float]:
    if values is None or not len(values) or not np.isfinite(values[-1]):
        return None
    return float(values[-1])


def _status_badge(run: RunRecord) -> str:
    text = run.status.replace("_", " ")
    if run.exit_code not in (None, 0):
        text += f" (exit {run.exit_code})"
    css = run.status if run.status in ("finished", "running", "stopped_by_guard", "crashed") else "unknown"
    return f'<span class="status {css}">{_e(text)}</span>'


def run_table(data: ReportData, colors: Sequence[str]) -> str:
    rows = []
    for run, color in zip(data.runs, colors):
        algo = algorithm_summary(run.args)
        algo_text = " \u00b7 ".join(_e(f"{k} {v}" if k in ("KL", "clip") else v) for k, v in algo.items())
        steps = "\u2014" if run.last_step is None else f"{run.last_step}"
        if run.resumes:
            steps += f' <span class="small">(resumed at {", ".join(map(str, run.resumes))})</span>'
        rows.append(
            f'<tr><td><span class="swatch" style="background:{color}"></span><b>{_e(run.name)}</b>'
            f'<div class="small" title="{_e(run.path)}">{_e(run.path.name)}</div></td>'
            f"<td>{algo_text}</td><td class=num>{steps}</td><td>{_status_badge(run)}</td>"
            f"<td class=num>{_duration(run.wall_time_s)}</td><td class=num>{_count(_last(run.budget().get('samples')))}"
            f"</td><td class=num>{_count(run.tokens_generated())}</td></tr>")
    table = ("<table id=run-table><tr><th>run</th><th>algorithm (estimator \u00b7 loss \u00b7 aggregation \u00b7 KL "
             "\u00b7 clip)</th><th>last step</th><th>status</th><th>wall time</th><th>budget: samples generated</th>"
             "<th>tokens generated</th></tr>"
             + "".join(rows) + "</table>")
    return table + _throughput_table(data) + _diff_table(data, colors)


def _throughput_table(data: ReportData) -> str:
    from .throughput_table import throughput_rows

    rows = throughput_rows(data.runs)
    if not any(r.s_per_step is not None for r in rows):
        return ""

    def cell(x, fmt):
        return "\u2014" if x is None else fmt.format(x)

    body = "".join(f"<tr><td>{_e(r.name)}</td><td class=num>{cell(r.s_per_step, '{:.3g}')}</td>"
                   f"<td class=num>{cell(r.tokens_per_s, '{:.4g}')}</td><td class=num>{cell(r.speed_vs_first, '{:.2f}x')}"
                   f"</td><td class=num>{cell(None if r.wait_share is None else 100 * r.wait_share, '{:.0f}%')}</td>"
                   f"<td class=num>{cell(r.weight_sync_s, '{:.3g}')}</td>{_mfu_cell(r)}</tr>" for r in rows)
    return ("<h3 style='font-size:14px;margin:16px 0 6px'>Throughput (medians over steps)</h3>"
            "<table id=throughput-table><tr><th>run</th><th>s/step</th><th>completion tokens/s</th>"
            "<th>speed vs first run</th><th>% of step waiting for rollouts</th><th>weight sync, s</th>"
            "<th title='model FLOPs of the policy update (6N + 12LHQT per token, PaLM) / (update time x peak x "
            "devices); generation and reference passes not counted'>MFU of the update (run; median step)</th></tr>"
            + body + "</table>")


def _mfu_cell(r) -> str:
    if r.mfu is None:
        short = (r.mfu_note or "").split(" (")[0]  # the whole reason in the tooltip
        return f'<td class="num mfu" title="{_e(r.mfu_note or "")}">\u2014 <span class=small>{_e(short)}</span></td>'
    step = "" if r.mfu_median_step is None else f"; {100 * r.mfu_median_step:.3g}%"
    return f'<td class="num mfu" title="{_e(r.mfu_note or "")}">{100 * r.mfu:.3g}%{step}</td>'


def _diff_table(data: ReportData, colors: Sequence[str]) -> str:
    diff = data.diff
    if len(data.runs) < 2 or diff is None:
        return '<p class="note">One run: no configuration to compare.</p>'
    extra = (f"{diff.same} settings are identical in all runs"
             + (f"; {diff.output_locations} output locations (checkpoint paths, run directories) differ and are "
                "not shown" if diff.output_locations else "") + ".")
    if not diff.keys:
        return f'<p class="note" id=config-diff>No configuration key differs between the runs. {_e(extra)}</p>'
    head = "".join(f'<th><span class="swatch" style="background:{c}"></span>{_e(r.name)}</th>'
                   for r, c in zip(data.runs, colors))
    body = "".join(f"<tr><td><code>{_e(k)}</code></td>" + "".join(f"<td>{_e(format_value(v))}</td>"
                                                                  for v in diff.values[k]) + "</tr>"
                   for k in diff.keys)
    return (f"<h3 style='font-size:14px;margin:16px 0 6px'>Configuration differences ({len(diff.keys)} keys)</h3>"
            f"<table id=config-diff><tr><th>key</th>{head}</tr>{body}</table><p class=note>{_e(extra)}</p>")


def _sd(x: Optional[float], scale: float = 1.0) -> str:
    return "\u2014" if x is None else f"{scale * x:.3g}"


def groups_section(data: ReportData, colors: Sequence[str]) -> str:
    """The seed-group table, the comparisons between groups and their figures."""
    groups = data.groups
    if not has_seed_groups(groups):
        return ('<p class="note" id=groups-none>No seed groups: every run differs from the others in more than its '
                "seed. Runs that differ only in <code>train.seed</code> (e.g. a queue run with <code>seeds = [0, 1, 2]"
                "</code>) are grouped here, with their mean and spread.</p>")
    label = data.metric_label or "metric"
    tasks = sorted({t for g in groups for t in g.evals})
    head = "".join(f"<th>{_e(t)} avg@n (%), mean \u00b1 SD</th>" for t in tasks)
    rows = []
    for gi, g in enumerate(groups):
        swatches = "".join(f'<span class="swatch" style="background:{colors[i]}"></span>' for i in g.runs)
        members = ", ".join(f"{data.runs[i].name} (seed {format_value(s)})" for i, s in zip(g.runs, g.seeds))
        m = g.metric
        metric = "\u2014" if m is None else (f"{m.mean:.3g} \u00b1 {_sd(m.sd)}"
                                              f'<div class=small>{", ".join(f"{v:.3g}" for v in m.values)}</div>')
        cells = "".join("<td class=num>" + (f"{100 * g.evals[t].mean:.1f} \u00b1 {_sd(g.evals[t].sd, 100)}"
                                             if t in g.evals else "\u2014") + "</td>" for t in tasks)
        rows.append(f"<tr data-group='{gi}'><td>{swatches}<b>{_e(g.name)}</b></td><td class=num>{len(g.runs)}</td>"
                    f"<td>{_e(members)}</td><td class=num>{metric}</td>{cells}</tr>")
    table = (f"<table id=group-table><tr><th>group</th><th>seeds</th><th>runs</th><th>final-{data.window}-step "
             f"{_e(label)}, mean \u00b1 SD across seeds (each seed below)</th>{head}</tr>{''.join(rows)}</table>")
    comp = ""
    if data.group_rows:
        body = []
        for r in data.group_rows:
            scale, unit = (100, " points") if r.what.endswith("avg@n") else (1, "")
            if r.exceeds is None:
                verdict = '<span class="verdict-no">one seed: spread unknown</span>'
            elif r.exceeds:
                verdict = '<span class="verdict-yes">larger than the seed spread</span>'
            else:
                verdict = '<span class="verdict-no">within the seed spread</span>'
            se = "\u2014" if r.se is None else f"{2 * scale * r.se:.3g}"
            body.append(f"<tr><td>{_e(r.other)} \u2212 {_e(r.baseline)}</td><td>{_e(r.what)}</td>"
                        f"<td class=num>{scale * r.difference:+.3g}{unit}</td><td class=num>{se}</td><td>{verdict}</td></tr>")
        comp = ("<h3 style='font-size:14px;margin:16px 0 6px'>Groups compared with the first</h3>"
                "<table id=group-comparisons><tr><th>groups</th><th>quantity</th><th>difference of means</th>"
                "<th>2 SE over seeds</th><th>verdict</th></tr>" + "".join(body) + "</table><p class=note>SE: Welch's "
                "standard error of the difference over seeds, sqrt(sd\u2081\u00b2/n\u2081 + sd\u2082\u00b2/n\u2082). "
                "Larger than the seed spread: the difference exceeds 2 SE.</p>")
    figs = "".join(figure_div(div_id, fig) for div_id, fig in seed_group_figures(data, colors))
    return table + comp + (f'<div class="grid" style="margin-top:12px">{figs}</div>' if figs else "")


def pair_table(pairs: Sequence[PairRow], effect: str = "") -> str:
    if not pairs:
        return ('<p class="note" id=pair-table>No paired comparison: it needs two different evaluations at the same '
                "step (between runs) or two checkpoints of one run.</p>")
    rows = []
    for row in pairs:
        if row.note or not row.metrics:
            rows.append(f"<tr><td>{_e(row.kind)}</td><td>{_e(row.task)}</td><td>{_e(row.baseline)}</td>"
                        f"<td>{_e(row.other)}</td><td colspan=5>{_e(row.note or 'nothing to pair')}</td></tr>")
            continue
        for metric, m in row.metrics.items():
            lo, hi = m["ci95"]
            noise = ('<span class="verdict-yes">distinguishable</span>' if m["distinguishable"]
                     else '<span class="verdict-no">within noise</span>')
            word = m.get("verdict", "")
            css = "verdict-no" if word in ("", "no difference") else "verdict-yes"
            resolution = (f'<span class="{css}" data-verdict="{_e(word)}">{_e(word)}</span>'
                          f'<div class=small>{_e(m.get("reason", ""))}</div>')
            rows.append(
                f"<tr><td>{_e(row.kind)}</td><td>{_e(row.task)}</td><td>{_e(row.baseline)}</td><td>{_e(row.other)}</td>"
                f"<td>{_e(metric)}</td><td class=num>{row.problems}</td><td class=num>{100 * m['baseline']:.1f} \u2192 "
                f"{100 * m['run']:.1f}</td><td class=num>{100 * m['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                f"</td><td>{noise}</td><td>{resolution}</td></tr>")
    return ("<table id=pair-table><tr><th>comparison</th><th>task</th><th>baseline</th><th>compared</th><th>metric</th>"
            "<th>problems</th><th>% baseline \u2192 compared</th><th>difference, points [95% CI]</th><th>interval</th>"
            "<th>verdict at the experiment's resolution</th></tr>"
            + "".join(rows) + "</table><p class=note>evalkit's paired bootstrap over problems (problems paired by id; "
            "2000 resamples). Within noise: the 95% interval of the difference contains 0. Better / worse: the interval "
            f"excludes 0 and the difference is at least the minimum effect ({_e(effect)}); otherwise no "
            "difference.</p>")


def incidents_table(runs: Sequence[RunRecord]) -> str:
    rows = incident_rows(runs)
    if not rows:
        return ('<p class="note" id=incidents-table>No incidents: no guard incident, mismatch warning, restart, '
                "abnormal end or non-finite value in any run.</p>")
    body = "".join(f"<tr><td>{_e(r)}</td><td class=num>{'' if s < 0 else s}</td><td>{_e(k)}</td><td>{_e(d)}</td></tr>"
                   for r, s, k, d in rows)
    return f"<table id=incidents-table><tr><th>run</th><th>step</th><th>what</th><th>detail</th></tr>{body}</table>"


def figure_div(div_id: str, fig) -> str:
    return ('<div class="panel" data-panel="{0}">'.format(_e(div_id))
            + fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG,
                          default_height=fig.layout.height or 340, default_width="100%")
            + "</div>")


def missing_div(panel_id: str, title: str, note: str) -> str:
    return (f'<div class="panel missing" id="missing-{_e(panel_id)}" data-panel="missing-{_e(panel_id)}">'
            f"<h3>{_e(title)}</h3><p>{_e(note)}</p></div>")
