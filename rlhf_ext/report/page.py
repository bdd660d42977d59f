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
"""

from __future__ import annotations

import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .configdiff import ConfigDiff, algorithm_summary, diff_configs, format_value
from .evals import EvalPoint, EvalRun, PairRow, attribute, find_eval_dirs, load_eval, paired_rows
from .figures import (DynamicsFigure, dynamics_figure, eval_figures, run_colors, seed_group_figures, timing_figure,
                      training_eval_figures, wall_unit, window_choices)
from ..evalkit.resolution import MinEffect, audited_error, min_effect, verdict
from .groups import GroupComparison, SeedGroup, comparisons, has_seed_groups, seed_groups
from .headline import group_sentences, headline, headline_metric, latest_pairs, window_size
from .panels import PANELS, PanelData, resolve
from . import sample_viewer
from .runs import RunRecord, load_runs

SIZE_BOUND_BYTES = 14 * 1024 * 1024
"""Upper bound on the file size of a 10-run x 10,000-step report (plotly.js and the sample viewer's answers included)."""

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


@dataclass
class ReportData:
    """Everything the page shows, computed from the records (no HTML here)."""

    runs: List[RunRecord]
    evals: List[EvalRun] = field(default_factory=list)
    points: List[EvalPoint] = field(default_factory=list)
    unplaced: List[Tuple[EvalRun, str]] = field(default_factory=list)
    pairs: List[PairRow] = field(default_factory=list)
    diff: Optional[ConfigDiff] = None
    panels: List[PanelData] = field(default_factory=list)
    headline: List[str] = field(default_factory=list)
    groups: List[SeedGroup] = field(default_factory=list)
    """Seed groups (runs that differ only in their seed), each run in exactly one."""
    group_rows: List[GroupComparison] = field(default_factory=list)
    metric_label: Optional[str] = None
    metric_keys: Dict[str, Optional[str]] = field(default_factory=dict)
    window: int = 1
    template_notes: List[str] = field(default_factory=list)
    """Evaluations whose prompt template differs from the one their run trained with."""
    min_effect: Optional[MinEffect] = None
    """The minimum effect of the evaluation verdicts (given, or seed spread + audited grader error)."""
    samples: Dict[str, object] = field(default_factory=lambda: {"prompts": [], "prompt_ids": [], "sources": []})
    """The sample viewer's data (:func:`.samples.viewer_payload`)."""
    sample_notes: List[str] = field(default_factory=list)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"rlhf-ext report: {message}", file=sys.stderr, flush=True)


def collect(run_dirs: Sequence, eval_dirs: Sequence = (), names: Optional[Sequence[str]] = None,
            resamples: int = 2000, quiet: bool = True, min_effect_points: Optional[float] = None) -> ReportData:
    """Load and compute everything (the data side of the report). ``min_effect_points``: the minimum
    effect of the evaluation verdicts in points (default: measured, :func:`measured_min_effect`)."""
    _say(f"reading {len(run_dirs)} run(s)", quiet)
    runs = load_runs(run_dirs, names)
    data = ReportData(runs=runs, diff=diff_configs([r.config for r in runs]))
    if eval_dirs:
        paths = find_eval_dirs(eval_dirs)
        _say(f"reading {len(paths)} evaluation(s)", quiet)
        data.evals = [load_eval(p) for p in paths]
        data.points, data.unplaced = attribute(data.evals, runs)
        _say("paired bootstrap comparisons", quiet)
        data.pairs = paired_rows(data.points, runs, resamples=resamples)
        data.template_notes = template_notes(data.points, runs)
    data.panels = [resolve(p, runs) for p in PANELS]
    done = [r for r in runs if r.last_step is not None]
    data.window = window_size(done)
    data.metric_label, data.metric_keys = headline_metric(done)
    data.groups = seed_groups(runs, data.metric_keys, data.window, data.points)
    data.group_rows = comparisons(data.groups, data.metric_label or "metric")
    # With seed groups, groups are compared (by the seeds' spread), not single runs.
    data.headline = headline(runs, data.pairs, compare_runs=not has_seed_groups(data.groups))
    data.headline += group_sentences(data.groups, data.group_rows, data.metric_label, data.window)
    if data.template_notes:
        data.headline.append(f"Warning: {len(data.template_notes)} evaluation(s) used a prompt template other than "
                             "the one their run trained with (see Notes on the data).")
    if data.pairs or min_effect_points is not None:
        data.min_effect = measured_min_effect(data, min_effect_points)
        for row in data.pairs:
            for m in row.metrics.values():
                m["verdict"], m["reason"] = verdict(100 * m["difference"], [100 * x for x in m["ci95"]],
                                                    data.min_effect)
        said = [f"{row.task} avg@n, {row.other} vs {row.baseline}: {m['verdict']} ({m['reason']})"
                for row in latest_pairs(data.pairs) if (m := row.metrics.get("avg@n"))]
        if said:
            data.headline.append(f"Evaluation verdicts at the experiment's resolution ({data.min_effect.describe()}): "
                                 + "; ".join(said) + ".")
    data.samples, data.sample_notes = sample_payload(data)
    return data


