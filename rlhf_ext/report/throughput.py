"""The report's throughput table: per run, medians over steps of what :mod:`rlhf_ext.throughput` defines.

Columns: median seconds per step (``timing/step_total``), median completion tokens per second,
speed against the first run (its median s/step divided by this run's: above 1 is faster), median
share of the step waiting for rollouts, median weight-sync seconds. Each step's numbers come from
the ``rlhf_ext/throughput/*`` values the run record holds, else are computed from the step's logged
values the same way (runs recorded before they were written, TensorBoard imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..throughput import PREFIX, step_throughput
from .runs import RunRecord


@dataclass
class ThroughputRow:
    name: str
    s_per_step: Optional[float]
    tokens_per_s: Optional[float]
    speed_vs_first: Optional[float]
    wait_share: Optional[float]
    weight_sync_s: Optional[float]


def _per_step(run: RunRecord) -> Dict[str, np.ndarray]:
    names = ("completion_tokens_per_s", "wait_share", "weight_sync_s")
    out = {n: np.full(len(run.steps), np.nan) for n in names}
    for i in range(len(run.steps)):
        values = {k: float(v[i]) for k, v in run.metrics.items() if np.isfinite(v[i])}
        computed = step_throughput(values)
        for n in names:
            out[n][i] = values.get(PREFIX + n, computed.get(PREFIX + n, np.nan))
    return out


def _median(values) -> Optional[float]:
    if values is None:
        return None
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.median(finite)) if finite.size else None


def throughput_rows(runs: Sequence[RunRecord]) -> List[ThroughputRow]:
    rows = []
    for run in runs:
        per = _per_step(run)
        rows.append(ThroughputRow(run.name, _median(run.metrics.get("timing/step_total")),
                                  _median(per["completion_tokens_per_s"]), None, _median(per["wait_share"]),
                                  _median(per["weight_sync_s"])))
    base = rows[0].s_per_step if rows else None
    for row in rows:
        if base and row.s_per_step:
            row.speed_vs_first = base / row.s_per_step
    return rows
