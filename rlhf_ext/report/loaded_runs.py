"""Loading run directories for the report: arrays to plot, read through :mod:`rlhf_ext.runs`.

The format (file names, reserved keys, line reading, the status rule) belongs to
:mod:`rlhf_ext.runs` and is described in docs/run_records.md; this module turns a record into
aligned numpy columns. A run directory holds ``config.json``, ``metrics.jsonl`` (one line per global step) and
``events.jsonl``, plus ``incident.json`` when the non-finite guard stopped the run. The reader is
tolerant where the writer can legitimately leave odd files behind, and loud everywhere else:

* a torn last line (a crash mid-write) is ignored without comment; an unreadable line elsewhere is
  skipped and reported in :attr:`RunRecord.warnings` (shown on the page), never silently;
* a step written twice (a run resumed from an earlier checkpoint redoes steps) keeps its last
  occurrence, which is the history the final weights came from;
* keys missing on some steps are NaN there; a value the writer could not represent (NaN/Inf,
  written as ``null`` with a ``"nonfinite"`` list) is NaN too, and its step is remembered in
  :attr:`RunRecord.nonfinite` so the page can flag it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# the format's names, re-exported under the names the report's modules use
from ..runs import CONFIG as CONFIG_FILE
from ..runs import END_STATUSES, RUNNING  # noqa: F401  (re-exported: report.headline uses RUNNING)
from ..runs import SCHEMA_PREFIX, SCHEMA_VERSION, UNKNOWN, read_jsonl_numbered, run_status
from ..runs import EVENTS as EVENTS_FILE
from ..runs import INCIDENT as INCIDENT_FILE
from ..runs import METRICS as METRICS_FILE
from ..runs import RESERVED_KEYS

# TensorBoard-style logs put every key under "train/"; the run record keeps "timing/" and
# "rollout/" at the top level. Map the former onto the latter so both read the same.
_NESTED_PREFIX = re.compile(r"^train/(timing|rollout|rollout_mismatch|rollout_corr|eval)/")
_RESERVED = frozenset(RESERVED_KEYS)


class RunRecordError(ValueError):
    """A run directory is missing, malformed, or not a run record at all."""


@dataclass
class RunRecord:
    """One run, loaded: its configuration, per-step metrics and events."""

    path: Path
    name: str
    config: dict
    args: Dict[str, object]
    steps: np.ndarray
    """Global steps present in ``metrics.jsonl``, sorted, unique (int64)."""
    metrics: Dict[str, np.ndarray]
    """Metric key -> float64 values aligned with :attr:`steps`; NaN where the step lacks the key."""
    wall_s: np.ndarray
    """Training time in seconds at each step, summed over the segments of a resumed run."""
    nonfinite: Dict[str, List[int]] = field(default_factory=dict)
    events: List[dict] = field(default_factory=list)
    status: str = UNKNOWN
    exit_code: Optional[int] = None
    resumes: List[int] = field(default_factory=list)
    """Steps at which the run was resumed (from events, or from steps going backwards in the metrics)."""
    incidents: List[dict] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def last_step(self) -> Optional[int]:
        return int(self.steps[-1]) if len(self.steps) else None

    def has(self, key: str) -> bool:
        values = self.metrics.get(key)
        return values is not None and bool(np.isfinite(values).any())

    def series(self, key: str, x: str = "step") -> Tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of the steps where ``key`` has a finite value; ``x`` is ``step`` or ``wall``."""
        values = self.metrics.get(key)
        if values is None:
            return np.zeros(0), np.zeros(0)
        keep = np.isfinite(values)
        xs = self.steps if x == "step" else self.wall_s
        return xs[keep].astype(np.float64), values[keep]

    @property
    def wall_time_s(self) -> Optional[float]:
        finite = self.wall_s[np.isfinite(self.wall_s)]
        return float(finite.max()) if finite.size else None

    def budget(self) -> Dict[str, np.ndarray]:
        """Cumulative ``samples`` and ``tokens`` generated up to each step (aligned with :attr:`steps`;
        NaN from the first step whose count is unknown on): samples per step from
        ``rollout/num_samples``, else ``rollout.batch_size`` x ``rollout.n_samples_per_prompt``;
        tokens = samples x mean response length. The x axis of an equal-budget comparison."""
        out: Dict[str, np.ndarray] = {}
        samples = self.metrics.get("rollout/num_samples")
        if samples is None or not np.isfinite(samples).any():
            per_step = _samples_per_step(self.args)
            samples = None if per_step is None else np.full(len(self.steps), per_step, dtype=np.float64)
        if samples is None:
            return out
        length = _first_present(self.metrics, ("rollout/response_length_mean", "train/response_length"))
        for name, per in (("samples", samples), ("tokens", None if length is None else samples * length)):
            if per is None:
                continue
            total = np.cumsum(np.where(np.isfinite(per), per, 0.0))
            unknown = np.cumsum(~np.isfinite(per)) > 0  # a gap makes every later total unknown
            out[name] = np.where(unknown, np.nan, total)
        return out

    def tokens_generated(self) -> Optional[float]:
        """Sum over steps of mean response length x samples in the step, or None when not logged."""
        length = _first_present(self.metrics, ("rollout/response_length_mean", "train/response_length"))
        if length is None:
            return None
        samples = self.metrics.get("rollout/num_samples")
        if samples is None:
            per_step = _samples_per_step(self.args)
            if per_step is None:
                return None
            samples = np.full_like(length, per_step)
        both = np.isfinite(length) & np.isfinite(samples)
        if not both.any():
            return None
        return float((length[both] * samples[both]).sum())