def sample_payload(data: ReportData):
    """The sample viewer's sources: each run's rollout samples, then each evaluation's answers (named
    after the run step it was placed on, when it was)."""
    from .samples import eval_source, run_source, viewer_payload

    sources = [s for r in data.runs if (s := run_source(r.name, r.path, r.warnings)) is not None]
    for ev in data.evals:
        placed = [p for p in data.points if p.eval is ev]
        if placed:
            first = placed[0]
            name = f"evaluation of {data.runs[first.run].name} step {first.step}"
            if len(placed) > 1:
                name += f" (= {len(placed) - 1} other run(s)' step {first.step})"
        else:
            name = f"evaluation {ev.path.name}"
        source = eval_source(name, ev.path)
        if source is not None:
            sources.append(source)
    return viewer_payload(sources)


def template_notes(points: Sequence[EvalPoint], runs: Sequence[RunRecord]) -> List[str]:
    """One note per (evaluation, run) whose prompt templates differ (evalkit's ``template_mismatch``)."""
    from ..evalkit.records import RunDirError, read_json
    from ..evalkit.templates import template_mismatch

    notes, seen = [], set()
    for p in points:
        key = (str(p.eval.path), p.run)
        if key in seen:
            continue
        seen.add(key)
        try:
            generation = read_json(Path(p.eval.path) / "config.json").get("generation", {})
        except RunDirError:
            continue
        message = template_mismatch(runs[p.run].args, generation)
        if message:
            notes.append(f"{runs[p.run].name} @ step {p.step}: evaluation {p.eval.path}: {message}")
    return notes


def measured_min_effect(data: ReportData, given: Optional[float] = None) -> MinEffect:
    """``given`` (points) when set; else the seed spread of avg@n (pooled over the seed groups with two or
    more evaluated seeds: the square root of the mean of their variances, largest over tasks) plus the
    largest grader error rate audited (``evalkit audit``) among the evaluations on the page."""
    if given is not None:
        return min_effect(given)
    spreads = []
    tasks = {t for g in data.groups for t in g.evals}
    for task in tasks:
        variances = [g.evals[task].sd ** 2 for g in data.groups if task in g.evals and g.evals[task].sd is not None]
        if variances:
            spreads.append(100 * (sum(variances) / len(variances)) ** 0.5)
    return min_effect(None, max(spreads) if spreads else None, audited_error([ev.path for ev in data.evals]))


