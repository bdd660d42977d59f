"""Metrics of choice and ranking tasks beyond accuracy: pick accuracy of rankings, rank correlation,
parse failures, and the consistency of flipped pairs.

Every metric is a per-problem (or per-pair) score averaged over problems (pairs), with the same
percentile bootstrap over problems (pairs) as :mod:`.metrics`; so :func:`.report.compare_runs`
pairs them by problem (pair) like avg@n.

* ``top1@n`` -- a ranking's pick (its first place) is the gold's, averaged over samples: the
  *selection accuracy* of a ranking task (for a choice task it is avg@n itself).
* ``rank_correlation`` -- mean Kendall's tau of a sample's ranking against the gold
  (:func:`rlhf_ext.rewards.choice.kendall_tau`, Kendall 1938); a sample whose ranking could not be
  read counts as 0, the expected tau of a random order, so that failing to answer never scores
  better than guessing. Read it with ``parse_failure_rate``.
* ``parse_failure_rate`` -- samples whose final answer could not be read (unparseable, ambiguous,
  invalid), and ``truncation`` -- samples cut off by ``--max-tokens``, each with its interval.
* Pair consistency over problems sharing a ``pair_id`` (a question and its flipped twin, whose right
  answer flips too): ``both@n`` -- the probability that one sample of each is right, estimated over
  the samples paired by index (sample i of both; independent seeds, so each index is an independent
  draw of both); ``both_all@n`` -- every one of the n samples of both is right (1/0 per pair);
  ``both_maj@n`` -- the majority answer of each is right (the product of their maj@n scores, which
  split ties). A model that always picks the same position or the same option gets at most one of a
  pair right, whatever its accuracy. For rankings the same is reported for the pick (``both_top1@n``).
  A ``pair_id`` shared by other than exactly two problems is counted in ``unpaired_problems``.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from .metrics import bootstrap_ci, bootstrap_indices

STRUCTURED = ("choice", "ranking")


def answer_type_of(recs_by_problem: Sequence[Sequence[dict]]) -> str:
    """The answer type of a task from its records (``math`` for records without one)."""
    for recs in recs_by_problem:
        for r in recs:
            return r.get("answer_type") or "math"
    return "math"


def problem_vectors(samples: Sequence[Sequence[dict]], answer_type: str) -> Dict[str, np.ndarray]:
    """Per-problem scores of a choice/ranking task, one entry per problem (records sorted by sample index)."""
    out = {
        "parse_failure_rate": np.array([np.mean([r.get("parse_status") != "ok" for r in recs]) for recs in samples]),
        "truncation": np.array([np.mean([bool(r.get("truncated")) for r in recs]) for recs in samples]),
    }
    if answer_type == "ranking":
        out["top1@n"] = np.array([np.mean([bool(r.get("top1_correct")) for r in recs]) for recs in samples])
        out["rank_correlation"] = np.array([np.mean([float(r["rank_tau"]) if r.get("rank_tau") is not None else 0.0
                                                     for r in recs]) for recs in samples])
    return out


def pair_members(ids: Sequence[str], samples: Sequence[Sequence[dict]]) -> tuple[List[tuple], int]:
    """``([(pair_id, index_a, index_b), ...], unpaired)``: problems (by position) sharing a pair id, in
    order of first appearance; ``unpaired``: problems with a pair id shared by other than two problems."""
    groups: Dict[str, List[int]] = {}
    for i, recs in enumerate(samples):
        pid = next((r.get("pair_id") for r in recs if r.get("pair_id") is not None), None)
        if pid is not None:
            groups.setdefault(str(pid), []).append(i)
    pairs = [(pid, m[0], m[1]) for pid, m in groups.items() if len(m) == 2]
    unpaired = sum(len(m) for m in groups.values() if len(m) != 2)
    return pairs, unpaired


def _both_by_index(a: Sequence[dict], b: Sequence[dict], field: str) -> float:
    by_a = {int(r["sample_index"]): bool(r[field]) for r in a}
    by_b = {int(r["sample_index"]): bool(r[field]) for r in b}
    common = sorted(set(by_a) & set(by_b))
    if not common:
        return 0.0
    return float(np.mean([by_a[i] and by_b[i] for i in common]))


def pair_vectors(samples: Sequence[Sequence[dict]], maj: Sequence[float], pairs: Sequence[tuple],
                 answer_type: str) -> Dict[str, np.ndarray]:
    """Per-pair consistency scores (see the module docstring), one entry per pair of ``pairs``."""
    out = {
        "both@n": np.array([_both_by_index(samples[a], samples[b], "correct") for _, a, b in pairs]),
        "both_all@n": np.array([float(all(r["correct"] for r in samples[a]) and all(r["correct"] for r in samples[b]))
                                for _, a, b in pairs]),
        "both_maj@n": np.array([float(maj[a]) * float(maj[b]) for _, a, b in pairs]),
    }
    if answer_type == "ranking":
        out["both_top1@n"] = np.array([_both_by_index(samples[a], samples[b], "top1_correct") for _, a, b in pairs])
    return out


def _metric(values: np.ndarray, indices: np.ndarray) -> dict:
    low, high = bootstrap_ci(values, indices=indices)
    return {"value": float(values.mean()), "ci95": [low, high]}


def structured_summary(ids: Sequence[str], samples: Sequence[Sequence[dict]], maj: Sequence[float],
                       answer_type: str, indices: np.ndarray, resamples: int, seed: int) -> dict:
    """The summary entries of a choice/ranking task (added to the math ones: avg@n, pass@k, maj@n)."""
    out: dict = {"answer_type": answer_type}
    for name, values in problem_vectors(samples, answer_type).items():
        out[name] = _metric(values, indices)
    outcomes: Dict[str, int] = {}
    for recs in samples:
        for r in recs:
            outcomes[r.get("parse_status", "unknown")] = outcomes.get(r.get("parse_status", "unknown"), 0) + 1
    out["parse_outcomes"] = dict(sorted(outcomes.items()))
    out["shuffled_options"] = any("option_map" in r for recs in samples for r in recs)
    pairs, unpaired = pair_members(ids, samples)
    if pairs or unpaired:
        entry: dict = {"pairs": len(pairs), "unpaired_problems": unpaired}
        if pairs:
            pair_idx = bootstrap_indices(len(pairs), resamples, seed)
            for name, values in pair_vectors(samples, maj, pairs, answer_type).items():
                entry[name] = _metric(values, pair_idx)
        out["pair_consistency"] = entry
    return out
