"""Plotly figures of the report: training dynamics (all runs overlaid), evaluations over
checkpoints, and the per-phase time per step.

Display budget (what keeps a 10-run x 10,000-step page responsive and its file bounded): each
raw curve is thinned to at most :data:`MAX_RAW_POINTS` points by min/max buckets (spikes stay
visible), each moving average to :data:`MAX_SMOOTH_POINTS` evenly spaced points, computed before
thinning from every step. Arrays go into the page as base64 float32, which plotly decodes itself.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .evals import EvalPoint, common_pass_k, tasks_of
from .evals import series as eval_series
from .panels import PanelData, timing_phases
from .loaded_runs import RunRecord
from .series import minmax_downsample, moving_average, stride_downsample

MAX_RAW_POINTS = 800
MAX_SMOOTH_POINTS = 400
WINDOWS = (1, 3, 5, 10, 20, 50, 100, 200, 500)
"""Moving-average windows offered on the page (in logged steps); those longer than the longest
run are left out."""

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
            "#bcbd22", "#7f7f7f")
_DASHES = ("solid", "dot", "dash", "dashdot")


def run_colors(n: int) -> List[str]:
    """One color per run, the same in every figure and table; beyond ten runs the palette repeats."""
    return [_PALETTE[i % len(_PALETTE)] for i in range(n)]


def _template():
    import plotly.graph_objects as go

    # A small explicit template: plotly's default one adds ~8 kB of JSON to every figure.
    return go.layout.Template(layout=dict(
        font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12, color="#222"),
        paper_bgcolor="white", plot_bgcolor="white",
        xaxis=dict(gridcolor="#e8e8e8", zerolinecolor="#ccc", linecolor="#999", ticks="outside"),
        yaxis=dict(gridcolor="#e8e8e8", zerolinecolor="#ccc", linecolor="#999", ticks="outside"),
        hoverlabel=dict(namelength=-1),
    ))


STEP_TICKS = 8
"""About this many ticks on a step axis."""


def step_dtick(span: float) -> int:
    """An integer tick spacing (1, 2, 5 x 10^k) giving about :data:`STEP_TICKS` ticks over ``span`` steps.

    Plotly's automatic ticks go to 0.5 and 0.25 on a short range (a 3-step run showed 1.5, 2.5);
    steps are integers, so the spacing is never below 1.
    """
    raw = max(float(span), 1.0) / STEP_TICKS
    if raw <= 1:
        return 1
    magnitude = 10 ** int(np.floor(np.log10(raw)))
    for mult in (1, 2, 5, 10):
        if mult * magnitude >= raw:
            return int(mult * magnitude)
    return int(10 * magnitude)  # pragma: no cover (the loop ends at 10)


def step_axis(steps) -> dict:
    """Layout of a step x axis over ``steps`` (any iterable of step numbers): integer ticks only
    (``tickmode="linear"`` from 0 with an integer spacing; the page recomputes the spacing when zoomed)."""
    values = [float(v) for v in steps]
    span = (max(values) - min(values)) if values else 1.0
    return dict(title=dict(text="step", standoff=4), tickmode="linear", tick0=0, dtick=step_dtick(span))


def y_axis(title: str, scale: str = "", values=()) -> dict:
    """Layout of a y axis: ``scale="share"`` is [0, 1] when every value lies in it (a constant 0 share is
    no longer drawn on plotly's [-1, 1]); ``"nonnegative"`` starts at 0 (``rangemode``)."""
    axis = dict(title=dict(text=title))
    if scale == "share":
        finite = [v for v in (float(x) for x in values) if np.isfinite(v)]
        if all(0.0 <= v <= 1.0 for v in finite):  # else not a share after all: plotly's autorange
            axis.update(range=[0, 1], autorange=False)
    elif scale == "nonnegative":
        finite = [v for v in (float(x) for x in values) if np.isfinite(v)]
        if not finite or min(finite) >= 0:
            axis.update(rangemode="nonnegative")
    return axis


def b64_f32(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def window_choices(runs: Sequence[RunRecord]) -> Tuple[List[int], int]:
    """Windows to offer and the default: the largest offered window of at most a fifth of the
    longest run, capped at 50 steps."""
    longest = max((len(r.steps) for r in runs), default=0)
    offered = [w for w in WINDOWS if w == 1 or w <= max(1, longest // 2)]
    target = max(1, min(50, longest // 5))
    default = max(w for w in offered if w <= target)
    return offered, default


def wall_unit(runs: Sequence[RunRecord]) -> Tuple[float, str]:
    """Seconds per display unit and its label: minutes for runs under two hours, else hours."""
    longest = max((r.wall_time_s or 0.0 for r in runs), default=0.0)
    return (60.0, "wall-clock training time (min)") if longest < 7200 else (3600.0, "wall-clock training time (h)")


@dataclass
class DynamicsFigure:
    div_id: str
    figure: object
    smoothing: Dict[str, object] = field(default_factory=dict)
    """{"traces": [index, ...], "ys": {window: [base64 float32 per trace]}} for the window selector."""


def dynamics_figure(data: PanelData, runs: Sequence[RunRecord], colors: Sequence[str], windows: Sequence[int],
                    default_window: int, unit: float) -> DynamicsFigure:
    """Per run and line style: a thin raw trace and a bold moving-average trace (window selectable on
    the page); red crosses where a value was non-finite; reference lines from :attr:`Panel.limit`."""
    import plotly.graph_objects as go

    panel = data.panel
    fig = go.Figure()
    smooth_idx: List[int] = []
    ys: Dict[str, List[str]] = {str(w): [] for w in windows}
    all_steps: List[np.ndarray] = []
    all_values: List[np.ndarray] = []
    for i, keys in data.keys.items():
        run = runs[i]
        for j, key in enumerate(keys):
            if key is None:
                continue
            steps, y = run.series(key)
            wall = run.series(key, "wall")[0] / unit
            all_steps.append(steps)
            all_values.append(y)
            n = len(y)
            label = panel.line_labels[j] if j < len(panel.line_labels) else ""
            name = f"{run.name} {label}".strip()
            pos, _ = minmax_downsample(np.arange(n, dtype=np.float64), y, MAX_RAW_POINTS)
            pos = pos.astype(np.int64)
            fig.add_trace(go.Scatter(
                x=steps[pos].astype(np.int32), y=y[pos].astype(np.float32),
                customdata=wall[pos].astype(np.float32), mode="lines", name=f"{name} (raw)",
                line=dict(color=colors[i], width=1, dash=_DASHES[j % len(_DASHES)]), opacity=0.25,
                legendgroup=run.name, showlegend=False, hoverinfo="skip"))
            spos, _ = stride_downsample(np.arange(n, dtype=np.float64), y, MAX_SMOOTH_POINTS)
            spos = spos.astype(np.int64)
            for w in windows:
                ys[str(w)].append(b64_f32(moving_average(y, w)[spos]))
            smooth_idx.append(len(fig.data))
            fig.add_trace(go.Scatter(
                x=steps[spos].astype(np.int32), y=moving_average(y, default_window)[spos].astype(np.float32),
                customdata=wall[spos].astype(np.float32), mode="lines", name=name,
                line=dict(color=colors[i], width=2, dash=_DASHES[j % len(_DASHES)]),
                legendgroup=run.name, hovertemplate="%{y:.4g}"))
            bad = run.nonfinite.get(key)
            if bad:
                bx, by, bw = _nonfinite_markers(run, steps, y, bad, unit)
                fig.add_trace(go.Scatter(
                    x=bx, y=by, customdata=bw, mode="markers", name=f"{name}: non-finite",
                    marker=dict(symbol="x", size=11, color="#d00000", line=dict(width=2, color="#d00000")),
                    legendgroup=run.name, hovertemplate="non-finite " + key))
    if panel.limit is not None:
        seen = set()
        for i in data.keys:
            limit = panel.limit(runs[i])
            if limit is None or limit[0] in seen:
                continue
            seen.add(limit[0])
            fig.add_hline(y=limit[0], line=dict(color="#555", width=1, dash="dash"),
                          annotation_text=limit[1], annotation_position="top left",
                          annotation_font=dict(size=10, color="#555"))
    fig.update_layout(
        template=_template(), title=dict(text=panel.title, x=0.01, font=dict(size=14)), height=340,
        margin=dict(l=60, r=15, t=40, b=40), hovermode="x unified",
        xaxis=step_axis(np.concatenate(all_steps) if all_steps else ()),
        yaxis=y_axis(panel.y_title, panel.y_scale, np.concatenate(all_values) if all_values else ()),
        legend=dict(orientation="h", yanchor="top", y=-0.24, x=0, font=dict(size=11)),
    )
    div_id = f"fig-dyn-{panel.id}"
    return DynamicsFigure(div_id=div_id, figure=fig, smoothing={"traces": smooth_idx, "ys": ys})


def _trace_steps(fig) -> List[float]:
    """Every x value of ``fig``'s traces (steps, for the figures drawn on a step axis)."""
    return [float(x) for trace in fig.data if trace.x is not None for x in np.asarray(trace.x).ravel()]


def _nonfinite_markers(run: RunRecord, steps: np.ndarray, y: np.ndarray, bad: Sequence[int], unit: float):
    """Crosses at the steps whose value was NaN/Inf, drawn at the last finite value before them
    (or the first one after, or 0) so they sit on the curve."""
    xs, ys, ws = [], [], []
    wall_by_step = dict(zip(run.steps.tolist(), run.wall_s.tolist()))
    for step in bad:
        before = np.nonzero(steps < step)[0]
        after = np.nonzero(steps > step)[0]
        level = y[before[-1]] if len(before) else (y[after[0]] if len(after) else 0.0)
        xs.append(step)
        ys.append(level)
        ws.append(wall_by_step.get(step, np.nan) / unit)
    return (np.asarray(xs, dtype=np.int32), np.asarray(ys, dtype=np.float32), np.asarray(ws, dtype=np.float32))


def eval_figures(points: Sequence[EvalPoint], runs: Sequence[RunRecord], colors: Sequence[str]) -> List[Tuple[str, object]]:
    """One figure per task and metric (avg@n, the largest pass@k every evaluation has, maj@n):
    per run a line through its checkpoints with the bootstrap 95% interval as a band."""
    import plotly.graph_objects as go

    out = []
    for t_index, task in enumerate(tasks_of(points)):
        k = common_pass_k(points, task)
        n = next((p.eval.n_samples for p in points if task in p.eval.summary.get("tasks", {})), None)
        for metric, label in (("avg@n", f"avg@{n}"), ("pass@k", f"pass@{k}"), ("maj@n", f"maj@{n}")):
            if metric == "pass@k" and k is None:
                continue
            fig = go.Figure()
            for i, run in enumerate(runs):
                pts = eval_series(points, i, task, metric, k)
                if not pts:
                    continue
                s = np.array([p[0] for p in pts], dtype=np.int32)
                v, lo, hi = (np.array([p[j] for p in pts], dtype=np.float64) * 100 for j in (1, 2, 3))
                fig.add_trace(go.Scatter(
                    x=np.concatenate([s, s[::-1]]), y=np.concatenate([hi, lo[::-1]]).astype(np.float32),
                    fill="toself", fillcolor=colors[i], opacity=0.18, line=dict(width=0), mode="lines",
                    name=f"{run.name} 95% CI", legendgroup=run.name, showlegend=False, hoverinfo="skip"))
                fig.add_trace(go.Scatter(
                    x=s, y=v.astype(np.float32), mode="lines+markers", name=run.name, legendgroup=run.name,
                    line=dict(color=colors[i], width=2), marker=dict(size=7),
                    error_y=dict(type="data", symmetric=False, array=(hi - v).astype(np.float32),
                                 arrayminus=(v - lo).astype(np.float32), color=colors[i], thickness=1, width=4),
                    hovertemplate="step %{x}: %{y:.1f}%"))
            if not fig.data:
                continue
            fig.update_layout(
                template=_template(), title=dict(text=f"{task}: {label}", x=0.01, font=dict(size=14)), height=320,
                margin=dict(l=60, r=15, t=40, b=40), xaxis=step_axis(_trace_steps(fig)),
                yaxis=dict(title=dict(text=f"{label} (%)")),
                legend=dict(orientation="h", yanchor="top", y=-0.24, x=0, font=dict(size=11)))
            out.append((f"fig-eval-{t_index}-{metric.replace('@', '')}", fig))
    return out


def timing_figure(runs: Sequence[RunRecord], colors: Sequence[str]) -> Optional[Tuple[str, object]]:
    """Mean seconds per step by phase (``timing/*``), one stacked bar per run; None when no run
    logged any phase."""
    import plotly.graph_objects as go

    phases = timing_phases(runs)
    if not phases:
        return None
    names = [r.name for r in runs]
    fig = go.Figure()
    for phase in phases:
        means = []
        for run in runs:
            v = run.metrics.get(phase)
            means.append(float(np.nanmean(v)) if v is not None and np.isfinite(v).any() else 0.0)
        fig.add_trace(go.Bar(x=names, y=np.asarray(means, dtype=np.float32), name=phase.split("/", 1)[1],
                             hovertemplate="%{x}: %{y:.3g} s"))
    fig.update_layout(
        template=_template(), barmode="stack", title=dict(text="Mean time per step by phase", x=0.01,
                                                          font=dict(size=14)),
        height=340, margin=dict(l=60, r=15, t=40, b=40), yaxis=dict(title=dict(text="seconds per step")),
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0, font=dict(size=11)))
    return "fig-timing", fig


def seed_group_figures(data, colors: Sequence[str]) -> List[Tuple[str, object]]:
    """Per seed group (groups of two or more runs): the headline metric's moving average (the page's
    default window) averaged over the seeds, with the band from the lowest to the highest seed, on
    the step axis; and the final-window value of every seed with the group's mean \u00b1 SD."""
    import plotly.graph_objects as go

    from .groups import mean_curve

    groups = [g for g in data.groups if len(g.runs) > 1]
    if not groups or data.metric_label is None:
        return []
    _, window = window_choices(data.runs)
    out = []
    fig = go.Figure()
    for g in groups:
        color = colors[g.runs[0]]
        keys = {data.metric_keys.get(data.runs[i].name) for i in g.runs} - {None}
        if len(keys) != 1:
            continue
        curve = mean_curve([data.runs[i] for i in g.runs], keys.pop(), lambda v: moving_average(v, window))
        if curve is None:
            continue
        x, y = stride_downsample(curve["step"], curve["mean"], MAX_SMOOTH_POINTS)
        _, lo = stride_downsample(curve["step"], curve["min"], MAX_SMOOTH_POINTS)
        _, hi = stride_downsample(curve["step"], curve["max"], MAX_SMOOTH_POINTS)
        n = int(curve["n"][0])
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]).astype(np.float32),
                                 fill="toself", fillcolor=color, opacity=0.2, line=dict(width=0), mode="lines",
                                 name=f"{g.name} seed range", legendgroup=g.name, showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=y.astype(np.float32), mode="lines", name=f"{g.name} (mean of {n} seeds)",
                                 legendgroup=g.name, line=dict(color=color, width=2.5),
                                 hovertemplate="step %{x}: %{y:.3g}"))
    if fig.data:
        fig.update_layout(
            template=_template(), height=340, margin=dict(l=60, r=15, t=40, b=40),
            title=dict(text=f"Seed groups: {data.metric_label} (moving average {window}), mean and range of seeds",
                       x=0.01, font=dict(size=14)),
            xaxis=step_axis(_trace_steps(fig)), yaxis=dict(title=dict(text=data.metric_label)),
            legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, font=dict(size=11)))
        out.append(("fig-groups-curve", fig))
    fig = go.Figure()
    for g in groups:
        if g.metric is None:
            continue
        color = colors[g.runs[0]]
        fig.add_trace(go.Scatter(x=[g.name] * g.metric.n, y=np.asarray(g.metric.values, dtype=np.float32),
                                 mode="markers", marker=dict(color=color, size=9, opacity=0.7), name=f"{g.name} seeds",
                                 legendgroup=g.name, showlegend=False, hovertemplate="%{x}: %{y:.3g}"))
        fig.add_trace(go.Scatter(x=[g.name], y=[g.metric.mean], mode="markers", name=f"{g.name} mean \u00b1 SD",
                                 legendgroup=g.name, marker=dict(color=color, size=16, symbol="line-ew-open",
                                                                 line=dict(width=3, color=color)),
                                 error_y=dict(type="data", array=[g.metric.sd or 0.0], color=color, thickness=2,
                                              width=10), hovertemplate="%{x} mean: %{y:.3g}"))
    if fig.data:
        fig.update_layout(
            template=_template(), height=340, margin=dict(l=60, r=15, t=40, b=40), showlegend=False,
            title=dict(text=f"Final-{data.window}-step {data.metric_label} per seed; bar: mean \u00b1 SD",
                       x=0.01, font=dict(size=14)), yaxis=dict(title=dict(text=data.metric_label)))
        out.append(("fig-groups-final", fig))
    return out


