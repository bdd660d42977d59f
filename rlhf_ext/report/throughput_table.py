"""The report's throughput table: per run, medians over steps of what :mod:`rlhf_ext.runs.throughput` defines.

Columns: median seconds per step (``timing/step_total``), median completion tokens per second,
speed against the first run (its median s/step divided by this run's: above 1 is faster), median
share of the step waiting for rollouts, median weight-sync seconds, and the MFU of the policy
update: per run, all steps' update FLOPs over all their update seconds x the peak x the devices
(``config.json``'s ``compute`` block; when it says there is no MFU, the cell says why). Each step's numbers come from
the ``rlhf_ext/throughput/*`` values the run record holds, else are computed from the step's logged
values the same way (runs recorded before they were written, TensorBoard imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..runs.throughput import PREFIX, step_throughput
from .loaded_runs import RunRecord


@dataclass
class ThroughputRow:
    name: str
    s_per_step: Optional[float]
    tokens_per_s: Optional[float]
    speed_vs_first: Optional[float]
    wait_share: Optional[float]
    weight_sync_s: Optional[float]
    mfu: Optional[float] = None
    mfu_median_step: Optional[float] = None
    mfu_note: Optional[str] = None
    """Why there is no MFU (the record's ``mfu_unavailable``, or what the steps lack); or where the peak is from."""


def _per_step(run: RunRecord) -> Dict[str, np.ndarray]:
    names = ("completion_tokens_per_s", "wait_share", "weight_sync_s", "update_flops", "mfu")
    out = {n: np.full(len(run.steps), np.nan) for n in names}
    compute = _compute(run)
    for i in range(len(run.steps)):
        values = {k: float(v[i]) for k, v in run.metrics.items() if np.isfinite(v[i])}
        computed = step_throughput(values, compute)
        for n in names:
            out[n][i] = values.get(PREFIX + n, computed.get(PREFIX + n, np.nan))
    return out


def _compute(run: RunRecord) -> Optional[dict]:
    block = run.config.get("compute") if isinstance(run.config, dict) else None
    return block if isinstance(block, dict) else None


def run_mfu(run: RunRecord, per: Dict[str, np.ndarray]) -> "tuple[Optional[float], Optional[str]]":
    """(MFU of the run's policy updates, note): sum of update FLOPs / (sum of update seconds x peak x
    devices) over the steps that have both; the note says why there is none, or the peak's source."""
    compute = _compute(run)
    if compute is None:
        return None, "the run record has no compute block (recorded before MFU was added, or imported)"
    if compute.get("mfu_unavailable"):
        return None, str(compute["mfu_unavailable"])
    seconds = run.metrics.get("timing/ppo_train")
    if seconds is None:
        return None, "no step logged timing/ppo_train"
    ok = np.isfinite(per["update_flops"]) & np.isfinite(seconds) & (seconds > 0)
    if not ok.any():
        return None, "no step has both its update FLOPs and its update time"
    peak, devices = float(compute["peak_flops_per_device"]), int(compute["device_count"])
    mfu = float(per["update_flops"][ok].sum() / (seconds[ok].sum() * peak * devices))
    return mfu, f"{compute.get('device')} x {devices}, peak {peak / 1e12:.4g} TFLOP/s ({compute.get('peak_source')})"


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
        mfu, note = run_mfu(run, per)
        rows.append(ThroughputRow(run.name, _median(run.metrics.get("timing/step_total")),
                                  _median(per["completion_tokens_per_s"]), None, _median(per["wait_share"]),
                                  _median(per["weight_sync_s"]), mfu, _median(per["mfu"]), note))
    base = rows[0].s_per_step if rows else None
    for row in rows:
        if base and row.s_per_step:
            row.speed_vs_first = base / row.s_per_step
    return rows
