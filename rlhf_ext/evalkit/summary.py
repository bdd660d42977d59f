"""Summaries of run directories and paired comparisons between runs.

A summary is recomputed from ``samples.jsonl`` and ``config.json`` alone, so ``evalkit report``
and the end-of-run summary always agree, and nothing in it depends on timing or paths: the same
samples give byte-identical ``summary.json``. Each metric is the mean of a per-problem score with
a percentile-bootstrap interval over problems (see :mod:`.metrics` for the formulas and sources).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from . import choice_metrics, records, voting
from .metrics import (G_PASS_THRESHOLDS, bootstrap_ci, bootstrap_indices, g_pass_at_k, majority_vote, mg_pass_at_k,
                      paired_difference, pass_at_k, pass_k_values, percentile)
from .records import RunDirError, SampleLog, read_json
from .voting import AnswerEquivalence


@dataclass
class ProblemScores:
    """Per-problem scores of one task, in dataset order."""

    task: str
    ids: list[str]
    n: list[int]  # samples present per problem
    correct: list[int]
    maj: list[float]
    samples: list = field(default_factory=list)  # each problem's records, by sample index
    answer_type: str = "math"


def _group(records_: Sequence[dict], config: dict) -> dict:
    """``{task: {problem_id: [record, ...]}}`` restricted to the run's problems and sample range."""
    n_samples = int(config["n_samples"])
    wanted = {t: set(config["datasets"][t]["problem_ids"]) for t in config["tasks"]}
    grouped: dict = {t: {} for t in config["tasks"]}
    for rec in records_:
        task, pid, idx = records.sample_key(rec)
        if task in wanted and pid in wanted[task] and 0 <= idx < n_samples:
            grouped[task].setdefault(pid, []).append(rec)
    return grouped


def problem_scores(task: str, ids: Sequence[str], by_problem: dict,
                   equivalence: Optional[AnswerEquivalence] = None) -> ProblemScores:
    """Per-problem counts and maj@n; ``equivalence`` decides which answers vote together (None: a
    fresh :class:`~.voting.AnswerEquivalence` on the default grader)."""
    equivalence = equivalence if equivalence is not None else AnswerEquivalence()
    scores = ProblemScores(task=task, ids=[], n=[], correct=[], maj=[])
    problems = []
    for pid in ids:
        recs = sorted(by_problem.get(pid, []), key=lambda r: int(r["sample_index"]))
        if recs:
            problems.append((pid, recs, *voting.problem_answers(recs)))
    scores.answer_type = choice_metrics.answer_type_of([p[1] for p in problems])
    # choice/ranking answers are labels: equal labels vote together, nothing to ask math-verify
    structured = scores.answer_type in choice_metrics.STRUCTURED
    if not structured:  # every comparison of the task in one parallel batch, then the votes
        equivalence.prepare(pair for _, _, keys, counts in problems for pair in equivalence.pairs_for(keys, counts))
    for pid, recs, keys, counts in problems:
        scores.ids.append(pid)
        scores.n.append(len(recs))
        scores.correct.append(sum(bool(r["correct"]) for r in recs))
        scores.samples.append(recs)
        scores.maj.append(majority_vote([r.get("extracted") for r in recs], [bool(r["correct"]) for r in recs],
                                        same=None if structured else equivalence.for_problem(keys, counts)))
    return scores


def _metric(values: np.ndarray, indices: np.ndarray) -> dict:
    low, high = bootstrap_ci(values, indices=indices)
    return {"value": float(values.mean()), "ci95": [low, high]}


