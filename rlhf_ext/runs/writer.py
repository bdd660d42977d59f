"""The writer of a run's files during training (:class:`RunWriter`), framework-free.

One process of a run owns ``metrics.jsonl``, ``events.jsonl`` and ``rollout_samples.jsonl`` (with
OpenRLHF, the PPOTrainer actor: :mod:`rlhf_ext.patches.openrlhf.run_record` says when it writes
what). Opening a run directory drops the torn last line a killed writer left; a resume cuts the
metrics and samples back to the checkpoint's step; a fresh run in a used directory keeps the old
files beside, renamed ``<name>.previous-<stamp>``, never mixing the two.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from .files import (CONFIG, EVENTS, INCIDENT, METRICS, ROLLOUT_SAMPLES, append_jsonl, event_record, metrics_record,
                    read_jsonl, repair_tail, truncate_metrics_after)
from .throughput import step_throughput


class RunWriter:
    """Appends to the run directory ``path`` (created if missing); ``config.json``, when there,
    gives the start time (``elapsed_s``) and the ``compute`` block (the per-step MFU)."""

    def __init__(self, path: os.PathLike):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        self.compute: Optional[Dict[str, Any]] = None
        config = self.path / CONFIG
        if config.exists():
            try:
                written = json.loads(config.read_text())
                self.started_at = float(written.get("started_at", self.started_at))
                self.compute = written.get("compute") if isinstance(written.get("compute"), dict) else None
            except (ValueError, TypeError, AttributeError):
                pass
        for name in (METRICS, EVENTS, ROLLOUT_SAMPLES):
            repair_tail(self.path / name)
        self.samples_written = 0
        self.samples_full = False

    def begin(self, resume_step: int, **where: Any) -> None:
        """The ``start`` event (``resume_step`` 0) or ``resume`` event; ``where``: its fields saying
        where the writer runs (host, pid, node)."""
        metrics = self.path / METRICS
        if resume_step > 0:
            dropped = truncate_metrics_after(metrics, resume_step)
            truncate_metrics_after(self.path / ROLLOUT_SAMPLES, resume_step)
            self.event("resume", resume_step, dropped_steps=dropped, **where)
        else:
            if metrics.exists() and metrics.stat().st_size > 0:
                # a fresh run in a used directory: keep the old record beside, never mix the two
                stamp = time.strftime("%Y%m%d-%H%M%S")
                for name in (METRICS, EVENTS, INCIDENT, ROLLOUT_SAMPLES):
                    if (self.path / name).exists():
                        os.replace(self.path / name, self.path / f"{name}.previous-{stamp}")
            self.event("start", 0, **where)
        self.samples_written = len(read_jsonl(self.path / ROLLOUT_SAMPLES))

    def write_samples(self, step: int, records: List[Dict[str, Any]], total_cap: int) -> int:
        """Append a step's rollout samples while the run's total stays within ``total_cap``; the
        first time the cap cuts samples off, a ``rollout_samples_full`` event says so. Returns how many were written."""
        room = max(0, total_cap - self.samples_written)
        kept = records[:room]
        for rec in kept:
            append_jsonl(self.path / ROLLOUT_SAMPLES, rec)
        self.samples_written += len(kept)
        if len(kept) < len(records) and not self.samples_full:
            self.samples_full = True
            self.event("rollout_samples_full", step, total=self.samples_written, cap=total_cap)
        return len(kept)

    def write_step(self, step: int, values: Mapping[str, Any]) -> None:
        """One ``metrics.jsonl`` line: ``values`` plus the step's throughput and MFU."""
        values = {**values, **step_throughput(values, self.compute)}
        append_jsonl(self.path / METRICS, metrics_record(step, values, now=time.time(), started_at=self.started_at))

    def event(self, event: str, step: Optional[int], **fields: Any) -> None:
        append_jsonl(self.path / EVENTS, event_record(event, step, **fields))
