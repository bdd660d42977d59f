"""Generated headline sentences: what the numbers show, and nothing they do not.

Rules the sentences follow:

* every number is computed from the records and printed with what it is a mean of (which steps,
  which problems) and its spread;
* a difference between training curves is called larger than the step-to-step noise only when the
  final-window means differ by more than two standard errors of their difference (Welch's
  standard error from each window's step-to-step SD; steps are treated as independent, which each
  step's fresh batch makes approximately true); otherwise it is "within step-to-step noise";
* evaluation differences are evalkit's paired bootstrap over problems, with its 95% interval, and
  "within noise" when that interval contains 0;
* runs of different lengths, runs still running and runs that ended early are said so, because
  a final-window mean of a shorter run is not the same amount of training.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .evals import PairRow
from .groups import GroupComparison, SeedGroup, has_seed_groups
from .panels import PASS_RATE_KEYS, TIMING_TOTAL
from .loaded_runs import RUNNING, RunRecord
from .series import WindowStats, difference_exceeds_noise, final_window, first_window

DEFAULT_WINDOW = 10
REWARD_KEYS = ("train/reward", "rollout/reward_mean")


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _stats_text(s: WindowStats) -> str:
    spread = f" \u00b1 {_fmt(s.sd)}" if s.n > 1 else ""
    steps = f"step {s.first_step}" if s.first_step == s.last_step else f"steps {s.first_step}\u2013{s.last_step}"
    return f"{_fmt(s.mean)}{spread} ({steps})"


def _key(run: RunRecord, candidates) -> Optional[str]:
    return next((k for k in candidates if run.has(k)), None)


def window_size(runs: Sequence[RunRecord], window: int = DEFAULT_WINDOW) -> int:
    """The final-window length: ``window`` steps, fewer for short runs so that the first and the
    final window of the shortest run do not overlap."""
    lengths = [len(r.steps) for r in runs if len(r.steps)]
    if not lengths:
        return window
    return max(1, min(window, min(lengths) // 2)) if min(lengths) >= 2 else 1


def latest_pairs(pairs: Sequence[PairRow]) -> List[PairRow]:
    """The paired rows worth a sentence: between two runs, only the latest step both were
    evaluated at (the table has every step); over training, every run's first-vs-last row."""
    latest = {}
    for row in pairs:
        if row.kind == "between runs":
            key = (row.runs, row.task)
            if key not in latest or row.steps[0] > latest[key].steps[0]:
                latest[key] = row
    return [row for row in pairs if row.kind != "between runs" or latest.get((row.runs, row.task)) is row]


def headline_metric(runs: Sequence[RunRecord]) -> Tuple[Optional[str], Dict[str, Optional[str]]]:
    """The one training metric the headline compares: ``("batch pass rate", {run name: key})`` when
    any run logged a pass rate, else the reward; ``(None, {})`` when no run logged either."""
    for candidates, label in ((PASS_RATE_KEYS, "batch pass rate"), (REWARD_KEYS, "reward")):
        keys = {r.name: _key(r, candidates) for r in runs}
        if any(keys.values()):
            return label, keys
    return None, {}


def group_sentences(groups: Sequence[SeedGroup], rows: Sequence[GroupComparison], metric_label: Optional[str],
                    window: int) -> List[str]:
    """Sentences about seed groups (runs that differ only in their seed); none when no group has two runs."""
    if not has_seed_groups(groups):
        return []
    out = []
    parts = []
    for g in groups:
        if g.metric is None:
            continue
        sd = f" \u00b1 {_fmt(g.metric.sd)}" if g.metric.sd is not None else ""
        parts.append(f"{g.name} {_fmt(g.metric.mean)}{sd} ({g.metric.n} seed{'s' if g.metric.n != 1 else ''})")
    if parts and metric_label:
        out.append(f"Seed groups (runs that differ only in their seed), final-{window}-step {metric_label}, mean "
                   "\u00b1 SD across seeds: " + "; ".join(parts) + ".")
    for row in rows:
        if row.exceeds is None:
            tail = "a group has one seed, so the seed-to-seed spread is unknown: no verdict"
        elif row.exceeds:
            tail = f"larger than the seed-to-seed spread (2 SE = {_fmt(2 * row.se)})"
        else:
            tail = f"within the seed-to-seed spread (2 SE = {_fmt(2 * row.se)})"
        scale = 100 if row.what.endswith("avg@n") else 1
        unit = " points" if scale == 100 else ""
        diff = f"{scale * row.difference:+.3g}{unit}"
        if row.se is not None and scale == 100:
            tail = tail.replace(f"2 SE = {_fmt(2 * row.se)}", f"2 SE = {_fmt(200 * row.se)} points")
        out.append(f"{row.other} \u2212 {row.baseline} (seed groups): {diff} in {row.what}, {tail}.")
    return out


