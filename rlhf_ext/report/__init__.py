"""``rlhf-ext report``: one self-contained, offline HTML page comparing RL runs.

Reads run directories (``config.json``, ``metrics.jsonl``, ``events.jsonl``, ``incident.json``;
docs/run_records.md) and evalkit output directories, and writes a page with the run table and the
configuration keys that differ, generated headline sentences, all runs' training dynamics
overlaid (step or wall-clock x axis, selectable moving average), evaluation over checkpoints with
bootstrap bands and paired comparisons, and incidents. See docs/report.md.

Python API::

    from rlhf_ext.report import write_report
    write_report(["runs/grpo", "runs/dr_grpo"], "report.html", eval_dirs=["evals/"])

Data side (no plotting): :func:`load_run` / :func:`load_runs`, :func:`diff_configs`,
:func:`moving_average`, :func:`minmax_downsample`, :func:`attribute` and :func:`paired_rows` for
evaluations, :func:`headline`, :func:`run_source` / :func:`eval_source` / :func:`viewer_payload` for
the sample viewer; :func:`collect` computes all of it. plotly is needed only by
:func:`render_html` / :func:`write_report` (``pip install rlhf_ext[report]``).
"""

from .configdiff import ConfigDiff, algorithm_summary, comparable_view, diff_configs
from .discover import find_records, report_workdir
from .evals import EvalDirError, EvalPoint, EvalRun, PairRow, attribute, find_eval_dirs, load_eval, paired_rows
from .groups import GroupComparison, GroupStat, SeedGroup, seed_groups
from .headline import headline
from .page import SIZE_BOUND_BYTES, ReportData, collect, incident_rows, render_html, write_report
from .panels import PANELS, Panel, resolve
from .loaded_runs import RunRecord, RunRecordError, load_run, load_runs
from .samples import SampleSource, SampleView, eval_source, run_source, viewer_payload
from .series import (
    WindowStats,
    difference_exceeds_noise,
    final_window,
    first_window,
    minmax_downsample,
    moving_average,
    stride_downsample,
)

__all__ = [
    "write_report", "collect", "render_html", "ReportData", "SIZE_BOUND_BYTES", "incident_rows",
    "load_run", "load_runs", "RunRecord", "RunRecordError",
    "diff_configs", "comparable_view", "algorithm_summary", "ConfigDiff",
    "moving_average", "minmax_downsample", "stride_downsample", "final_window", "first_window", "WindowStats",
    "difference_exceeds_noise",
    "find_eval_dirs", "load_eval", "attribute", "paired_rows", "EvalRun", "EvalPoint", "PairRow", "EvalDirError",
    "run_source", "eval_source", "viewer_payload", "SampleSource", "SampleView",
    "headline", "seed_groups", "SeedGroup", "GroupStat", "GroupComparison", "PANELS", "Panel", "resolve", "find_records", "report_workdir",
]
