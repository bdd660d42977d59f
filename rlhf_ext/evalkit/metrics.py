"""Evaluation statistics: unbiased pass@k, majority vote, bootstrap intervals, paired differences.

All functions are pure (numpy only) and work per problem; a benchmark score is the mean of the
per-problem scores, and its uncertainty is estimated by resampling problems, because problems,
not samples, are the scarce unit (30 AIME problems decide the score whatever n is).

Sources:

* pass@k -- the unbiased estimator of Chen et al. 2021, "Evaluating Large Language Models
  Trained on Code" (arXiv 2107.03374), eq. 1: ``1 - C(n-c, k) / C(n, k)`` per problem.
* avg@n -- the DeepSeek-R1 report's "pass@1" (arXiv 2501.12948, section 3.1): mean accuracy over
  the n samples of each problem, which equals pass@1 of the estimator above.
* maj@n (cons@n) -- self-consistency, Wang et al. 2022 (arXiv 2203.11171): vote over the
  final answers, equivalent answers counted together (their equivalence is the grader's, see
  :mod:`.voting`), then grade the winner.
* G-Pass@k_tau and mG-Pass@k -- Liu et al. 2024, "Are Your LLMs Capable of Stable Reasoning?"
  (arXiv 2412.13147), eqs. 3-4: the probability that at least ``ceil(tau * k)`` of k samples drawn
  without replacement from the n are correct (a hypergeometric tail), and its mean over
  ``tau`` in (0.5, 1]. lighteval's ``GPassAtK`` (``src/lighteval/metrics/metrics_sample.py``,
  v0.13.0) computes the same with ``scipy.stats.hypergeom``; see :func:`g_pass_at_k` for the one
  place it differs.
* Percentile bootstrap -- Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13;
  paired comparison by resampling problems, as in Dror et al. 2018 ("The Hitchhiker's Guide to
  Testing Statistical Significance in NLP", ACL).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, comb
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
# lighteval's default thresholds; tau = 0 is pass@k, tau = 1 asks all k samples to be right.
G_PASS_THRESHOLDS = (0.0, 0.25, 0.5, 0.75, 1.0)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al. 2021).

    ``1 - C(n-c, k) / C(n, k)``, the probability that a uniformly drawn k-subset of the n samples
    holds at least one correct one; computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` so large n
    never overflows.
    """
    _check_nck("pass_at_k", n, c, k)
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def _check_nck(who: str, n, c, k) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{who}: {name} must be an integer, got {value!r}")
    if n < 1:
        raise ValueError(f"{who}: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"{who}: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"{who}: k must be in [1, n={n}], got {k}")


def _at_least(n: int, c: int, k: int, m: int) -> float:
    """P(X >= m) for X ~ Hypergeometric(population n, c successes, k draws), in exact integers.

    ``sum_{j=m}^{min(c,k)} C(c, j) C(n-c, k-j) / C(n, k)``; Python's int / int division rounds the
    exact ratio once, so the result is the correctly rounded float whatever the size of the binomials.
    """
    m = max(m, 0)
    top = min(c, k)
    if m > top:
        return 0.0
    favourable = sum(comb(c, j) * comb(n - c, k - j) for j in range(m, top + 1))
    return favourable / comb(n, k)


def g_pass_threshold_count(k: int, tau: float) -> int:
    """m = max(ceil(tau * k), 1): how many of the k samples G-Pass@k_tau asks to be right.

    ``tau`` is read as the decimal it is written as (``repr``), so ``tau = 0.28, k = 25`` asks for 7.
    lighteval computes ``np.ceil(k * t)`` in floating point, where ``25 * 0.28`` is
    ``7.000000000000001`` and asks for 8; the two agree on its default thresholds (multiples of
    1/4, exact in binary) and differ only where ``tau * k`` is an integer that binary floats miss.
    """
    if isinstance(tau, bool) or not isinstance(tau, (int, float, np.floating, np.integer)) \
            or not np.isfinite(tau) or not 0.0 <= tau <= 1.0:
        raise ValueError(f"g_pass_at_k: tau must be a number in [0, 1], got {tau!r}")
    return max(ceil(Fraction(repr(float(tau))) * k), 1)


def g_pass_at_k(n: int, c: int, k: int, tau: float) -> float:
    """G-Pass@k_tau of one problem with ``c`` correct among ``n`` samples (arXiv 2412.13147, eq. 3).

    The probability that a uniformly drawn k-subset of the n samples holds at least
    ``m = max(ceil(tau * k), 1)`` correct ones (:func:`g_pass_threshold_count`):
    ``sum_{j=m}^{c} C(c, j) C(n-c, k-j) / C(n, k)``. ``tau = 0`` (m = 1) is :func:`pass_at_k`;
    ``k = 1`` is c / n for every tau.
    """
    _check_nck("g_pass_at_k", n, c, k)
    return _at_least(int(n), int(c), int(k), g_pass_threshold_count(int(k), tau))


