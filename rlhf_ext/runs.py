"""Run records on disk: the ``rlhf_ext.run/1`` format (docs/run_records.md), framework-free.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per global step),
``events.jsonl`` (start, resume, checkpoint, guard incidents, end), ``rollout_samples.jsonl`` (a
bounded sample of each step's training rollouts: :func:`select_rollout_samples`,
:func:`rollout_sample_record`) and, after a guard stop, ``incident.json``. This module writes and reads them; the OpenRLHF side (what gets recorded, and
when) is :mod:`rlhf_ext.patches.openrlhf.run_record`.

Appends are torn-line safe: every record is one ``os.write`` of one line on an ``O_APPEND``
descriptor, a writer that opens a file whose last line was cut off (a killed run) drops that
fragment first, and readers ignore a torn last line. Metric names follow what OpenRLHF logs to
wandb/TensorBoard (``train/``, ``rollout/``, ``timing/``, ``eval/``) plus rlhf_ext's own
(``rlhf_ext/``, ``rollout_mismatch/``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import jsonfiles
from .jsonfiles import atomic_writer

SCHEMA_PREFIX = "rlhf_ext.run/"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"
CONFIG, METRICS, EVENTS, INCIDENT = "config.json", "metrics.jsonl", "events.jsonl", "incident.json"
ROLLOUT_SAMPLES = "rollout_samples.jsonl"

SAMPLES_PER_STEP = 8
"""Default cap of recorded rollouts per step (``--rlhf_ext.rollout_samples``; 0 turns the file off)."""
SAMPLES_TOTAL = 2000
"""Default cap of recorded rollouts over the whole run (``--rlhf_ext.rollout_samples_total``)."""
SAMPLE_TEXT_CHARS = 4000
"""Longest prompt / response text kept per recorded rollout (characters; the rest is counted, not kept)."""

OPENRLHF_PREFIXES = ("train/", "rollout/", "timing/", "eval/")
OWN_PREFIXES = ("rlhf_ext/", "rollout_mismatch/", "rollout_corr/")
KEPT_PREFIXES = OPENRLHF_PREFIXES + OWN_PREFIXES
RESERVED_KEYS = ("step", "time", "elapsed_s", "nonfinite")
POLICY_LAG = "rlhf_ext/policy_lag"  # async runs: trainer version minus the version that generated the batch (mean)
POLICY_LAG_MAX = "rlhf_ext/policy_lag_max"

END_STATUSES = ("finished", "stopped_by_guard", "crashed")
RUNNING = "running"
UNKNOWN = "unknown"


def metric_name(key: str) -> str:
    """OpenRLHF's status key -> the name it has in wandb/TensorBoard and in ``metrics.jsonl``.

    OpenRLHF's loggers prefix every training value with ``train/``; the values it already names
    ``rollout/...`` and ``timing/...`` keep their own prefix here, as do rlhf_ext's namespaces.
    """
    return key if key.startswith(KEPT_PREFIXES) else "train/" + key


def tensorboard_tag_name(tag: str) -> str:
    """A TensorBoard tag written by OpenRLHF's ``TensorboardLogger`` -> the ``metrics.jsonl`` name.

    The logger writes ``train/{key}`` for every key (so ``train/timing/generation``) and
    ``eval/{key}``; undoing the extra prefix gives the same names a live run records.
    """
    if tag.startswith("train/") and tag[len("train/") :].startswith(KEPT_PREFIXES):
        return tag[len("train/") :]
    return tag


def _number(value: Any) -> Tuple[bool, Optional[float]]:
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
        ok, number = _number(value)
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
    data = _json_line(obj)
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def repair_tail(path: os.PathLike) -> bool:
    """Drop a torn (unterminated) last line left by a killed writer; True if something was dropped."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return False
        size = f.seek(0, os.SEEK_END)
        keep = 0
        chunk = 1 << 16
        pos = size
        while pos > 0:  # scan back for the last newline
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            idx = block.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        f.truncate(keep)
    return True


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
    """Replace ``path`` atomically (:func:`rlhf_ext.jsonfiles.atomic_writer`) with ``records``."""
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


