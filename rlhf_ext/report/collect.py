"""The data side of the report: load runs and evaluations and compute everything the page shows
(:class:`ReportData`: run table, configuration differences, headline, panels, seed groups, paired
comparisons and their verdicts, the sample viewer's data). No HTML here (:mod:`.page`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..evalkit.resolution import MinEffect, audited_error, min_effect, verdict
from .configdiff import ConfigDiff, diff_configs
from .evals import EvalPoint, EvalRun, PairRow, attribute, find_eval_dirs, load_eval, paired_rows
from .groups import GroupComparison, SeedGroup, comparisons, has_seed_groups, seed_groups
from .headline import group_sentences, headline, headline_metric, latest_pairs, window_size
from .panels import PANELS, PanelData, resolve
from .loaded_runs import RunRecord, load_runs


@dataclass
class ReportData:
    """Everything the page shows, computed from the records (no HTML here)."""

    runs: List[RunRecord]
    evals: List[EvalRun] = field(default_factory=list)
    points: List[EvalPoint] = field(default_factory=list)
    unplaced: List[Tuple[EvalRun, str]] = field(default_factory=list)
    pairs: List[PairRow] = field(default_factory=list)
    diff: Optional[ConfigDiff] = None
    panels: List[PanelData] = field(default_factory=list)
    headline: List[str] = field(default_factory=list)
    groups: List[SeedGroup] = field(default_factory=list)
    """Seed groups (runs that differ only in their seed), each run in exactly one."""
    group_rows: List[GroupComparison] = field(default_factory=list)
    metric_label: Optional[str] = None
    metric_keys: Dict[str, Optional[str]] = field(default_factory=dict)
    window: int = 1
    template_notes: List[str] = field(default_factory=list)
    """Evaluations whose prompt template differs from the one their run trained with."""
    min_effect: Optional[MinEffect] = None
    """The minimum effect of the evaluation verdicts (given, or seed spread + audited grader error)."""
    samples: Dict[str, object] = field(default_factory=lambda: {"prompts": [], "prompt_ids": [], "sources": []})
    """The sample viewer's data (:func:`.samples.viewer_payload`)."""
    sample_notes: List[str] = field(default_factory=list)


def say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"rlhf-ext report: {message}", file=sys.stderr, flush=True)


def collect(run_dirs: Sequence, eval_dirs: Sequence = (), names: Optional[Sequence[str]] = None,
            resamples: int = 2000, quiet: bool = True, min_effect_points: Optional[float] = None) -> ReportData:
    """Load and compute everything (the data side of the report). ``min_effect_points``: the minimum
    effect of the evaluation verdicts in points (default: measured, :func:`measured_min_effect`)."""
    say(f"reading {len(run_dirs)} run(s)", quiet)
    runs = load_runs(run_dirs, names)
    data = ReportData(runs=runs, diff=diff_configs([r.config for r in runs]))
    if eval_dirs:
        paths = find_eval_dirs(eval_dirs)
        say(f"reading {len(paths)} evaluation(s)", quiet)
        data.evals = [load_eval(p) for p in paths]
        data.points, data.unplaced = attribute(data.evals, runs)
        say("paired bootstrap comparisons", quiet)
        data.pairs = paired_rows(data.points, runs, resamples=resamples)
        data.template_notes = template_notes(data.points, runs)
    data.panels = [resolve(p, runs) for p in PANELS]
    done = [r for r in runs if r.last_step is not None]
    data.window = window_size(done)
    data.metric_label, data.metric_keys = headline_metric(done)
    data.groups = seed_groups(runs, data.metric_keys, data.window, data.points)
    data.group_rows = comparisons(data.groups, data.metric_label or "metric")
    # With seed groups, groups are compared (by the seeds' spread), not single runs.
    data.headline = headline(runs, data.pairs, compare_runs=not has_seed_groups(data.groups))
    data.headline += group_sentences(data.groups, data.group_rows, data.metric_label, data.window)
    if data.template_notes:
        data.headline.append(f"Warning: {len(data.template_notes)} evaluation(s) used a prompt template other than "
                             "the one their run trained with (see Notes on the data).")
    if data.pairs or min_effect_points is not None:
        data.min_effect = measured_min_effect(data, min_effect_points)
        for row in data.pairs:
            for m in row.metrics.values():
                m["verdict"], m["reason"] = verdict(100 * m["difference"], [100 * x for x in m["ci95"]],
                                                    data.min_effect)
        said = [f"{row.task} avg@n, {row.other} vs {row.baseline}: {m['verdict']} ({m['reason']})"
                for row in latest_pairs(data.pairs) if (m := row.metrics.get("avg@n"))]
        if said:
            data.headline.append(f"Evaluation verdicts at the experiment's resolution ({data.min_effect.describe()}): "
                                 + "; ".join(said) + ".")
    data.samples, data.sample_notes = sample_payload(data)
    return data


def sample_payload(data: ReportData):
    """The sample viewer's sources: each run's rollout samples, then each evaluation's answers (named
    after the run step it was placed on, when it was)."""
    from .samples import eval_source, run_source, viewer_payload

    sources = [s for r in data.runs if (s := run_source(r.name, r.path, r.warnings)) is not None]
    for ev in data.evals:
        placed = [p for p in data.points if p.eval is ev]
        if placed:
            first = placed[0]
            name = f"evaluation of {data.runs[first.run].name} step {first.step}"
            if len(placed) > 1:
                name += f" (= {len(placed) - 1} other run(s)' step {first.step})"
        else:
            name = f"evaluation {ev.path.name}"
        source = eval_source(name, ev.path)
        if source is not None:
            sources.append(source)
    return viewer_payload(sources)


def template_notes(points: Sequence[EvalPoint], runs: Sequence[RunRecord]) -> List[str]:
    """One note per (evaluation, run) whose prompt templates differ (evalkit's ``template_mismatch``)."""
    from ..evalkit.records import RunDirError, read_json
    from ..evalkit.templates import template_mismatch

    notes, seen = [], set()
    for p in points:
        key = (str(p.eval.path), p.run)
        if key in seen:
            continue
        seen.add(key)
        try:
            generation = read_json(Path(p.eval.path) / "config.json").get("generation", {})
        except RunDirError:
            continue
        message = template_mismatch(runs[p.run].args, generation)
        if message:
            notes.append(f"{runs[p.run].name} @ step {p.step}: evaluation {p.eval.path}: {message}")
    return notes


def measured_min_effect(data: ReportData, given: Optional[float] = None) -> MinEffect:
    """``given`` (points) when set; else the seed spread of avg@n (pooled over the seed groups with two or
    more evaluated seeds: the square root of the mean of their variances, largest over tasks) plus the
    largest grader error rate audited (``evalkit audit``) among the evaluations on the page."""
    if given is not None:
        return min_effect(given)
    spreads = []
    tasks = {t for g in data.groups for t in g.evals}
    for task in tasks:
        variances = [g.evals[task].sd ** 2 for g in data.groups if task in g.evals and g.evals[task].sd is not None]
        if variances:
            spreads.append(100 * (sum(variances) / len(variances)) ** 0.5)
    return min_effect(None, max(spreads) if spreads else None, audited_error([ev.path for ev in data.evals]))
