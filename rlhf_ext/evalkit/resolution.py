"""Verdicts at the experiment's resolution: ``better``, ``worse`` or ``no difference``, with the reason.

A paired bootstrap interval over problems says whether a difference is distinguishable from the
sampling of problems and responses. It says nothing about two other sources of error that are as
large in RL studies: the grader (a share of answers it grades wrongly) and the seed (two runs of
one recipe that differ only in their seed land points apart). A difference smaller than those is
no difference, however tight its interval. So a verdict needs a **minimum effect** (in points of
avg@n) and reads:

* ``better``: the difference is at least ``+min_effect`` and its 95% interval lies above 0;
* ``worse``: at most ``-min_effect`` and the interval lies below 0;
* ``no difference`` otherwise, saying why: the interval contains 0, or |difference| is below the
  minimum effect.

The default minimum effect is what was measured: the seed spread (the SD across seeds of avg@n, in
points, of a seed group's evaluations) plus the grader's error rate (in points: the share of
graded answers a person audit found graded wrongly, :mod:`rlhf_ext.evalkit.audit`; if every such
error fell on one side it moves avg@n by that much). With neither measured the minimum effect is 0
and the verdict rests on the interval alone, which the reason says.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no difference"
AUDIT_FILE = "audit.json"
"""Written by ``evalkit audit`` into the evaluated run directory."""


@dataclass
class MinEffect:
    """The minimum effect in points and where it came from."""

    points: float
    seed_spread: Optional[float] = None
    """SD across seeds of avg@n, in points (None: not measured)."""
    grader_error: Optional[float] = None
    """Audited grader error rate, in points (None: no audit)."""
    given: bool = False
    """True when the user set it (``--min-effect``)."""

    def describe(self) -> str:
        if self.given:
            return f"minimum effect {self.points:.1f} points (given)"
        parts = []
        if self.seed_spread is not None:
            parts.append(f"seed spread {self.seed_spread:.1f}")
        if self.grader_error is not None:
            parts.append(f"grader error {self.grader_error:.1f}")
        if not parts:
            return "minimum effect 0: no seed spread or grader audit measured"
        return f"minimum effect {self.points:.1f} points = " + " + ".join(parts)


def min_effect(given: Optional[float] = None, seed_spread: Optional[float] = None,
               grader_error: Optional[float] = None) -> MinEffect:
    """``given`` when set (points, >= 0), else seed spread + grader error (each in points, missing = 0)."""
    if given is not None:
        if not given >= 0:
            raise ValueError(f"the minimum effect must be >= 0 points, got {given}")
        return MinEffect(float(given), given=True)
    total = (seed_spread or 0.0) + (grader_error or 0.0)
    return MinEffect(total, seed_spread=seed_spread, grader_error=grader_error)


def verdict(difference: float, ci95: Sequence[float], effect: MinEffect) -> Tuple[str, str]:
    """(``better`` / ``worse`` / ``no difference``, the reason), all quantities in points."""
    low, high = float(ci95[0]), float(ci95[1])
    m = effect.points
    interval = f"95% interval [{low:+.1f}, {high:+.1f}]"
    if low <= 0 <= high:
        return NO_DIFFERENCE, f"{interval} contains 0"
    if abs(difference) < m:
        return NO_DIFFERENCE, (f"|{difference:+.1f}| points is below the {effect.describe()}, although the "
                               f"{interval} excludes 0")
    word = BETTER if difference > 0 else WORSE
    if m > 0:
        return word, f"{difference:+.1f} points, {interval} excludes 0, |difference| >= {effect.describe()}"
    return word, f"{difference:+.1f} points, {interval} excludes 0 ({effect.describe()})"


def seed_spread(run_dirs: Sequence, task: Optional[str] = None) -> float:
    """SD (n - 1) across evalkit runs of one recipe's seeds of avg@n, in points; ``task`` picks the
    task when the runs evaluated several (default: the only one)."""
    from .records import read_json

    if len(run_dirs) < 2:
        raise ValueError(f"a seed spread needs the evaluations of at least two seeds, got {len(run_dirs)}")
    values: List[float] = []
    for d in run_dirs:
        summary = read_json(Path(d) / "summary.json")
        tasks = summary.get("tasks") or {}
        name = task if task is not None else (next(iter(tasks)) if len(tasks) == 1 else None)
        if name is None:
            raise ValueError(f"{d} evaluated several tasks ({', '.join(tasks)}); name one")
        if name not in tasks:
            raise ValueError(f"{d} has no task {name!r} (it has {', '.join(tasks)})")
        values.append(100.0 * float(tasks[name]["avg@n"]["value"]))
    return statistics.stdev(values)


def audited_error(run_dirs: Sequence) -> Optional[float]:
    """The largest grader error rate (points) among the ``audit.json`` files of ``run_dirs``; None when
    none was audited."""
    rates = []
    for d in run_dirs:
        path = Path(d) / AUDIT_FILE
        if path.exists():
            audit = json.loads(path.read_text())
            if audit.get("judged"):
                rates.append(100.0 * float(audit["error_rate"]["value"]))
    return max(rates) if rates else None


def apply(result: dict, effect: MinEffect) -> dict:
    """Add ``verdict`` and ``reason`` to every avg@n / maj@n entry of an :func:`compare_runs` result
    (differences in points) and the minimum effect used at the top level; returns ``result``."""
    result["min_effect"] = {"points": effect.points, "seed_spread": effect.seed_spread,
                            "grader_error": effect.grader_error, "given": effect.given,
                            "description": effect.describe()}
    for comp in result.get("comparisons", []):
        for entry in comp.get("tasks", {}).values():
            for metric in ("avg@n", "maj@n"):
                m = entry.get(metric)
                if m:
                    m["verdict"], m["reason"] = verdict(100 * m["difference"], [100 * x for x in m["ci95"]], effect)
    return result


def render_verdicts(result: dict) -> str:
    """Markdown: one line per run, task and metric with the verdict and its reason."""
    me = result.get("min_effect") or {}
    lines = ["", f"## Verdicts at the experiment's resolution ({me.get('description', 'minimum effect 0')})", "",
             "| run | task | metric | difference | verdict | reason |", "|---|---|---|---|---|---|"]
    for comp in result.get("comparisons", []):
        for task, entry in comp.get("tasks", {}).items():
            for metric in ("avg@n", "maj@n"):
                m = entry.get(metric)
                if m and "verdict" in m:
                    lines.append(f"| {comp['run']} | {task} | {metric} | {100 * m['difference']:+.1f} | "
                                 f"**{m['verdict']}** | {m['reason']} |")
    return "\n".join(lines) + "\n"