def _task_summary(scores: ProblemScores, recs: list[dict], expected_problems: int, n_samples: int,
                  resamples: int, seed: int) -> dict:
    present = len(recs)
    out: dict = {
        "problems": expected_problems,
        "problems_with_samples": len(scores.ids),
        "n_samples": n_samples,
        "samples": present,
        "missing_samples": expected_problems * n_samples - present,
    }
    if not scores.ids:
        return out
    n = np.asarray(scores.n)
    c = np.asarray(scores.correct)
    idx = bootstrap_indices(len(scores.ids), resamples, seed)
    out["avg@n"] = _metric(c / n, idx)
    k_max = int(n.min())
    out["pass@k"] = {str(k): _metric(np.array([pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n, c)]), idx)
                     for k in pass_k_values(n_samples) if k <= k_max}
    out["maj@n"] = _metric(np.asarray(scores.maj), idx)
    # Stability across samples (arXiv 2412.13147): k >= 2 only, G-Pass@1 being avg@n at every tau.
    g_ks = [k for k in pass_k_values(n_samples) if 2 <= k <= k_max]
    out["g-pass@k"] = {str(k): {str(t): _metric(np.array([g_pass_at_k(int(ni), int(ci), k, t) for ni, ci in zip(n, c)]),
                                                   idx) for t in G_PASS_THRESHOLDS} for k in g_ks}
    out["mg-pass@k"] = {str(k): _metric(np.array([mg_pass_at_k(int(ni), int(ci), k) for ni, ci in zip(n, c)]), idx)
                        for k in g_ks}
    lengths = [int(r["response_tokens"]) for r in recs]
    out["truncation_rate"] = float(np.mean([bool(r["truncated"]) for r in recs]))
    out["response_tokens"] = {"mean": float(np.mean(lengths)), "p50": percentile(lengths, 50),
                              "p90": percentile(lengths, 90)}
    out["no_answer_rate"] = float(np.mean([r.get("extracted") is None for r in recs]))
    if scores.answer_type in choice_metrics.STRUCTURED:
        out.update(choice_metrics.structured_summary(scores.ids, scores.samples, scores.maj, scores.answer_type,
                                                     idx, resamples, seed))
    out["grading"] = {
        "timeouts": sum(bool(r.get("grade_timeout")) for r in recs),
        "errors": sum(r.get("grade_error") is not None for r in recs),
        "gold_unparsed_problems": len({r["problem_id"] for r in recs if not r.get("gold_parsed", True)}),
    }
    return out


def summarize(records_: Sequence[dict], config: dict, equivalence: Optional[AnswerEquivalence] = None) -> dict:
    """The summary of a run (``summary.json``); a function of its records and config alone.

    ``equivalence``: how maj@n decides that two answers are the same (default: the grader's
    equivalence on the process-wide default grader; see :mod:`.voting`).
    """
    equivalence = equivalence if equivalence is not None else AnswerEquivalence()
    n_samples = int(config["n_samples"])
    stats = config.get("statistics", {})
    resamples = int(stats.get("bootstrap_resamples", 2000))
    seed = int(stats.get("bootstrap_seed", 0))
    grouped = _group(records_, config)
    tasks: dict = {}
    all_scores, all_recs, all_expected = [], [], 0
    for task in config["tasks"]:
        ids = list(config["datasets"][task]["problem_ids"])
        scores = problem_scores(task, ids, grouped[task], equivalence)
        recs = [r for pid in ids for r in grouped[task].get(pid, [])]
        tasks[task] = _task_summary(scores, recs, len(ids), n_samples, resamples, seed)
        all_scores.append(scores)
        all_recs.extend(recs)
        all_expected += len(ids)
    if len(config["tasks"]) > 1:
        combined = ProblemScores(task=config["suite"], ids=[], n=[], correct=[], maj=[])
        for s in all_scores:
            combined.ids += [f"{s.task}/{i}" for i in s.ids]
            combined.n += s.n
            combined.correct += s.correct
            combined.maj += s.maj
        tasks[config["suite"]] = _task_summary(combined, all_recs, all_expected, n_samples, resamples, seed)
    gen = config["generation"]
    return {
        "suite": config["suite"],
        "model": gen["model"],
        "template": gen["template"],
        "sampling": {"temperature": gen["temperature"], "top_p": gen["top_p"],
                     **{k: gen[k] for k in ("top_k", "min_p") if k in gen}, "max_tokens": gen["max_tokens"],
                     "seed": gen["seed"]},
        "n_samples": n_samples,
        # runs from before the option were graded with the anchor required
        "require_anchor": bool(config.get("grading", {}).get("require_anchor", True)),
        "complete": all(t["missing_samples"] == 0 for t in tasks.values()),
        "confidence": 0.95,
        "bootstrap_resamples": resamples,
        "tasks": tasks,
        **_cascade(records_, config, equivalence),
    }


def _cascade(records_: Sequence[dict], config: dict, equivalence: AnswerEquivalence) -> dict:
    """``{"cascade": ...}`` when a verifier judged some samples (:mod:`.verifier`), else nothing."""
    from .verifier import cascade_section, has_verdicts

    if not has_verdicts(records_):
        return {}
    return {"cascade": cascade_section(records_, lambda recs: summarize(recs, config, equivalence)["tasks"])}