def headline(runs: Sequence[RunRecord], pairs: Sequence[PairRow] = (), window: int = DEFAULT_WINDOW,
             compare_runs: bool = True) -> List[str]:
    """The headline sentences (plain text) for the runs and the paired evaluation rows.
    ``compare_runs=False`` (the runs form seed groups, compared by :func:`group_sentences`) leaves out
    the run-against-first-run sentences of the training metric."""
    out: List[str] = []
    lengths = {r.name: r.last_step for r in runs}
    done = [r for r in runs if r.last_step is not None]
    if len(runs) > 1 and len({v for v in lengths.values() if v is not None}) > 1:
        listed = ", ".join(f"{name} {step if step is not None else 0}" for name, step in lengths.items())
        out.append(f"The runs reached different steps ({listed}); final-window numbers below compare "
                   "different amounts of training.")
    for r in runs:
        if r.status == RUNNING:
            last = f"last step {r.last_step}" if r.last_step is not None else "no step recorded yet"
            out.append(f"{r.name} is still running (or was killed without an end record); {last}.")
        elif r.status == "stopped_by_guard":
            step = next((e.get("step") for e in reversed(r.events) if e.get("event") == "guard_incident"), r.last_step)
            out.append(f"{r.name} was stopped by the non-finite guard at step {step}.")
        elif r.status == "crashed":
            out.append(f"{r.name} crashed after step {r.last_step}.")
    k = window_size(done, window)

    # One metric for every run: the pass rate when any run logged it, else the reward; a run
    # lacking it is named, never compared on another metric.
    stats = {}
    metric_name, keys = headline_metric(done)
    if metric_name is not None:
        lacking = [name for name, key in keys.items() if key is None]
        if lacking:
            out.append(f"{', '.join(lacking)} logged no {metric_name}: left out of the comparisons below.")
        for r in done:
            if keys[r.name] is None:
                continue
            steps, values = r.series(keys[r.name])
            stats[r.name] = (final_window(steps, values, k), first_window(steps, values, k), keys[r.name])
    if stats:
        parts = [f"{name} {_stats_text(s[0])}" for name, s in stats.items() if s[0] is not None]
        out.append(f"Training {metric_name} over the final {k} logged steps (mean \u00b1 step-to-step SD): "
                   + "; ".join(parts) + ".")
        names = list(stats)
        base = names[0]
        for other in names[1:] if compare_runs else ():
            a, b = stats[base][0], stats[other][0]
            verdict = difference_exceeds_noise(b, a)
            diff = b.mean - a.mean
            if verdict is None:
                tail = "too few steps to estimate the step-to-step noise"
            elif verdict:
                tail = "larger than the step-to-step noise (more than 2 standard errors)"
            else:
                tail = "within the step-to-step noise (less than 2 standard errors)"
            out.append(f"{other} \u2212 {base}: {diff:+.3g} in final-window {metric_name}, {tail}.")
        for name, (last, first, _) in stats.items():
            if first is None or last is None or last.first_step <= first.last_step:
                continue
            verdict = difference_exceeds_noise(last, first)
            if verdict is None:
                continue
            change = last.mean - first.mean
            word = "larger than" if verdict else "within"
            out.append(f"{name}: {metric_name} went from {_stats_text(first)} to {_stats_text(last)}, "
                       f"a change of {change:+.3g}, {word} the step-to-step noise.")

    times = []
    for r in done:
        if r.has(TIMING_TOTAL):
            _, v = r.series(TIMING_TOTAL)
            times.append(f"{r.name} {np.median(v):.3g} s")
    if times:
        out.append("Median time per step (timing/step_total): " + ", ".join(times) + ".")

    for row in latest_pairs(pairs):
        for metric in ("avg@n",):
            m = row.metrics.get(metric)
            if not m:
                continue
            lo, hi = m["ci95"]
            verdict = "distinguishable from noise" if m["distinguishable"] else "within noise"
            out.append(f"{row.task} {metric}: {row.other} \u2212 {row.baseline} = {100 * m['difference']:+.1f} points "
                       f"[{100 * lo:+.1f}, {100 * hi:+.1f}] (paired bootstrap over {row.problems} problems, "
                       f"{100 * m['baseline']:.1f}% \u2192 {100 * m['run']:.1f}%): {verdict}.")

    guards = sum(1 for r in runs for e in r.events if e.get("event") == "guard_incident")
    warns = sum(1 for r in runs for e in r.events if e.get("event") == "mismatch_warning")
    nonfinite = sum(1 for r in runs for steps in r.nonfinite.values() for _ in steps)
    bits = [f"{n} {what}" for n, what in ((guards, "guard incident(s)"), (warns, "mismatch warning(s)"),
                                          (nonfinite, "non-finite metric value(s)")) if n]
    if bits:
        out.append("Recorded: " + ", ".join(bits) + " (see Incidents).")
    return out