def _first_present(metrics: Dict[str, np.ndarray], keys: Sequence[str]) -> Optional[np.ndarray]:
    for key in keys:
        values = metrics.get(key)
        if values is not None and np.isfinite(values).any():
            return values
    return None


def _samples_per_step(args: Dict[str, object]) -> Optional[float]:
    batch, n = args.get("rollout.batch_size"), args.get("rollout.n_samples_per_prompt")
    if isinstance(batch, (int, float)) and isinstance(n, (int, float)) and not isinstance(batch, bool):
        return float(batch) * float(n)
    return None


def flatten(obj: dict, prefix: str = "") -> Dict[str, object]:
    """Nested dicts -> one level with dotted keys (the run record's ``args`` are flat already)."""
    out: Dict[str, object] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def read_jsonl(path: Path, warnings: List[str]) -> List[Tuple[int, dict]]:
    """``(line number, object)`` of every complete line (:func:`rlhf_ext.runs.read_jsonl_numbered`)."""
    return read_jsonl_numbered(path, warnings)


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunRecordError(f"{path} does not exist") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunRecordError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise RunRecordError(f"{path}: expected a JSON object")
    return obj


def _check_config(run_dir: Path, config: dict) -> None:
    schema = config.get("schema")
    if schema is None:
        if "suite" in config and "generation" in config:
            raise RunRecordError(f"{run_dir} is an evalkit output directory, not a training run; pass it with --evals")
        raise RunRecordError(f"{run_dir / CONFIG_FILE} has no 'schema' field: not an rlhf_ext run record")
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise RunRecordError(f"{run_dir / CONFIG_FILE}: schema {schema!r} is not an rlhf_ext run record "
                             f"({SCHEMA_PREFIX}{SCHEMA_VERSION})")
    try:
        version = int(schema[len(SCHEMA_PREFIX):])
    except ValueError:
        raise RunRecordError(f"{run_dir / CONFIG_FILE}: unreadable schema version in {schema!r}") from None
    if version > SCHEMA_VERSION:
        raise RunRecordError(f"{run_dir}: run record schema {schema} is newer than this rlhf_ext reads "
                             f"({SCHEMA_PREFIX}{SCHEMA_VERSION}); upgrade rlhf_ext")