def _pct(m: Optional[dict]) -> str:
    if not m:
        return "-"
    lo, hi = m["ci95"]
    return f"{100 * m['value']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def render_markdown(summary: dict) -> str:
    n = summary["n_samples"]
    s = summary["sampling"]
    lines = [
        f"# evalkit {summary['suite']}: {summary['model']}",
        "",
        f"template `{summary['template']}`, temperature {s['temperature']}, top_p {s['top_p']}, "
        + "".join(f"{k} {s[k]}, " for k in ("top_k", "min_p") if k in s)
        + f"max_tokens {s['max_tokens']}, seed {s['seed']}, n = {n} samples per problem. "
        f"Scores in %, with bootstrap 95% intervals over problems ({summary['bootstrap_resamples']} resamples).",
        "",
        "Answers: " + ("only those stated with an anchor (\\boxed{}, 'the answer is', <answer>, ####) are graded, "
                       "as the rewards do." if summary.get("require_anchor", True) else
                       "without an anchor, the response's last math expression is graded, as lighteval and "
                       "math-verify do for published numbers."),
        "",
    ]
    if not summary["complete"]:
        lines += ["**Incomplete run**: some samples are missing (see `missing samples`); rerun the same "
                  "command to finish it. pass@k is shown only for k up to the fewest samples of a problem.", ""]
    ks = pass_k_values(n)
    header = ["task", "problems", f"avg@{n}"] + [f"pass@{k}" for k in ks if k != 1] + [f"maj@{n}", "truncated",
                                                                                    "tokens mean / p50 / p90"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for task, t in summary["tasks"].items():
        if "avg@n" not in t:
            lines.append("| " + " | ".join([task, str(t["problems"])] + ["-"] * (len(header) - 2)) + " |")
            continue
        rt = t["response_tokens"]
        row = [task, str(t["problems"]), _pct(t["avg@n"])]
        row += [_pct(t["pass@k"].get(str(k))) for k in ks if k != 1]
        row += [_pct(t["maj@n"]), f"{100 * t['truncation_rate']:.1f}",
                f"{rt['mean']:.0f} / {rt['p50']:.0f} / {rt['p90']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    notes = []
    for task, t in summary["tasks"].items():
        if t.get("missing_samples"):
            notes.append(f"- {task}: {t['missing_samples']} missing samples")
        g = t.get("grading", {})
        if g.get("timeouts") or g.get("errors"):
            notes.append(f"- {task}: {g['timeouts']} grading timeouts, {g['errors']} grading errors (scored wrong)")
        if g.get("gold_unparsed_problems"):
            notes.append(f"- {task}: the gold answer of {g['gold_unparsed_problems']} problems could not be parsed "
                         "(those samples are scored wrong): check the dataset")
    lines += _stability_markdown(summary)
    lines += _structured_markdown(summary, n)
    from .verifier import cascade_markdown

    lines += cascade_markdown(summary)
    if notes:
        lines += ["Notes:", *notes, ""]
    lines.append(f"avg@{n} is the mean accuracy over samples (DeepSeek-R1's pass@1); pass@k is the unbiased "
                 f"estimator of Chen et al. 2021; maj@{n} grades the majority answer, equivalent answers voting "
                 "together (ties split the credit).")
    return "\n".join(lines) + "\n"


def _stability_markdown(summary: dict) -> list:
    """G-Pass@k at tau 0.5 / 0.75 / 1 and mG-Pass@k, for the largest k below n (all k are in the JSON)."""
    rows = []
    for task, t in summary["tasks"].items():
        ks = [int(k) for k in t.get("g-pass@k", {}) if int(k) < summary["n_samples"]]
        if ks:
            k = str(max(ks))
            g = t["g-pass@k"][k]
            rows.append("| " + " | ".join([task, k] + [_pct(g.get(str(tau))) for tau in (0.5, 0.75, 1.0)]
                                         + [_pct(t["mg-pass@k"][k])]) + " |")
    if not rows:
        return []
    return ["Stability (G-Pass@k_tau: at least ceil(tau k) of k samples drawn from the n are right; mG-Pass@k "
            "averages tau over (0.5, 1]; arXiv 2412.13147):", "",
            "| task | k | G-Pass@k 0.5 | G-Pass@k 0.75 | G-Pass@k 1.0 | mG-Pass@k |", "|---|---|---|---|---|---|",
            *rows, ""]


def _structured_markdown(summary: dict, n: int) -> list:
    """The choice/ranking table (parse failures, pick and rank correlation) and pair consistency."""
    tasks = {t: v for t, v in summary["tasks"].items() if v.get("answer_type") in choice_metrics.STRUCTURED}
    if not tasks:
        return []
    lines = ["| task | answer type | accuracy (avg@n) | pick (top1@n) | rank correlation | parse failures | "
             "truncated | both of a pair (both@n) | all n of both | both by majority | pairs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task, t in tasks.items():
        pc = t.get("pair_consistency", {})
        tau = t.get("rank_correlation")
        row = [task, t["answer_type"] + (" (options shuffled)" if t.get("shuffled_options") else ""), _pct(t["avg@n"]),
               _pct(t.get("top1@n", t["avg@n"])),
               f"{tau['value']:+.3f} [{tau['ci95'][0]:+.3f}, {tau['ci95'][1]:+.3f}]" if tau else "-",
               _pct(t["parse_failure_rate"]), _pct(t["truncation"]),
               _pct(pc.get("both@n")), _pct(pc.get("both_all@n")), _pct(pc.get("both_maj@n")), str(pc.get("pairs", 0))]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "For a ranking, accuracy is the exact order (full-ranking accuracy) and the pick is its first place; "
              "rank correlation is the mean Kendall tau against the gold (an unreadable ranking counts 0). Pairs "
              f"share a pair_id (a question and its flipped twin): both@n pairs sample i of both, all n of both "
              f"needs all {n} samples of both right.", ""]
    for task, t in tasks.items():
        outcomes = ", ".join(f"{k} {v}" for k, v in t.get("parse_outcomes", {}).items())
        lines.append(f"- {task} answers: {outcomes}")
    return lines + [""]


def load_run(run_dir) -> tuple[dict, list[dict]]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    config = read_json(run_dir / records.CONFIG_FILE)
    for key in ("suite", "tasks", "n_samples", "datasets", "generation"):
        if key not in config:
            raise RunDirError(f"{run_dir / records.CONFIG_FILE} lacks {key!r}; not an evalkit run directory")
    return config, SampleLog(run_dir / records.SAMPLES_FILE).read()


def report(run_dir, equivalence: Optional[AnswerEquivalence] = None) -> dict:
    config, recs = load_run(run_dir)
    return summarize(recs, config, equivalence)


def compare_runs(run_dirs: Sequence, *, resamples: int = 2000, seed: int = 0,
                 equivalence: Optional[AnswerEquivalence] = None) -> dict:
    """Each run against the first (the baseline), per task: paired bootstrap of avg@n and maj@n.

    Problems are paired by id; only problems with samples in both runs count. Runs that used
    different copies of a benchmark (different dataset hashes) are refused: their problem ids
    need not mean the same problems.
    """
    if len(run_dirs) < 2:
        raise ValueError("compare needs at least two run directories")
    loaded = [(str(d), *load_run(d)) for d in run_dirs]
    equivalence = equivalence if equivalence is not None else AnswerEquivalence()
    base_name, base_cfg, base_recs = loaded[0]
    base_grouped = _group(base_recs, base_cfg)
    out = {"baseline": base_name, "confidence": 0.95, "bootstrap_resamples": resamples, "comparisons": []}
    for name, cfg, recs in loaded[1:]:
        grouped = _group(recs, cfg)
        comparison = {"run": name, "tasks": {}}
        # runs from before the option were graded with the anchor required
        modes = (bool(base_cfg.get("grading", {}).get("require_anchor", True)),
                 bool(cfg.get("grading", {}).get("require_anchor", True)))
        if modes[0] != modes[1]:  # the scores are still paired, but part of a difference is the grading
            comparison["grading_differs"] = {"baseline_require_anchor": modes[0], "run_require_anchor": modes[1]}
        shared = [t for t in base_cfg["tasks"] if t in cfg["tasks"]]
        if not shared:
            raise RunDirError(f"{name} and {base_name} share no task "
                              f"({', '.join(cfg['tasks'])} vs {', '.join(base_cfg['tasks'])})")
        pooled: dict = {"avg@n": ([], []), "maj@n": ([], [])}
        for task in shared:
            sha_a = base_cfg["datasets"][task]["sha256"]
            sha_b = cfg["datasets"][task]["sha256"]
            if sha_a != sha_b:
                raise RunDirError(f"{task}: {base_name} and {name} used different copies of the dataset "
                                  f"({sha_a[:12]} vs {sha_b[:12]}); their problems cannot be paired")
            ids = [i for i in base_cfg["datasets"][task]["problem_ids"] if i in set(cfg["datasets"][task]["problem_ids"])]
            a = problem_scores(task, ids, base_grouped[task], equivalence)
            b = problem_scores(task, ids, grouped[task], equivalence)
            common = [i for i in a.ids if i in set(b.ids)]
            if not common:
                comparison["tasks"][task] = {"problems": 0}
                continue
            ia = [a.ids.index(i) for i in common]
            ib = [b.ids.index(i) for i in common]
            entry = {"problems": len(common)}
            for metric, va, vb in (
                ("avg@n", np.asarray(a.correct, float)[ia] / np.asarray(a.n)[ia],
                 np.asarray(b.correct, float)[ib] / np.asarray(b.n)[ib]),
                ("maj@n", np.asarray(a.maj)[ia], np.asarray(b.maj)[ib]),
            ):
                entry[metric] = _paired_entry(va, vb, resamples, seed)
                pooled[metric][0].extend(va)
                pooled[metric][1].extend(vb)
            if a.answer_type in choice_metrics.STRUCTURED and a.answer_type == b.answer_type:
                entry.update(_structured_compare(a, b, ia, ib, resamples, seed))
            comparison["tasks"][task] = entry
        if len(shared) > 1 and pooled["avg@n"][0]:
            # e.g. ``aime``: AIME24 and AIME25 problems pooled, as in the run's combined row
            comparison["tasks"]["+".join(shared)] = {
                "problems": len(pooled["avg@n"][0]),
                **{m: _paired_entry(np.asarray(va), np.asarray(vb), resamples, seed) for m, (va, vb) in pooled.items()}}
        out["comparisons"].append(comparison)
    return out


def _structured_compare(a: ProblemScores, b: ProblemScores, ia: list, ib: list, resamples: int, seed: int) -> dict:
    """Paired differences of the choice/ranking metrics: by problem, and pair consistency by pair id."""
    out = {}
    va = choice_metrics.problem_vectors([a.samples[i] for i in ia], a.answer_type)
    vb = choice_metrics.problem_vectors([b.samples[i] for i in ib], b.answer_type)
    for metric in va:
        out[metric] = _paired_entry(va[metric], vb[metric], resamples, seed)
    pa, _ = choice_metrics.pair_members(a.ids, a.samples)
    pb, _ = choice_metrics.pair_members(b.ids, b.samples)
    shared = [p for p in pa if p[0] in {q[0] for q in pb}]
    if shared:
        qb = {q[0]: q for q in pb}
        pva = choice_metrics.pair_vectors(a.samples, a.maj, shared, a.answer_type)
        pvb = choice_metrics.pair_vectors(b.samples, b.maj, [qb[p[0]] for p in shared], b.answer_type)
        out["pairs"] = len(shared)
        for metric in pva:
            out[metric] = _paired_entry(pva[metric], pvb[metric], resamples, seed)
    return out


def _paired_entry(va: np.ndarray, vb: np.ndarray, resamples: int, seed: int) -> dict:
    d = paired_difference(vb, va, n_resamples=resamples, seed=seed)
    return {"baseline": float(va.mean()), "run": float(vb.mean()), "difference": d.mean,
            "ci95": [d.low, d.high], "distinguishable": d.distinguishable,
            "run_better_problems": d.a_better, "baseline_better_problems": d.b_better}


def render_compare_markdown(result: dict) -> str:
    lines = [f"# evalkit compare (baseline: {result['baseline']})", "",
             "Difference = run - baseline in points, paired by problem, bootstrap 95% interval over problems "
             f"({result['bootstrap_resamples']} resamples). A difference is distinguishable from noise when its "
             "interval excludes 0.", "",
             "| run | task | problems | metric | baseline | run | difference [95% CI] | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for comp in result["comparisons"]:
        for task, entry in comp["tasks"].items():
            if not entry.get("problems"):
                lines.append(f"| {comp['run']} | {task} | 0 | - | - | - | - | no shared problems |")
                continue
            for metric in [k for k, v in entry.items() if isinstance(v, dict) and "difference" in v]:
                m = entry[metric]
                lo, hi = m["ci95"]
                verdict = "distinguishable" if m["distinguishable"] else "within noise"
                lines.append(f"| {comp['run']} | {task} | {entry['problems']} | {metric} | {100 * m['baseline']:.1f} | "
                             f"{100 * m['run']:.1f} | {100 * m['difference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] | "
                             f"{verdict} |")
    for comp in result["comparisons"]:
        differs = comp.get("grading_differs")
        if differs:
            lines += ["", f"**Note**: {comp['run']} was graded with require_anchor={differs['run_require_anchor']}, "
                      f"the baseline with require_anchor={differs['baseline_require_anchor']}: answers without "
                      "an anchor count in one and not the other, so part of the difference is the grading "
                      "(docs/evalkit.md, `--require-anchor`)."]
    return "\n".join(lines) + "\n"
