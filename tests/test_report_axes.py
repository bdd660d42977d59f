"""The report's axes, read from the generated figure specs (not pixels): integer ticks on every step axis
(plotly's automatic ticks showed 1.5, 2.5 on a 3-step run) and shares on [0, 1] (a constant-0 truncated share
was drawn on plotly's [-1, 1])."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlhf_ext.report import load_runs
from rlhf_ext.report.figures import (dynamics_figure, run_colors, step_axis, step_dtick, training_eval_figures,
                                     y_axis)
from rlhf_ext.report.page import collect, render_html
from rlhf_ext.report.panels import PANELS, resolve


def write_run(path: Path, rows):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"schema": "rlhf_ext.run/1", "name": path.name, "started_at": 0.0,
                                                  "args": {"rollout.batch_size": 2, "rollout.n_samples_per_prompt": 4}}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "events.jsonl").write_text("")
    return path


def three_step_run(tmp_path, name="smoke"):
    rows = [{"step": s, "elapsed_s": 10.0 * s, "train/score": [0.25, 0.5, 0.375][s - 1], "train/reward": 0.1 * s,
             "rollout/truncated_rate": 0.0, "train/clip_frac_low": 0.0, "train/clip_frac_high": 0.002 * s,
             "train/zero_variance_group_frac": 0.5, "eval/accuracy": 0.3 + 0.01 * s} for s in (1, 2, 3)]
    return write_run(tmp_path / name, rows)


def figures(runs):
    out = {}
    for panel in PANELS:
        data = resolve(panel, runs)
        if not data.empty:
            out[data.panel.id] = dynamics_figure(data, runs, run_colors(len(runs)), [1], 1, 60.0).figure
    return out


def tick_values(axis, lo, hi):
    """The tick positions plotly draws for a linear-tick axis over [lo, hi]."""
    assert axis.tickmode == "linear"
    first = axis.tick0 + np.ceil((lo - axis.tick0) / axis.dtick) * axis.dtick
    return np.arange(first, hi + 1e-9, axis.dtick)


@pytest.mark.parametrize("span, dtick", [(0, 1), (2, 1), (8, 1), (9, 2), (16, 2), (17, 5), (40, 5), (41, 10),
                                         (400, 50), (10_000, 2000)])
def test_step_dtick_hand_computed(span, dtick):
    # about 8 ticks: span / 8 rounded up to 1, 2 or 5 x 10^k, never below 1
    assert step_dtick(span) == dtick and isinstance(step_dtick(span), int)


def test_every_step_axis_has_integer_ticks(tmp_path):
    runs = load_runs([three_step_run(tmp_path)])
    figs = figures(runs)
    assert {"pass_rate", "reward", "truncation", "clip", "zero_variance"} <= set(figs)
    for panel_id, fig in figs.items():
        axis = fig.layout.xaxis
        assert axis.title.text == "step"
        ticks = tick_values(axis, 1, 3)
        assert ticks.tolist() == [1.0, 2.0, 3.0], panel_id  # not 1.5, 2.5
        assert float(axis.dtick).is_integer() and float(axis.tick0).is_integer()
    (name, fig), = training_eval_figures(runs, run_colors(1))
    assert tick_values(fig.layout.xaxis, 1, 3).tolist() == [1.0, 2.0, 3.0]
    long_axis = step_axis(range(1, 501))
    ticks = tick_values(type("A", (), long_axis), 1, 500)
    assert np.all(ticks == np.round(ticks)) and 5 <= len(ticks) <= 11


def test_shares_are_drawn_on_the_unit_interval(tmp_path):
    runs = load_runs([three_step_run(tmp_path)])
    figs = figures(runs)
    for panel_id in ("truncation", "pass_rate", "zero_variance"):  # truncation: 0 at every step
        assert tuple(figs[panel_id].layout.yaxis.range) == (0, 1), panel_id
        assert figs[panel_id].layout.yaxis.autorange is False
    # token fractions: from 0, the top fitted to the (small) values
    assert figs["clip"].layout.yaxis.rangemode == "nonnegative" and figs["clip"].layout.yaxis.range is None
    assert figs["reward"].layout.yaxis.range is None and figs["reward"].layout.yaxis.rangemode is None


def test_a_share_panel_with_values_outside_the_unit_interval_is_not_clipped():
    # a custom reward's "score" is not necessarily a share: the data decide
    assert y_axis("fraction correct", "share", [0.0, 0.4, 2.5]) == {"title": {"text": "fraction correct"}}
    assert y_axis("f", "share", [0.0, float("nan"), 1.0])["range"] == [0, 1]
    assert "rangemode" not in y_axis("w", "nonnegative", [-0.1, 0.2])


def test_the_page_carries_the_axes(tmp_path):
    html = render_html(collect([three_step_run(tmp_path)]))
    specs = re.findall(r'"xaxis":\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}', html)
    step_axes = [s for s in specs if '"text":"step"' in s]
    assert step_axes and all('"tickmode":"linear"' in s and '"dtick":1' in s for s in step_axes)
    assert '"range":[0,1]' in html
    # the page's x-axis switch keeps integer ticks on the step axis and lets the others choose
    assert 'axis["xaxis.tickmode"] = mode === "step" ? "linear" : "auto"' in html
