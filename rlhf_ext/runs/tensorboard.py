"""Importing an OpenRLHF TensorBoard log as a run directory (``rlhf-ext runs export``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from .files import (CONFIG, EVENTS, KEPT_PREFIXES, METRICS, RESERVED_KEYS, SCHEMA, event_record, metrics_record,
                    rewrite_jsonl, write_json_atomic)

def tensorboard_tag_name(tag: str) -> str:
    """A TensorBoard tag written by OpenRLHF's ``TensorboardLogger`` -> the ``metrics.jsonl`` name.

    The logger writes ``train/{key}`` for every key (so ``train/timing/generation``) and
    ``eval/{key}``; undoing the extra prefix gives the same names a live run records.
    """
    if tag.startswith("train/") and tag[len("train/") :].startswith(KEPT_PREFIXES):
        return tag[len("train/") :]
    return tag


def _event_dirs(tb_dir: Path) -> List[Path]:
    return sorted({p.parent for p in tb_dir.rglob("events.out.tfevents.*")})


def export_tensorboard(tb_dir: os.PathLike, output: os.PathLike, *, name: Optional[str] = None) -> Dict[str, Any]:
    """Convert the scalars of one OpenRLHF TensorBoard log directory into a run directory.

    ``tb_dir`` is ``--logger.tensorboard_dir`` or the run's subdirectory in it; it must hold the
    event files of exactly one run. Returns ``{"steps": n, "metrics": m, "output": path}``.
    """
    tb_dir, output = Path(tb_dir), Path(output)
    if not tb_dir.is_dir():
        raise FileNotFoundError(f"{tb_dir} is not a directory")
    dirs = _event_dirs(tb_dir)
    if not dirs:
        raise FileNotFoundError(f"no TensorBoard event files (events.out.tfevents.*) under {tb_dir}")
    if len(dirs) > 1:
        listing = "\n  ".join(str(d) for d in dirs)
        raise ValueError(f"{tb_dir} holds the event files of {len(dirs)} runs; export one of:\n  {listing}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(dirs[0]), size_guidance={"scalars": 0})
    acc.Reload()
    steps: Dict[int, Dict[str, Any]] = {}
    wall: Dict[int, float] = {}
    for tag in acc.Tags().get("scalars", []):
        key = tensorboard_tag_name(tag)
        for ev in acc.Scalars(tag):
            steps.setdefault(ev.step, {})[key] = ev.value
            wall[ev.step] = max(wall.get(ev.step, 0.0), ev.wall_time)
    if not steps:
        raise ValueError(f"the event files in {dirs[0]} hold no scalars")
    started = min(wall.values())
    output.mkdir(parents=True, exist_ok=True)
    if (output / METRICS).exists():
        raise FileExistsError(f"{output / METRICS} exists; choose another --output")
    records = []
    for step in sorted(steps):
        values = {k: v for k, v in steps[step].items()}
        rec = metrics_record(step, {}, now=wall[step], started_at=started)
        # names are final already (tensorboard_tag_name), so bypass metric_name's train/ prefixing
        for key, value in values.items():
            if math.isfinite(value):
                rec[key] = float(value)
            else:
                rec[key] = None
                rec.setdefault("nonfinite", []).append(key)
        records.append(rec)
    rewrite_jsonl(output / METRICS, records)
    write_json_atomic(output / CONFIG, {
        "schema": SCHEMA, "name": name or dirs[0].name, "args": {}, "plugin": {}, "versions": {},
        "git": {"commit": None, "dirty": None, "cwd": None}, "data_sha256": {}, "started_at": started,
        "imported_from": {"tensorboard": str(dirs[0].resolve())},
    })  # fmt: skip
    rewrite_jsonl(output / EVENTS, [
        event_record("start", 0, time=started),
        event_record("end", max(steps), time=max(wall.values()), status="finished", exit_code=None,
                     note="imported from TensorBoard; the run's real exit status is unknown"),
    ])  # fmt: skip
    return {"steps": len(records), "metrics": len({k for r in records for k in r} - set(RESERVED_KEYS)), "output": str(output)}
