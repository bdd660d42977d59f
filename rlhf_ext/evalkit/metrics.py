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
* Percentile bootstrap -- Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13;
  paired comparison by resampling problems, as in Dror et al. 2018 ("The Hitchhiker's Guide to
  Testing Statistical Significance in NLP", ACL).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al. 2021).

    ``1 - C(n-c, k) / C(n, k)``, the probability that a uniformly drawn k-subset of the n samples
    holds at least one correct one; computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` so large n
    never overflows.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"pass_at_k: {name} must be an integer, got {value!r}")
    if n < 1:
        raise ValueError(f"pass_at_k: n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


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

