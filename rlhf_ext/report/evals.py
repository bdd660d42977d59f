"""evalkit results placed on the runs' step axes, and paired comparisons between them.

An evalkit output directory records the model it evaluated (``config.json`` ->
``generation.model``, an absolute path for local checkpoints). That path says which run and step
it belongs to:

* the run's starting model (``actor.model_name_or_path``): step 0 of every run that starts from it;
* a path from one of the run's ``checkpoint`` events (or that path's ``_hf`` export): that step;
* a ``global_step<N>`` directory under the run's ``ckpt.path`` or ``ckpt.output_dir``: step N;
* the run's ``ckpt.output_dir`` itself (OpenRLHF's final save): the run's last step.

Evaluations that match no run are listed on the page with the reason, never guessed. Paired
comparisons reuse :func:`rlhf_ext.evalkit.compare_runs` (paired bootstrap over problems).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..evalkit.records import RunDirError, read_json
from ..evalkit.summary import compare_runs
from ..evalkit.summary import report as evalkit_report
from .loaded_runs import RunRecord

_GLOBAL_STEP = re.compile(r"global_step(\d+)")
METRICS = ("avg@n", "pass@k", "maj@n")


class EvalDirError(ValueError):
    """An --evals path holds no evalkit output directory, or one that cannot be read."""


@dataclass
class EvalRun:
    """One evalkit output directory."""

    path: Path
    model: str
    suite: str
    n_samples: int
    summary: dict

    def metric(self, task: str, metric: str, k: Optional[int] = None) -> Optional[dict]:
        """``{"value", "ci95"}`` of avg@n / maj@n / pass@k (``k`` given) on ``task``, or None."""
        t = self.summary.get("tasks", {}).get(task) or {}
        if metric == "pass@k":
            return (t.get("pass@k") or {}).get(str(k))
        return t.get(metric)


@dataclass
class EvalPoint:
    eval: EvalRun
    run: int
    step: int
    how: str


@dataclass
class PairRow:
    """One paired comparison (run - baseline) on one task, from evalkit's paired bootstrap."""

    kind: str  # "between runs" or "over training"
    task: str
    baseline: str  # label, e.g. "grpo @ step 24"
    other: str
    problems: int
    metrics: Dict[str, dict] = field(default_factory=dict)
    """avg@n / maj@n -> evalkit's entry (baseline, run, difference, ci95, distinguishable)."""
    note: str = ""
    steps: Tuple[int, int] = (0, 0)
    """(baseline step, compared step)."""
    runs: Tuple[int, int] = (0, 0)
    """(baseline run index, compared run index)."""


def _is_eval_dir(path: Path) -> bool:
    if not (path / "config.json").is_file():
        return False
    try:
        config = read_json(path / "config.json")
    except RunDirError:
        return False
    return "suite" in config and "generation" in config


def find_eval_dirs(paths: Sequence, max_depth: int = 3) -> List[Path]:
    """Each path is an evalkit output directory, or a directory holding some (searched
    ``max_depth`` levels down, in sorted order)."""
    found: List[Path] = []
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            raise EvalDirError(f"--evals {root}: not a directory")
        if _is_eval_dir(root):
            found.append(root)
            continue
        hits = []
        for dirpath, dirnames, _ in os.walk(root):
            depth = len(Path(dirpath).relative_to(root).parts)
            dirnames.sort()
            if depth >= max_depth:
                dirnames[:] = []
            if Path(dirpath) != root and _is_eval_dir(Path(dirpath)):
                hits.append(Path(dirpath))
                dirnames[:] = []
        if not hits:
            raise EvalDirError(f"--evals {root}: no evalkit output directory (config.json + samples.jsonl) in it")
        found.extend(hits)
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return unique


def load_eval(path) -> EvalRun:
    path = Path(path)
    config = read_json(path / "config.json")
    summary_path = path / "summary.json"
    # summary.json is evalkit's own summary of exactly these samples; recompute only when absent.
    summary = read_json(summary_path) if summary_path.exists() else evalkit_report(path)
    return EvalRun(path=path, model=str(config["generation"]["model"]), suite=str(config["suite"]),
                   n_samples=int(config["n_samples"]), summary=summary)


def _norm(path, base: Optional[str]) -> Optional[str]:
    if not isinstance(path, str) or not path:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute() and base:
        p = Path(base) / p
    return os.path.normpath(str(p.resolve()) if p.exists() else os.path.abspath(str(p)))


def _within(path: str, root: Optional[str]) -> bool:
    return root is not None and (path == root or path.startswith(root.rstrip(os.sep) + os.sep))


def _match(raw: str, model: str, run: RunRecord) -> Optional[Tuple[int, str]]:
    """``raw``: the evaluated model as recorded (a hub id stays a hub id); ``model``: normalized."""
    cwd = (run.config.get("git") or {}).get("cwd")
    start = run.args.get("actor.model_name_or_path") or run.args.get("actor.pretrain")
    if isinstance(start, str) and (raw == start or model == _norm(start, cwd)):
        return 0, "starting model"
    for event in run.events:
        if event.get("event") != "checkpoint" or not isinstance(event.get("step"), int):
            continue
        ckpt = _norm(event.get("path"), cwd)
        if ckpt is not None and (model in (ckpt, ckpt + "_hf") or _within(model, ckpt)):
            return int(event["step"]), "checkpoint event"
    output = _norm(run.args.get("ckpt.output_dir") or run.args.get("save_path"), cwd)
    ckpt_path = _norm(run.args.get("ckpt.path") or run.args.get("ckpt_path"), cwd)
    for root in (ckpt_path, output):
        if _within(model, root):
            steps = _GLOBAL_STEP.findall(model[len(root):])
            if steps:
                return int(steps[-1]), "global_step directory"
    if output is not None and model == output and run.last_step is not None:
        return run.last_step, "final model (ckpt.output_dir)"
    return None


