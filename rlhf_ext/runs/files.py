"""The files of a run directory (the ``rlhf_ext.run/1`` format, docs/run_records.md): their names,
their lines, writing and reading them.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per global step),
``events.jsonl`` (start, resume, checkpoint, guard incidents, end), ``rollout_samples.jsonl``
(:mod:`rlhf_ext.runs.samples`) and, after a guard stop, ``incident.json``.

Appends are torn-line safe (:func:`rlhf_ext.ground.jsonfiles.append_bytes`): every record is one
``os.write`` of one line on an ``O_APPEND`` descriptor, a writer that opens a file whose last line
was cut off (a killed run) drops that fragment first (:func:`repair_tail`), and readers ignore a
torn last line. Metric names follow what OpenRLHF logs to wandb/TensorBoard (``train/``,
``rollout/``, ``timing/``, ``eval/``) plus rlhf_ext's own (``rlhf_ext/``, ``rollout_mismatch/``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..ground import jsonfiles
from ..ground.jsonfiles import atomic_writer

SCHEMA_PREFIX = "rlhf_ext.run/"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"
CONFIG, METRICS, EVENTS, INCIDENT = "config.json", "metrics.jsonl", "events.jsonl", "incident.json"
ROLLOUT_SAMPLES = "rollout_samples.jsonl"

OPENRLHF_PREFIXES = ("train/", "rollout/", "timing/", "eval/")
OWN_PREFIXES = ("rlhf_ext/", "rollout_mismatch/", "rollout_corr/")
KEPT_PREFIXES = OPENRLHF_PREFIXES + OWN_PREFIXES
RESERVED_KEYS = ("step", "time", "elapsed_s", "nonfinite")
POLICY_LAG = "rlhf_ext/policy_lag"  # async runs: trainer version minus the version that generated the batch (mean)
POLICY_LAG_MAX = "rlhf_ext/policy_lag_max"


def metric_name(key: str) -> str:
    """OpenRLHF's status key -> the name it has in wandb/TensorBoard and in ``metrics.jsonl``.

    OpenRLHF's loggers prefix every training value with ``train/``; the values it already names
    ``rollout/...`` and ``timing/...`` keep their own prefix here, as do rlhf_ext's namespaces.
    """
    return key if key.startswith(KEPT_PREFIXES) else "train/" + key


def as_number(value: Any) -> Tuple[bool, Optional[float]]:
    """(is a number, its float value) for ints, floats, bools, numpy scalars and 0-d/1-element tensors."""
    if isinstance(value, bool):
        return True, float(value)
    if isinstance(value, (int, float)):
        return True, float(value)
    item = getattr(value, "item", None)
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    if callable(item):
        try:
            n = numel() if callable(numel) else numel
            if n is None or int(n) == 1:
                v = item()
                if isinstance(v, (int, float, bool)):
                    return True, float(v)
        except (TypeError, ValueError, RuntimeError):
            pass
    return False, None


def metrics_record(step: int, values: Mapping[str, Any], *, now: float, started_at: float) -> Dict[str, Any]:
    """One ``metrics.jsonl`` line: numbers only (non-numbers such as sample text are left out),
    NaN/Inf as ``null`` listed under ``"nonfinite"``, keys as :func:`metric_name` gives them."""
    record: Dict[str, Any] = {"step": int(step), "time": now, "elapsed_s": max(0.0, now - started_at)}
    nonfinite: List[str] = []
    for key, value in values.items():
        if key in RESERVED_KEYS:
            continue
        ok, number = as_number(value)
        if not ok:
            continue
        name = metric_name(str(key))
        if math.isfinite(number):
            record[name] = int(number) if float(number).is_integer() and isinstance(value, int) else number
        else:
            record[name] = None
            nonfinite.append(name)
    if nonfinite:
        record["nonfinite"] = sorted(set(nonfinite))
    return record


def _json_line(obj: Mapping[str, Any]) -> bytes:
    # allow_nan=False: a NaN that slipped past metrics_record is a bug, not a silent non-JSON token
    return (json.dumps(obj, allow_nan=False, default=str, separators=(",", ":")) + "\n").encode("utf-8")

def append_jsonl(path: os.PathLike, obj: Mapping[str, Any]) -> None:
    """Append one line with a single ``write`` on an ``O_APPEND`` descriptor (no interleaving
    with other appenders; a crash leaves at most one torn last line)."""
    jsonfiles.append_bytes(path, _json_line(obj))


def repair_tail(path: os.PathLike) -> bool:
    """Drop a torn (unterminated) last line left by a killed writer; True if something was dropped."""
    return jsonfiles.drop_torn_tail(path) > 0


def read_jsonl_numbered(path: os.PathLike, warnings: Optional[List[str]] = None) -> List[Tuple[int, Dict[str, Any]]]:
    """``(line number, object)`` of every complete JSON object line of ``path`` (missing file: []).

    A torn last line (a writer killed mid-line) is dropped silently: the format allows it. Any
    other line that is not a JSON object is dropped too, with a note in ``warnings`` naming it.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    out = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:  # UnicodeDecodeError is a ValueError
            if torn_tail and lineno == len(lines):
                continue
            if warnings is not None:
                warnings.append(f"{path.name} line {lineno} is not a JSON object ({exc}); skipped")
            continue
        out.append((lineno, obj))
    return out


def read_jsonl(path: os.PathLike) -> List[Dict[str, Any]]:
    """Every complete JSON object line of ``path`` (missing file: []); a torn or unparsable line is skipped."""
    return [obj for _, obj in read_jsonl_numbered(path)]


def read_metrics(path: os.PathLike) -> List[Dict[str, Any]]:
    """The step records of a ``metrics.jsonl``, one per step (the last occurrence wins), by step."""
    by_step: Dict[int, Dict[str, Any]] = {}
    for rec in read_jsonl(path):
        if isinstance(rec.get("step"), int):
            by_step[rec["step"]] = rec
    return [by_step[s] for s in sorted(by_step)]


def rewrite_jsonl(path: os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
    """Replace ``path`` atomically (:func:`rlhf_ext.ground.jsonfiles.atomic_writer`) with ``records``."""
    with atomic_writer(path, binary=True) as f:
        for rec in records:
            f.write(_json_line(rec))


def truncate_metrics_after(path: os.PathLike, step: int) -> int:
    """Keep the records of steps <= ``step`` (a resume from that step's checkpoint); returns how many were dropped.
    Works on any JSONL file whose lines carry ``step`` (``metrics.jsonl``, ``rollout_samples.jsonl``)."""
    path = Path(path)
    if not path.exists():
        return 0
    records = read_jsonl(path)
    kept = [r for r in records if isinstance(r.get("step"), int) and r["step"] <= step]
    if len(kept) != len(records):
        rewrite_jsonl(path, kept)
    return len(records) - len(kept)


def write_json_atomic(path: os.PathLike, obj: Any) -> None:
    """``config.json`` / ``incident.json``: strict JSON (no NaN), replaced atomically."""
    jsonfiles.write_json_atomic(path, obj, indent=2, default=str, allow_nan=False)


def event_record(event: str, step: Optional[int], **fields: Any) -> Dict[str, Any]:
    """One ``events.jsonl`` line: numbers as plain floats, NaN/Inf as ``null``."""
    rec: Dict[str, Any] = {"event": event, "time": fields.pop("time", None) or time.time()}
    if step is not None:
        rec["step"] = int(step)
    for key, value in fields.items():
        ok, number = as_number(value)
        if ok and not isinstance(value, (bool, int, float)):
            value = number
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        rec[key] = value
    return rec