def training_eval_figures(runs: Sequence[RunRecord], colors: Sequence[str]) -> List[Tuple[str, object]]:
    """One figure per ``eval/*`` key OpenRLHF logged during training (``--eval.steps``), a line per run
    on the step axis, beside evalkit's evaluations of the checkpoints."""
    import plotly.graph_objects as go

    keys = sorted({k for r in runs for k in r.metrics if k.startswith("eval/") and r.has(k)})
    out = []
    for n, key in enumerate(keys):
        fig = go.Figure()
        for i, run in enumerate(runs):
            steps, values = run.series(key)
            if not len(steps):
                continue
            fig.add_trace(go.Scatter(x=steps.astype(np.int32), y=values.astype(np.float32), mode="lines+markers",
                                     name=run.name, line=dict(color=colors[i], width=2), marker=dict(size=7),
                                     hovertemplate="step %{x}: %{y:.4g}"))
        fig.update_layout(
            template=_template(), title=dict(text=f"{key} (OpenRLHF, during training)", x=0.01, font=dict(size=14)),
            height=320, margin=dict(l=60, r=15, t=40, b=40), xaxis=step_axis(_trace_steps(fig)),
            yaxis=dict(title=dict(text=key.split("/", 1)[1])),
            legend=dict(orientation="h", yanchor="top", y=-0.24, x=0, font=dict(size=11)))
        out.append((f"fig-traineval-{n}", fig))
    return out


BUDGET_KNOTS = 800
"""Points per run of the samples / tokens axes; longer runs are interpolated linearly between them."""


def budget_axes(runs: Sequence[RunRecord]) -> Dict[str, Dict[str, object]]:
    """Per run name and budget (``samples``, ``tokens``): ``steps`` and the cumulative count at those
    steps (base64 float32; at most :data:`BUDGET_KNOTS` evenly spaced steps, first and last kept),
    for the page's equal-budget x axes. Steps whose count is unknown are left out."""
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