def attribute(evals: Sequence[EvalRun], runs: Sequence[RunRecord]) -> Tuple[List[EvalPoint], List[Tuple[EvalRun, str]]]:
    """Place each evaluation on the runs' step axes; returns (points, unplaced with reasons)."""
    points, unplaced = [], []
    for ev in evals:
        model = _norm(ev.model, None) if os.path.isabs(ev.model) else ev.model
        hits = [(i, m) for i, run in enumerate(runs) if (m := _match(ev.model, model, run)) is not None]
        if not hits:
            unplaced.append((ev, f"its model {ev.model} is neither the starting model, a checkpoint nor the "
                                 "final model of any run given"))
            continue
        for i, (step, how) in hits:
            points.append(EvalPoint(eval=ev, run=i, step=step, how=how))
    return points, unplaced


def tasks_of(points: Sequence[EvalPoint]) -> List[str]:
    """Tasks in first-seen order (a multi-task suite's combined row comes last, as evalkit writes it)."""
    seen: Dict[str, None] = {}
    for p in points:
        for task in p.eval.summary.get("tasks", {}):
            seen.setdefault(task, None)
    return list(seen)


def common_pass_k(points: Sequence[EvalPoint], task: str) -> Optional[int]:
    """The largest k > 1 that every evaluation of ``task`` reports pass@k for (None if none)."""
    ks = None
    for p in points:
        t = p.eval.summary.get("tasks", {}).get(task)
        if not t or "pass@k" not in t:
            continue
        have = {int(k) for k in t["pass@k"]}
        ks = have if ks is None else ks & have
    ks = {k for k in (ks or set()) if k > 1}
    return max(ks) if ks else None


def series(points: Sequence[EvalPoint], run: int, task: str, metric: str, k: Optional[int] = None):
    """``[(step, value, low, high), ...]`` of one run, sorted by step; repeated steps keep the last given."""
    by_step = {}
    for p in points:
        if p.run != run:
            continue
        m = p.eval.metric(task, metric, k)
        if m is not None:
            by_step[p.step] = (p.step, m["value"], m["ci95"][0], m["ci95"][1])
    return [by_step[s] for s in sorted(by_step)]


def _compare(a: EvalRun, b: EvalRun, cache: dict, resamples: int) -> dict:
    key = (str(a.path), str(b.path))
    if key not in cache:
        try:
            cache[key] = compare_runs([a.path, b.path], resamples=resamples)["comparisons"][0]["tasks"]
        except (RunDirError, ValueError) as exc:
            cache[key] = exc
    return cache[key]


def _rows(kind: str, a: EvalPoint, b: EvalPoint, label_a: str, label_b: str, cache: dict,
          resamples: int) -> List[PairRow]:
    result = _compare(a.eval, b.eval, cache, resamples)
    where = {"steps": (a.step, b.step), "runs": (a.run, b.run)}
    if isinstance(result, Exception):
        return [PairRow(kind=kind, task=a.eval.suite, baseline=label_a, other=label_b, problems=0,
                        note=f"cannot be paired: {result}", **where)]
    rows = []
    for task, entry in result.items():
        row = PairRow(kind=kind, task=task, baseline=label_a, other=label_b, problems=int(entry.get("problems", 0)),
                      **where)
        if not row.problems:
            row.note = "no problem evaluated in both"
        row.metrics = {m: entry[m] for m in ("avg@n", "maj@n") if m in entry}
        rows.append(row)
    return rows


def paired_rows(points: Sequence[EvalPoint], runs: Sequence[RunRecord], resamples: int = 2000) -> List[PairRow]:
    """Paired comparisons: every run against the first run evaluated at the same step (different
    evaluations only), then each run's last evaluated checkpoint against its first."""
    cache: dict = {}
    rows: List[PairRow] = []
    by_step: Dict[int, Dict[int, EvalPoint]] = {}
    for p in points:
        by_step.setdefault(p.step, {})[p.run] = p
    for step in sorted(by_step):
        group = by_step[step]
        order = sorted(group)
        base = group[order[0]]
        for i in order[1:]:
            other = group[i]
            if other.eval.path == base.eval.path:
                continue  # the same evaluation (e.g. the shared starting model)
            rows += _rows("between runs", base, other, f"{runs[base.run].name} @ step {step}",
                          f"{runs[i].name} @ step {step}", cache, resamples)
    for i, run in enumerate(runs):
        mine = sorted((p for p in points if p.run == i), key=lambda p: p.step)
        if len(mine) >= 2 and mine[0].eval.path != mine[-1].eval.path:
            rows += _rows("over training", mine[0], mine[-1], f"{run.name} @ step {mine[0].step}",
                          f"{run.name} @ step {mine[-1].step}", cache, resamples)
    return rows