def _number(value) -> Optional[float]:
    """A metric value as float; None for anything that is not a plain number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def load_run(run_dir, name: Optional[str] = None) -> RunRecord:
    """Load one run directory; raises :class:`RunRecordError` when it is not a readable run record."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunRecordError(f"{run_dir} is not a directory")
    config = _read_json(run_dir / CONFIG_FILE)
    _check_config(run_dir, config)
    args = config.get("args") or {}
    if not isinstance(args, dict):
        raise RunRecordError(f"{run_dir / CONFIG_FILE}: 'args' must be an object")
    args = flatten(args)
    warnings: List[str] = []

    # metrics: file order matters for resumes, the last occurrence of a step wins
    rows: Dict[int, dict] = {}
    order: List[Tuple[int, dict]] = []
    for lineno, obj in read_jsonl(run_dir / METRICS_FILE, warnings):
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            warnings.append(f"{METRICS_FILE} line {lineno} has no integer 'step'; skipped")
            continue
        rows[int(step)] = obj
        order.append((int(step), obj))
    steps = np.array(sorted(rows), dtype=np.int64)
    index = {s: i for i, s in enumerate(steps.tolist())}
    columns: Dict[str, list] = {}
    nonfinite: Dict[str, List[int]] = {}
    names: Dict[str, str] = {}  # raw key -> record key (cached: the same keys repeat on every line)
    n = len(steps)
    for step, obj in rows.items():
        i = index[step]
        bad = obj.get("nonfinite") or ()
        for raw_key, value in obj.items():
            if raw_key in _RESERVED:
                continue
            key = names.get(raw_key)
            if key is None:
                key = names[raw_key] = _NESTED_PREFIX.sub(r"\1/", raw_key)
            if value is None:
                if raw_key in bad:
                    nonfinite.setdefault(key, []).append(step)
                    if key not in columns:
                        columns[key] = [math.nan] * n
                continue
            if value.__class__ is not float:
                value = _number(value)
                if value is None:
                    continue  # strings or lists: not a metric to plot
            if not math.isfinite(value):  # a writer that did not follow the null convention
                nonfinite.setdefault(key, []).append(step)
                value = math.nan
            column = columns.get(key)
            if column is None:
                column = columns[key] = [math.nan] * n
            column[i] = value
    metrics = {key: np.asarray(column, dtype=np.float64) for key, column in columns.items()}
    for key in nonfinite:
        nonfinite[key].sort()

    events = [obj for _, obj in read_jsonl(run_dir / EVENTS_FILE, warnings)]
    wall, restarts = _wall_clock(order, steps, config)
    status, exit_code = run_status(events)
    resumes = sorted({int(e["step"]) for e in events if e.get("event") == "resume" and _number(e.get("step")) is not None})
    if not resumes:
        resumes = restarts
    incidents = _incidents(run_dir, events, warnings)
    if not events:
        warnings.append(f"no {EVENTS_FILE}: run status unknown")
    if not len(steps):
        warnings.append(f"no steps in {METRICS_FILE} yet")
    run_name = name or config.get("name") or run_dir.resolve().name
    return RunRecord(path=run_dir, name=str(run_name), config=config, args=args, steps=steps, metrics=metrics,
                     wall_s=wall, nonfinite=nonfinite, events=events, status=status, exit_code=exit_code,
                     resumes=resumes, incidents=incidents, warnings=warnings)


def _wall_clock(order: List[Tuple[int, dict]], steps: np.ndarray, config: dict) -> Tuple[np.ndarray, List[int]]:
    """Training time per step, and the steps where the metrics restart (resumes).

    ``elapsed_s`` counts from the start of the process that wrote the line. When a resumed run's
    clock starts again from zero, its time is added to the time the first attempt had reached
    at the last step before the resume point, so the x axis is time spent on the kept history
    (time between a crash and the resume is not counted; steps the crash threw away are not either).
    """
    wall: Dict[int, float] = {}
    restarts: List[int] = []
    offset = 0.0
    prev_step: Optional[int] = None
    prev_elapsed: Optional[float] = None
    started = _number(config.get("started_at"))
    for step, obj in order:
        elapsed = _number(obj.get("elapsed_s"))
        if elapsed is None and started is not None and _number(obj.get("time")) is not None:
            elapsed = float(obj["time"]) - started
        if prev_step is not None and step <= prev_step:
            restarts.append(step)
        if elapsed is None:
            wall[step] = math.nan
            continue
        if prev_elapsed is not None and elapsed < prev_elapsed:
            earlier = [s for s in wall if s < step and math.isfinite(wall[s])]
            offset = wall[max(earlier)] if earlier else offset + prev_elapsed
        wall[step] = offset + elapsed
        prev_elapsed = elapsed
        prev_step = step
    return np.array([wall.get(int(s), math.nan) for s in steps], dtype=np.float64), sorted(set(restarts))


def _incidents(run_dir: Path, events: List[dict], warnings: List[str]) -> List[dict]:
    names = [e.get("incident") for e in events if e.get("event") == "guard_incident" and e.get("incident")]
    names = list(dict.fromkeys([*names, INCIDENT_FILE]))
    out = []
    for name in names:
        path = run_dir / str(name)
        if not path.exists():
            if name != INCIDENT_FILE:
                warnings.append(f"events.jsonl names {name}, which does not exist")
            continue
        try:
            out.append({"file": str(name), **_read_json(path)})
        except RunRecordError as exc:
            warnings.append(str(exc))
    return out


def load_runs(run_dirs: Sequence, names: Optional[Sequence[str]] = None) -> List[RunRecord]:
    """Load several runs; ``names`` (one per run) override the recorded names. Names are made
    unique (``grpo``, ``grpo #2``) so every legend entry and table row points at one run."""
    if not run_dirs:
        raise RunRecordError("no run directories given")
    if names is not None and len(names) != len(run_dirs):
        raise RunRecordError(f"{len(names)} names for {len(run_dirs)} run directories; give one name per run")
    runs = [load_run(d, names[i] if names else None) for i, d in enumerate(run_dirs)]
    seen: Dict[str, int] = {}
    for run in runs:
        count = seen.get(run.name, 0) + 1
        seen[run.name] = count
        if count > 1:
            run.name = f"{run.name} #{count}"
    return runs