# --- HTML ----------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:14px 28px}
header h1{margin:0;font-size:20px;font-weight:600} header .sub{color:#cbd5e1;font-size:12px;margin-top:4px}
nav{padding:6px 28px;background:#eef2f7;font-size:13px;position:sticky;top:0;z-index:10;border-bottom:1px solid #dde3ea}
nav a{margin-right:16px;color:#1f4e8c;text-decoration:none}
main{padding:8px 28px 40px}
section{margin-top:22px} h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;background:#fff} th,td{border:1px solid #dde;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f4f8;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.status{padding:1px 7px;border-radius:9px;font-size:12px;white-space:nowrap}
.finished{background:#dcfce7;color:#14532d}.running{background:#dbeafe;color:#1e3a8a}
.stopped_by_guard,.crashed{background:#fee2e2;color:#7f1d1d}.unknown{background:#eee;color:#444}
ul.headline li{margin:4px 0;line-height:1.45}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
.panel{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:6px}
.panel.missing{padding:12px 14px;color:#555} .panel.missing h3{margin:0 0 6px;font-size:14px;color:#333}
.note{font-size:12px;color:#666;margin:4px 6px}
.controls{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:8px 12px;margin-bottom:12px;font-size:13px}
.controls label{margin-right:18px} .verdict-yes{color:#14532d;font-weight:600} .verdict-no{color:#555}
.small{font-size:12px;color:#555} code{font-size:12px}
"""

_JS = """
(function () {
  var blob = JSON.parse(document.getElementById("rlhf-report-data").textContent);
  function decode(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }
  var stepX = {}, stepNum = {}, knots = {}, stepTicks = {};
  // budget axes: a run's cumulative samples / tokens at a step, linear between the stored knots
  function toBudget(run, mode, steps) {
    var out = new Array(steps.length);
    if (!run || !run[mode]) { for (var i = 0; i < steps.length; i++) out[i] = NaN; return out; }
    var key = run.name + "/" + mode;
    if (!knots[key]) knots[key] = [decode(run[mode].steps), decode(run[mode].values)];
    var xs = knots[key][0], ys = knots[key][1];
    for (var i = 0; i < steps.length; i++) {
      var s = steps[i], lo = 0, hi = xs.length - 1;
      if (s <= xs[0]) { out[i] = s === xs[0] ? ys[0] : NaN; continue; }
      if (s >= xs[hi]) { out[i] = s === xs[hi] ? ys[hi] : NaN; continue; }
      while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] <= s) lo = mid; else hi = mid; }
      out[i] = ys[lo] + (ys[hi] - ys[lo]) * (s - xs[lo]) / (xs[hi] - xs[lo]);
    }
    return out;
  }
  function setX(mode) {
    blob.dynamics.forEach(function (id) {
      var gd = document.getElementById(id);
      if (!gd || !gd.data) return;
      if (!stepX[id]) {
        stepX[id] = gd.data.map(function (t) { return t.x; });
        // the decoded step values (plotly keeps t.x base64-encoded), read before any switch
        stepNum[id] = gd._fullData.map(function (t) { return Array.from(t.x || []); });
      }
      var budget = mode === "samples" || mode === "tokens";
      var xs = gd.data.map(function (t, i) {
        if (mode === "wall") return t.customdata;
        if (budget) return toBudget(blob.budget[t.legendgroup], mode, stepNum[id][i]);
        return stepX[id][i];
      });
      Plotly.restyle(gd, {x: xs});
      var title = mode === "wall" ? blob.wallLabel : (budget ? blob.budgetLabels[mode] : "step");
      var axis = {"xaxis.title.text": title, "xaxis.autorange": true};
      // steps are integers: the step axis keeps its integer tick spacing (figures.step_axis); others are auto
      if (!stepTicks[id]) stepTicks[id] = gd.layout.xaxis.dtick;
      axis["xaxis.tickmode"] = mode === "step" ? "linear" : "auto";
      if (mode === "step") axis["xaxis.dtick"] = stepTicks[id];
      Plotly.relayout(gd, axis);
    });
    document.body.setAttribute("data-xaxis", mode);
  }
  function setWindow(w) {
    Object.keys(blob.smoothing).forEach(function (id) {
      var gd = document.getElementById(id), fig = blob.smoothing[id];
      if (!gd || !gd.data || !fig.traces.length) return;
      Plotly.restyle(gd, {y: fig.ys[w].map(decode)}, fig.traces);
    });
    document.body.setAttribute("data-window", w);
  }
  // zoomed on the step axis: an integer spacing again for the new range (as figures.step_dtick)
  function integerTicks(gd) {
    gd.on("plotly_relayout", function (ev) {
      if (document.body.getAttribute("data-xaxis") !== "step" || ev["xaxis.dtick"] !== undefined) return;
      var r = gd.layout.xaxis.range, raw = Math.max(r[1] - r[0], 1) / 8, d = 1;
      if (raw > 1) {
        var mag = Math.pow(10, Math.floor(Math.log10(raw)));
        d = [1, 2, 5, 10].map(function (m) { return m * mag; }).filter(function (v) { return v >= raw; })[0];
      }
      if (gd.layout.xaxis.dtick !== d) Plotly.relayout(gd, {"xaxis.tickmode": "linear", "xaxis.dtick": d});
    });
  }
  blob.dynamics.forEach(function (id) {
    var gd = document.getElementById(id);
    if (gd && gd.on) integerTicks(gd);
  });
  document.getElementById("xaxis").addEventListener("change", function (e) { setX(e.target.value); });
  document.getElementById("window").addEventListener("change", function (e) { setWindow(e.target.value); });
  window.rlhfReport = {setX: setX, setWindow: setWindow};
})();
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


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


BUDGET_KNOTS = 800
"""Points per run of the samples / tokens axes; longer runs are interpolated linearly between them."""


def budget_axes(runs: Sequence[RunRecord]) -> Dict[str, Dict[str, object]]:
    """Per run name and budget (``samples``, ``tokens``): ``steps`` and the cumulative count at those
    steps (base64 float32; at most :data:`BUDGET_KNOTS` evenly spaced steps, first and last kept),
    for the page's equal-budget x axes. Steps whose count is unknown are left out."""
    from .figures import b64_f32
    from .series import stride_downsample

    out: Dict[str, Dict[str, object]] = {}
    for run in runs:
        entry: Dict[str, object] = {"name": run.name}
        for name, values in run.budget().items():
            keep = np.isfinite(values)
            if keep.any():
                x, y = stride_downsample(run.steps[keep].astype(np.float64), values[keep], BUDGET_KNOTS)
                entry[name] = {"steps": b64_f32(x), "values": b64_f32(y)}
        if len(entry) > 1:
            out[run.name] = entry
    return out


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


def _run_table(data: ReportData, colors: Sequence[str]) -> str:
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
    from .throughput import throughput_rows

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


def _groups_section(data: ReportData, colors: Sequence[str]) -> str:
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
    figs = "".join(_figure_div(div_id, fig) for div_id, fig in seed_group_figures(data, colors))
    return table + comp + (f'<div class="grid" style="margin-top:12px">{figs}</div>' if figs else "")


def _pair_table(pairs: Sequence[PairRow], effect: str = "") -> str:
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


def _steps_text(steps: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, steps[:limit]))
    return shown + (f" \u2026 ({len(steps)} in all)" if len(steps) > limit else "")


def incident_rows(runs: Sequence[RunRecord]) -> List[Tuple[str, int, str, str]]:
    """``(run, step, kind, detail)`` for guard incidents, mismatch warnings, restarts, abnormal ends
    and non-finite metric values, sorted by run then step."""
    rows = []
    for run in runs:
        incident_files = {inc.get("file"): inc for inc in run.incidents}
        for e in run.events:
            kind, step = e.get("event"), e.get("step")
            step = int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else -1
            if kind == "guard_incident":
                inc = incident_files.get(e.get("incident")) or {}
                detail = (f"non-finite {e.get('tensor', inc.get('tensor', '?'))} on rank {e.get('rank', inc.get('rank', '?'))}"
                          f", mode {e.get('mode', '?')}")
                if inc:
                    if inc.get("micro_batch") is not None:
                        detail += f", micro-batch {inc['micro_batch']}"
                    origin = inc.get("origin")
                    if isinstance(origin, dict) and origin.get("name"):
                        detail += (f", from {origin['name']} ({origin.get('nan_count')} NaN, "
                                   f"{origin.get('inf_count')} Inf, first at {tuple(origin.get('first_index') or ())})")
                        if inc.get("policy_loss_type"):
                            detail += f" of policy loss {inc['policy_loss_type']}"
                    if inc.get("sample_indices"):
                        detail += f", {len(inc['sample_indices'])} sample(s)"
                    detail += f"; last good checkpoint: {inc.get('last_good_checkpoint') or 'none'}"
                rows.append((run.name, step, "guard incident", detail))
            elif kind == "nonfinite_input":
                rows.append((run.name, step, "non-finite input",
                             f"{e.get('check', '?')} in {e.get('where', '?')}: {e.get('nan_count')} NaN, "
                             f"{e.get('inf_count')} Inf, first at {tuple(e.get('first_index') or ())}; "
                             "left to the guard"))
            elif kind == "mismatch_warning":
                value, threshold = e.get("value"), e.get("threshold")
                detail = f"{e.get('metric', '?')} = {format_value(value)} (threshold {format_value(threshold)})"
                if e.get("message"):
                    detail += f": {e['message']}"
                rows.append((run.name, step, "mismatch warning", detail))
            elif kind == "resume":
                rows.append((run.name, step, "restart", f"resumed at step {step}"))
            elif kind == "end" and e.get("status") not in ("finished", None):
                rows.append((run.name, step, "end: " + str(e.get("status")).replace("_", " "),
                             f"exit code {e.get('exit_code', '?')}"))
        if not any(e.get("event") == "resume" for e in run.events):
            for step in run.resumes:
                rows.append((run.name, step, "restart", f"steps restart at {step} in metrics.jsonl"))
        if run.status == "running":
            rows.append((run.name, run.last_step if run.last_step is not None else -1, "no end record",
                         "still running, or killed without writing its end"))
        for key, steps in sorted(run.nonfinite.items()):
            rows.append((run.name, steps[0], "non-finite metric", f"{key} at step(s) {_steps_text(steps)}"))
    order = {r.name: i for i, r in enumerate(runs)}
    return sorted(rows, key=lambda r: (order[r[0]], r[1]))


def _incidents(runs: Sequence[RunRecord]) -> str:
    rows = incident_rows(runs)
    if not rows:
        return ('<p class="note" id=incidents-table>No incidents: no guard incident, mismatch warning, restart, '
                "abnormal end or non-finite value in any run.</p>")
    body = "".join(f"<tr><td>{_e(r)}</td><td class=num>{'' if s < 0 else s}</td><td>{_e(k)}</td><td>{_e(d)}</td></tr>"
                   for r, s, k, d in rows)
    return f"<table id=incidents-table><tr><th>run</th><th>step</th><th>what</th><th>detail</th></tr>{body}</table>"


def _figure_div(div_id: str, fig) -> str:
    return ('<div class="panel" data-panel="{0}">'.format(_e(div_id))
            + fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG,
                          default_height=fig.layout.height or 340, default_width="100%")
            + "</div>")


def _missing_div(panel_id: str, title: str, note: str) -> str:
    return (f'<div class="panel missing" id="missing-{_e(panel_id)}" data-panel="missing-{_e(panel_id)}">'
            f"<h3>{_e(title)}</h3><p>{_e(note)}</p></div>")


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
            dyn_parts.append(_missing_div(pd.panel.id, pd.panel.title, pd.note))
            continue
        df: DynamicsFigure = dynamics_figure(pd, runs, colors, windows, default_window, unit)
        dyn_ids.append(df.div_id)
        smoothing[df.div_id] = df.smoothing
        div = _figure_div(df.div_id, df.figure)
        if pd.note:
            div = div[:-len("</div>")] + f'<p class="note">{_e(pd.note)}</p></div>'
        dyn_parts.append(div)
    timing = timing_figure(runs, colors)
    if timing is None:
        dyn_parts.append(_missing_div("timing", "Mean time per step by phase", "No run logged timing/* keys."))
    else:
        dyn_parts.append(_figure_div(*timing))

    eval_parts = [_figure_div(div_id, fig) for div_id, fig in eval_figures(data.points, runs, colors)]
    eval_parts += [_figure_div(div_id, fig) for div_id, fig in training_eval_figures(runs, colors)]
    if not data.evals and eval_parts:
        eval_html = f'<div class="grid">{"".join(eval_parts)}</div>'
    elif not data.evals:
        eval_html = ('<p class="note" id=evals-none>No evaluations given. Evaluate checkpoints with <code>evalkit</code> '
                     "and pass the output directories with <code>--evals</code>.</p>")
    elif not eval_parts:
        eval_html = '<p class="note" id=evals-none>None of the evaluations given could be placed on a run (see Notes).</p>'
    else:
        eval_html = f'<div class="grid">{"".join(eval_parts)}</div>'
    eval_html += "<h3 style='font-size:14px;margin:16px 0 6px'>Paired comparisons</h3>" + _pair_table(data.pairs, data.min_effect.describe() if data.min_effect else "")

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
<title>{_e(title)}</title><style>{_CSS}{sample_viewer.CSS}</style>
<script type="text/javascript">{plotly_js}</script></head>
<body data-xaxis="step" data-window="{default_window}">
<header><h1>{_e(title)}</h1><div class="sub">{sub}</div></header>
<nav><a href="#runs">Runs</a><a href="#headline-section">Headline</a><a href="#groups">Seed groups</a><a href="#dynamics">Training dynamics</a>
<a href="#evaluation">Evaluation</a><a href="#samples">Samples</a><a href="#incidents">Incidents</a><a href="#notes">Notes</a></nav>
<main>
<section id="runs"><h2>Runs</h2>{_run_table(data, colors)}</section>
<section id="headline-section"><h2>Headline</h2>{headline_html}</section>
<section id="groups"><h2>Seed groups</h2>{_groups_section(data, colors)}</section>
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
<section id="incidents"><h2>Incidents</h2>{_incidents(runs)}</section>
<section id="notes"><h2>Notes on the data</h2>{notes_html}</section>
</main>
<script type="application/json" id="rlhf-report-data">{blob_json}</script>
<script type="text/javascript">{_JS}</script>
<script type="text/javascript">{sample_viewer.JS}</script>
</body></html>
"""


def write_report(run_dirs: Sequence, output, eval_dirs: Sequence = (), names: Optional[Sequence[str]] = None,
                 title: Optional[str] = None, quiet: bool = True, command: Optional[str] = None,
                 min_effect_points: Optional[float] = None) -> Path:
    """Build the report of ``run_dirs`` (and evalkit ``eval_dirs``) and write it to ``output``."""
    data = collect(run_dirs, eval_dirs, names, quiet=quiet, min_effect_points=min_effect_points)
    _say("building the page", quiet)
    text = render_html(data, title=title, command=command)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    return output
