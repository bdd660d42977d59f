"""Seed groups: runs that differ only in their seed, summarised and compared as one unit.

Two runs belong to one group when their comparable configurations (:func:`configdiff.comparable_view`:
arguments, plugin settings, versions, git commit, data hashes) are equal once every seed key
(``train.seed`` and any other ``*.seed``) and every output location is left out. A study's claim
is about a recipe, not about one draw of its randomness, so the page shows per group the mean
and the spread across seeds, and compares groups with the spread the seeds measured:

* per run, the final-window mean of the headline metric (batch pass rate, else reward; the same
  window for every run), and its last evaluation's avg@n per task when evaluations are given;
* per group, the mean over its seeds and their sample SD (n - 1);
* group B against the first group A: the difference of the means and Welch's standard error
  ``sqrt(sd_A^2 / n_A + sd_B^2 / n_B)`` over seeds; "larger than the seed-to-seed spread" when
  the difference exceeds two standard errors; with one seed in a group the spread is unknown and
  no verdict is given.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .configdiff import canonical, comparable_view, is_output_location
from .evals import EvalPoint
from .loaded_runs import RunRecord
from .series import final_window

_SEED_KEY = re.compile(r"(^|\.)seed$")
_NAME_TAIL = re.compile(r"[\s_.\-#]*(seed|s)?[\s_.\-#]*$", re.IGNORECASE)


def is_seed_key(key: str) -> bool:
    return bool(_SEED_KEY.search(key))


def recipe_key(config: dict) -> str:
    """The comparable configuration without seeds and output locations, as one canonical string."""
    view = {k: canonical(v) for k, v in comparable_view(config).items()
            if not is_seed_key(k) and not is_output_location(k)}
    return json.dumps(view, sort_keys=True)


@dataclass
class GroupStat:
    """One quantity over a group's seeds."""

    values: List[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> Optional[float]:
        return statistics.stdev(self.values) if self.n > 1 else None


@dataclass
class SeedGroup:
    name: str
    runs: List[int]
    """Indices into the report's run list, in run order."""
    seeds: List[object]
    metric: Optional[GroupStat] = None
    """Final-window mean of the headline metric, one value per run that logged it."""
    evals: Dict[str, GroupStat] = field(default_factory=dict)
    """task -> avg@n of each run's last evaluation (runs without one are left out)."""


@dataclass
class GroupComparison:
    baseline: str
    other: str
    what: str
    difference: float
    se: Optional[float]
    exceeds: Optional[bool]
    """True: larger than 2 SE of the seed spread; None: a group has one seed, the spread is unknown."""


def _group_name(names: Sequence[str]) -> str:
    if len(names) == 1:
        return names[0]
    prefix = names[0]
    for n in names[1:]:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    prefix = _NAME_TAIL.sub("", prefix)
    return prefix or names[0] + " (seeds)"


def _seed_of(run: RunRecord) -> object:
    for key in sorted(run.args):
        if is_seed_key(key):
            return run.args[key]
    return None


def seed_groups(runs: Sequence[RunRecord], metric_key: Dict[str, Optional[str]], window: int,
                points: Sequence[EvalPoint] = ()) -> List[SeedGroup]:
    """The runs' seed groups, in order of each group's first run; ``metric_key`` maps run name to
    the headline metric key it logged (None: not logged), ``window`` is the final-window length."""
    by_recipe: Dict[str, List[int]] = {}
    for i, run in enumerate(runs):
        by_recipe.setdefault(recipe_key(run.config), []).append(i)
    groups = []
    for members in by_recipe.values():
        names = [runs[i].name for i in members]
        group = SeedGroup(name=_group_name(names), runs=members, seeds=[_seed_of(runs[i]) for i in members])
        finals = []
        for i in members:
            key = metric_key.get(runs[i].name)
            if key is None:
                continue
            stats = final_window(*runs[i].series(key), window)
            if stats is not None:
                finals.append(stats.mean)
        group.metric = GroupStat(finals) if finals else None
        last: Dict[int, EvalPoint] = {}
        for p in points:
            if p.run in members and (p.run not in last or p.step > last[p.run].step):
                last[p.run] = p
        per_task: Dict[str, List[float]] = {}
        for p in last.values():
            for task, t in (p.eval.summary.get("tasks") or {}).items():
                value = (t.get("avg@n") or {}).get("value")
                if isinstance(value, (int, float)) and math.isfinite(value):
                    per_task.setdefault(task, []).append(float(value))
        group.evals = {task: GroupStat(v) for task, v in per_task.items()}
        groups.append(group)
    names = [g.name for g in groups]
    for g in groups:  # two groups that strip to one name: keep them apart
        if names.count(g.name) > 1:
            g.name = " / ".join(runs[i].name for i in g.runs)
    return groups


def compare(a: GroupStat, b: GroupStat, baseline: str, other: str, what: str, z: float = 2.0) -> GroupComparison:
    """``b - a`` with Welch's standard error over seeds (None when a group has a single seed)."""
    diff = b.mean - a.mean
    if a.sd is None or b.sd is None:
        return GroupComparison(baseline, other, what, diff, None, None)
    se = math.sqrt(a.sd ** 2 / a.n + b.sd ** 2 / b.n)
    return GroupComparison(baseline, other, what, diff, se, abs(diff) > z * se)


def comparisons(groups: Sequence[SeedGroup], metric_label: str) -> List[GroupComparison]:
    """Every group against the first, on the training metric and on each task's avg@n."""
    out: List[GroupComparison] = []
    if len(groups) < 2:
        return out
    base = groups[0]
    for g in groups[1:]:
        if base.metric and g.metric:
            out.append(compare(base.metric, g.metric, base.name, g.name, f"final-window {metric_label}"))
        for task in base.evals:
            if task in g.evals:
                out.append(compare(base.evals[task], g.evals[task], base.name, g.name, f"{task} avg@n"))
    return out


def has_seed_groups(groups: Sequence[SeedGroup]) -> bool:
    """Whether any group holds more than one run (otherwise there is nothing to group)."""
    return any(len(g.runs) > 1 for g in groups)


def mean_curve(runs: Sequence[RunRecord], key: str, smooth) -> Optional[Dict[str, np.ndarray]]:
    """Mean, min and max over seeds of each run's ``smooth``-ed ``key`` at the steps every run of the
    group logged (a seed that stopped early shortens the curve rather than bending the mean)."""
    curves = []
    for run in runs:
        steps, values = run.series(key)
        if steps.size:
            curves.append(dict(zip(steps.astype(int).tolist(), smooth(values).tolist())))
    if not curves:
        return None
    common = sorted(set.intersection(*(set(c) for c in curves)))
    if not common:
        return None
    stack = np.array([[c[s] for s in common] for c in curves], dtype=np.float64)
    return {"step": np.array(common, dtype=np.float64), "mean": stack.mean(0), "min": stack.min(0),
            "max": stack.max(0), "n": np.array([len(curves)])}