def mg_pass_at_k(n: int, c: int, k: int) -> float:
    """mG-Pass@k of one problem (arXiv 2412.13147, eq. 4): G-Pass@k_tau averaged over tau in (0.5, 1].

    ``2 * integral_{0.5}^{1} G-Pass@k_tau d tau``, taken on the grid tau = i / k where G-Pass@k_tau
    steps: ``(2 / k) * sum_{i = ceil(k/2) + 1}^{k} P(X >= i)``, as the paper and lighteval sum it. It
    is 0 when c <= k / 2, and 1 when every sample is right and k is even (for odd k the grid holds
    (k - 1) / 2 steps, so it tops out at (k - 1) / k).
    """
    _check_nck("mg_pass_at_k", n, c, k)
    n, c, k = int(n), int(c), int(k)
    return 2.0 * sum(_at_least(n, c, k, i) for i in range((k + 1) // 2 + 1, k + 1)) / k


def pass_k_values(n: int) -> list[int]:
    """The k reported for n samples: 1, 2, 4, ... (powers of two up to n), and n itself."""
    if n < 1:
        raise ValueError(f"pass_k_values: n must be >= 1, got {n}")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    if ks[-1] != n:
        ks.append(n)
    return ks


def vote_order(counts: Mapping[Hashable, int]) -> List[Hashable]:
    """Answers by decreasing vote count, ties in string order: independent of sample order."""
    return sorted(counts, key=lambda a: (-counts[a], str(a)))


def cluster_answers(counts: Mapping[Hashable, int], same: Callable[[Hashable, Hashable], bool]
                    ) -> Dict[Hashable, Hashable]:
    """Map each answer to the representative of its group of equivalent answers.

    Answers are taken in :func:`vote_order`; each joins the first group whose representative (its
    most-voted answer) it is ``same`` as, else starts a group. ``same(rep, answer)`` need not be
    symmetric or transitive (math-verify's is neither, quite): the greedy order makes the grouping
    deterministic, and the most-voted spelling of an answer decides what else counts as it.
    """
    reps: List[Hashable] = []
    out: Dict[Hashable, Hashable] = {}
    for answer in vote_order(counts):
        rep = next((r for r in reps if same(r, answer)), None)
        if rep is None:
            reps.append(answer)
            rep = answer
        out[answer] = rep
    return out


def majority_vote(answers: Sequence[Optional[Hashable]], correct: Sequence[bool],
                  same: Optional[Callable[[Hashable, Hashable], bool]] = None) -> float:
    """maj@n score of one problem: vote over the final answers, then grade the winner.

    Rules (each chosen so the score does not depend on sample order):

    * a sample whose answer could not be extracted (``None``) abstains;
    * if nobody voted, the score is 0;
    * with ``same`` (an equivalence of answers, e.g. :meth:`.voting.AnswerEquivalence.for_problem`),
      equivalent answers pool their votes (:func:`cluster_answers`); without it, equal keys do;
    * the winner's grade is the mean of its voters' ``correct`` flags (all equal when grading is
      deterministic and the answers are identical);
    * a tie between several top answers splits the credit equally: the score is the mean grade of
      the tied answers, i.e. the expected score of breaking the tie uniformly at random.
    """
    if len(answers) != len(correct):
        raise ValueError(f"majority_vote: {len(answers)} answers but {len(correct)} correctness flags")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0.0
    if same is not None and len(votes) > 1:
        group = cluster_answers(votes, same)
        answers = [None if a is None else group[a] for a in answers]
        votes = Counter(a for a in answers if a is not None)
    top = max(votes.values())
    winners = [a for a, count in votes.items() if count == top]
    grade = {}
    for answer in winners:
        flags = [bool(ok) for a, ok in zip(answers, correct) if a == answer]
        grade[answer] = sum(flags) / len(flags)
    return float(sum(grade.values()) / len(winners))


def bootstrap_indices(n_items: int, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """``[n_resamples, n_items]`` indices drawn with replacement; shared by every metric of a task
    so their intervals come from the same resamples."""
    if n_items < 1:
        raise ValueError(f"bootstrap: need at least one problem, got {n_items}")
    if n_resamples < 1:
        raise ValueError(f"bootstrap: n_resamples must be >= 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_items, size=(n_resamples, n_items))


def bootstrap_ci(values, *, n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                 seed: int = 0, indices: Optional[np.ndarray] = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one value per problem).

    Reproducible: the same ``seed`` (or the same ``indices``) gives the same interval.
    """
    x = _as_vector(values, "bootstrap_ci")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap_ci: confidence must be in (0, 1), got {confidence}")
    if indices is None:
        indices = bootstrap_indices(len(x), n_resamples, seed)
    elif indices.ndim != 2 or indices.shape[1] != len(x):
        raise ValueError(f"bootstrap_ci: indices of shape {indices.shape} do not match {len(x)} values")
    means = x[indices].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of per-problem differences ``a - b`` with its bootstrap interval."""

    mean: float
    low: float
    high: float
    n_problems: int
    a_better: int  # problems where a scored higher
    b_better: int

    @property
    def distinguishable(self) -> bool:
        """True when the interval excludes 0: the difference is unlikely to be resampling noise."""
        return self.low > 0.0 or self.high < 0.0


def paired_difference(a, b, *, n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                      seed: int = 0) -> PairedDifference:
    """Paired bootstrap over problems of ``mean(a - b)``; ``a[i]`` and ``b[i]`` score the same problem.

    Pairing removes the between-problem variance (hard problems are hard for both runs), which
    is what makes small checkpoint-to-checkpoint differences measurable at all.
    """
    a = _as_vector(a, "paired_difference")
    b = _as_vector(b, "paired_difference")
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: {len(a)} scores for a but {len(b)} for b; pair them by problem")
    d = a - b
    low, high = bootstrap_ci(d, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return PairedDifference(mean=float(d.mean()), low=low, high=high, n_problems=len(d),
                            a_better=int((d > 0).sum()), b_better=int((d < 0).sum()))


def percentile(values, q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default) of a non-empty sequence."""
    x = _as_vector(values, "percentile")
    return float(np.percentile(x, q))


def _as_vector(values, who: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{who}: expected a non-empty 1-D sequence of numbers, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{who}: values must be finite")
    return x