# --- rollout samples ----------------------------------------------------------------------------


def prompt_id(prompt: str) -> str:
    """A short, stable name of a prompt text (first 12 hex digits of its SHA-1): the key that finds
    the same prompt at two steps, in the run record and in the report's sample viewer."""
    import hashlib

    return hashlib.sha1(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def select_rollout_samples(prompts: Sequence[str], cap: int) -> List[int]:
    """Which of a step's rollouts to record: indices into ``prompts`` (one entry per rollout), at most ``cap``.

    Whole prompt groups first (every answer to a prompt, so a group's spread is visible), the
    groups in the order of :func:`prompt_id`. The order depends on the prompt text alone, so a prompt
    recorded at one step is recorded again whenever it comes back (the next epoch): the viewer
    can show the same prompt at two steps without keeping every rollout.
    """
    if cap <= 0:
        return []
    groups: Dict[str, List[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt_id(str(prompt)), []).append(i)
    chosen: List[int] = []
    for pid in sorted(groups):
        chosen.extend(groups[pid][: cap - len(chosen)])
        if len(chosen) >= cap:
            break
    return chosen


def _clip(text: Any, limit: int) -> Tuple[str, int]:
    text = "" if text is None else str(text)
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def rollout_sample_record(step: int, *, prompt: str, response: str, reward: Optional[float],
                          components: Optional[Mapping[str, Any]] = None, advantage: Optional[float] = None,
                          truncated: Optional[bool] = None, response_tokens: Optional[int] = None,
                          label: Any = None, turns: Optional[Sequence[Mapping[str, Any]]] = None,
                          text_chars: int = SAMPLE_TEXT_CHARS) -> Dict[str, Any]:
    """One ``rollout_samples.jsonl`` line (docs/run_records.md). Texts longer than ``text_chars`` are
    cut, the number of characters left out is under ``clipped``; non-finite numbers become ``null``.
    ``turns`` (multi-turn agents): the segments after the prompt, ``{"role": "assistant" |
    "environment", "text", "tokens"}`` in order; each text is cut at ``text_chars`` too."""

    def num(value):
        ok, number = _number(value)
        return number if ok and number is not None and math.isfinite(number) else None

    prompt_text, prompt_cut = _clip(prompt, text_chars)
    response_text, response_cut = _clip(response, text_chars)
    rec: Dict[str, Any] = {"step": int(step), "prompt_id": prompt_id(str(prompt)), "prompt": prompt_text,
                           "response": response_text, "reward": num(reward),
                           "components": {str(k): num(v) for k, v in (components or {}).items()},
                           "advantage": num(advantage),
                           "truncated": None if truncated is None else bool(truncated),
                           "response_tokens": None if response_tokens is None else int(response_tokens)}
    if label is not None:
        # choice / ranking golds are objects: kept as their JSON text
        rec["label"] = label if isinstance(label, (str, int, float, bool)) else json.dumps(label, default=str)
    if prompt_cut or response_cut:
        rec["clipped"] = {k: n for k, n in (("prompt", prompt_cut), ("response", response_cut)) if n}
    if turns:
        rec["turns"] = []
        for turn in turns:
            text, cut = _clip(turn.get("text"), text_chars)
            entry = {"role": str(turn.get("role")), "text": text, "tokens": num(turn.get("tokens"))}
            if cut:
                entry["clipped"] = cut
            rec["turns"].append(entry)
    return rec


def read_rollout_samples(path: os.PathLike, warnings: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The lines of a ``rollout_samples.jsonl`` that carry a step, a prompt and a response, in file order."""
    out = []
    for lineno, rec in read_jsonl_numbered(path, warnings):
        if isinstance(rec.get("step"), int) and isinstance(rec.get("prompt"), str) and isinstance(rec.get("response"), str):
            out.append(rec)
        elif warnings is not None:
            warnings.append(f"{Path(path).name} line {lineno} is not a rollout sample (step, prompt, response); skipped")
    return out


def write_json_atomic(path: os.PathLike, obj: Any) -> None:
    """``config.json`` / ``incident.json``: strict JSON (no NaN), replaced atomically."""
    jsonfiles.write_json_atomic(path, obj, indent=2, default=str, allow_nan=False)


def event_record(event: str, step: Optional[int], **fields: Any) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"event": event, "time": fields.pop("time", None) or time.time()}
    if step is not None:
        rec["step"] = int(step)
    for key, value in fields.items():
        ok, number = _number(value)
        if ok and not isinstance(value, (bool, int, float)):
            value = number
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        rec[key] = value
    return rec


# --- reading a run directory --------------------------------------------------------------------


def run_status(events: Sequence[Mapping[str, Any]]) -> Tuple[str, Optional[int]]:
    """(status, exit code) of a run from its ``events.jsonl``: the one rule every reader uses.

    * the last ``end`` event after the last ``start``/``resume``: its status when it is one of
      :data:`END_STATUSES`, else ``ended (<what it says>)`` (a writer newer than this reader, or a
      damaged line: shown, never mistaken for a known outcome), with its exit code;
    * a ``start`` or ``resume`` with no ``end`` after it: ``running`` (or killed too hard to write
      its end: SIGKILL, the OOM killer);
    * neither (no events, or only events that say nothing about the process, such as a torn file
      that lost its start): ``unknown``. A ``config.json`` alone is written before the start event,
      so it shows only that a run was set up, not that it is running.
    """
    last_start = max((i for i, e in enumerate(events) if e.get("event") in ("start", "resume")), default=-1)
    last_end = max((i for i, e in enumerate(events) if e.get("event") == "end"), default=-1)
    if last_start < 0 and last_end < 0:
        return UNKNOWN, None
    if last_start > last_end:
        return RUNNING, None
    end = events[last_end]
    status = end.get("status")
    code = end.get("exit_code")
    ok, number = _number(code)
    code = int(number) if ok and code is not None and math.isfinite(number) else None
    if status in END_STATUSES:
        return str(status), code
    return f"ended ({status if status is not None else 'no status'})", code


KEY_METRICS = (
    "train/reward", "train/score", "train/policy_loss", "train/kl", "train/actor_grad_norm",
    "train/entropy_loss", "train/response_length", "rlhf_ext/ds_skipped_steps", "rlhf_ext/guard/incidents",
    "rollout_mismatch/probs_diff_mean", "timing/step_total",
)  # fmt: skip


def summarize(run_dir: os.PathLike) -> str:
    """A few lines about a run: name, status, last step, key metrics (first and last value), incidents."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if not (run_dir / METRICS).exists() and not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG} or {METRICS})")
    config = {}
    if (run_dir / CONFIG).exists():
        config = json.loads((run_dir / CONFIG).read_text())
    metrics = read_metrics(run_dir / METRICS)
    events = read_jsonl(run_dir / EVENTS)
    status, code = run_status(events)
    args = config.get("args", {})
    lines = [f"run {config.get('name', run_dir.name)}  ({run_dir})"]
    algo = ", ".join(
        f"{k.split('.', 1)[-1]}={args[k]}"
        for k in ("algo.advantage.estimator", "actor.policy_loss_type", "actor.loss_agg_mode")
        if k in args
    )
    if algo:
        lines.append(f"  recipe: {algo}")
    last = metrics[-1]["step"] if metrics else None
    lines.append(
        f"  status: {status}" + (f" (exit code {code})" if code is not None else "")
        + f"; last step {last if last is not None else '-'}; {len(metrics)} steps recorded"
    )  # fmt: skip
    if metrics:
        elapsed = metrics[-1].get("elapsed_s")
        if isinstance(elapsed, (int, float)):
            lines.append(f"  elapsed: {elapsed:.0f} s")
        width = max(len(k) for k in KEY_METRICS)
        for key in KEY_METRICS:
            series = [(m["step"], m.get(key)) for m in metrics if key in m]
            if not series:
                continue
            first, final = series[0], series[-1]
            lines.append(f"  {key:<{width}}  step {first[0]}: {_fmt(first[1])}  ->  step {final[0]}: {_fmt(final[1])}")
        bad = [m["step"] for m in metrics if m.get("nonfinite")]
        if bad:
            lines.append(f"  non-finite values at steps: {', '.join(map(str, bad[:10]))}" + (" ..." if len(bad) > 10 else ""))
    for ev in events:
        if ev.get("event") == "guard_incident":
            lines.append(
                f"  guard incident at step {ev.get('step')}: tensor {ev.get('tensor')} (rank {ev.get('rank')}, "
                f"mode {ev.get('mode')})"
            )
        elif ev.get("event") == "nonfinite_input":
            lines.append(
                f"  non-finite input at step {ev.get('step')}: {ev.get('check')} in {ev.get('where')} "
                f"({ev.get('nan_count')} NaN, {ev.get('inf_count')} Inf), left to the guard"
            )
        elif ev.get("event") == "mismatch_warning":
            lines.append(f"  mismatch warning at step {ev.get('step')}: {ev.get('message', ev.get('metric'))}")
    samples = read_rollout_samples(run_dir / ROLLOUT_SAMPLES)
    if samples:
        steps = sorted({r["step"] for r in samples})
        lines.append(f"  rollout samples: {len(samples)} in {ROLLOUT_SAMPLES}, steps {steps[0]}..{steps[-1]} "
                     "('rlhf-ext report' shows them)")
    lag = [(m["step"], m[POLICY_LAG], m.get(POLICY_LAG_MAX))
           for m in metrics if isinstance(m.get(POLICY_LAG), (int, float))]
    if lag:  # async runs only (docs/run_records.md)
        worst = max((x[2] if isinstance(x[2], (int, float)) else x[1]) for x in lag)
        lines.append(f"  policy lag (async): mean {statistics.fmean(x[1] for x in lag):.3g} steps over {len(lag)} "
                     f"steps, max {worst:g}; per step: " + ", ".join(f"{s}:{v:g}" for s, v, _ in lag[-8:])
                     + (" ..." if len(lag) > 8 else ""))
    compute = config.get("compute") if isinstance(config.get("compute"), dict) else None
    if compute is not None and compute.get("mfu_unavailable"):
        lines.append(f"  MFU: none ({compute['mfu_unavailable']})")
    elif compute is not None:
        mfu = [m["rlhf_ext/throughput/mfu"] for m in metrics if isinstance(m.get("rlhf_ext/throughput/mfu"), (int, float))]
        if mfu:
            lines.append(f"  MFU of the policy update: median {100 * statistics.median(mfu):.3g}% over {len(mfu)} "
                         f"steps ({compute.get('device')} x {compute.get('device_count')})")
    ckpts = [ev for ev in events if ev.get("event") == "checkpoint"]
    if ckpts:
        lines.append(f"  checkpoints: {len(ckpts)}, last at step {ckpts[-1].get('step')}: {ckpts[-1].get('path')}")
    if (run_dir / INCIDENT).exists():
        inc = json.loads((run_dir / INCIDENT).read_text())
        lines.append(
            f"  incident.json: step {inc.get('step')}, micro-batch {inc.get('micro_batch')}, tensor {inc.get('tensor')}, "
            f"rank {inc.get('rank')}, last good checkpoint {inc.get('last_good_checkpoint')}"
        )
        origin = inc.get("origin")
        where = origin if isinstance(origin, dict) else inc
        if "nan_count" in where:
            what = f"from {origin.get('name')}: " if isinstance(origin, dict) else ""
            loss = f" (policy loss {inc['policy_loss_type']})" if inc.get("policy_loss_type") and origin else ""
            lines.append(
                f"    {what}{where.get('nan_count')} NaN and {where.get('inf_count')} Inf value(s), first at index "
                f"{tuple(where['first_index']) if where.get('first_index') is not None else '-'}{loss}"
            )
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "nan/inf"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --- TensorBoard import -------------------------------------------------------------------------


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
