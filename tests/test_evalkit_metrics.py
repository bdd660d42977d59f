"""evalkit statistics against brute force: pass@k by enumerating k-subsets, maj@n ties, bootstrap."""

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.evalkit.metrics import (bootstrap_ci, bootstrap_indices, majority_vote, paired_difference, pass_at_k,
                                      pass_k_values, percentile)


def brute_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (c correct) holding at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(1 for s in subsets if any(samples[i] for i in s))
    return Fraction(hits, len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration_of_all_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_computed():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(64, 0, 64) == 0.0
    assert pass_at_k(64, 1, 64) == 1.0


def test_pass_at_k_large_n_matches_exact_binomials():
    for n, c, k in [(1024, 3, 10), (1024, 500, 512), (200, 1, 1), (64, 7, 32)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_1_is_accuracy_and_pass_at_k_grows_with_k(nc):
    n, c = nc
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
    assert all(0.0 <= v <= 1.0 for v in values)


@pytest.mark.parametrize("args", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5), (0, 0, 1), (4.0, 2, 1), (4, True, 1)])
def test_pass_at_k_rejects_bad_input(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)


def test_pass_k_values():
    assert pass_k_values(64) == [1, 2, 4, 8, 16, 32, 64]
    assert pass_k_values(6) == [1, 2, 4, 6]
    assert pass_k_values(1) == [1]
    with pytest.raises(ValueError):
        pass_k_values(0)


def test_majority_vote_plain_majority():
    assert majority_vote(["5", "5", "3"], [True, True, False]) == 1.0
    assert majority_vote(["5", "3", "3"], [True, False, False]) == 0.0


def test_majority_vote_tie_splits_credit():
    # two answers with two votes each, one of them right: expected score of a random tie-break
    assert majority_vote(["a", "b", "a", "b"], [True, False, True, False]) == 0.5
    # three-way tie, one right
    assert majority_vote(["x", "y", "z"], [False, True, False]) == pytest.approx(1 / 3)
    # a tie among wrong answers only
    assert majority_vote(["x", "y", "z", "z", "y"], [True, False, False, False, False]) == 0.0


def test_majority_vote_abstentions():
    assert majority_vote([None, None, None], [False, False, False]) == 0.0
    assert majority_vote([], []) == 0.0
    # one vote beats any number of unparsed answers
    assert majority_vote([None, None, "7"], [False, False, True]) == 1.0


def test_majority_vote_length_mismatch():
    with pytest.raises(ValueError, match="2 answers but 1"):
        majority_vote(["a", "b"], [True])


def brute_majority(answers, correct):
    """Expected score when ties are broken uniformly at random, by enumerating the tie-breaks."""
    votes = {}
    for a in answers:
        if a is not None:
            votes[a] = votes.get(a, 0) + 1
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [a for a in votes if votes[a] == top]
    return sum(next(ok for a2, ok in zip(answers, correct) if a2 == w) for w in winners) / len(winners)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=12), st.randoms())
def test_majority_vote_matches_brute_force_and_ignores_order(answers, rnd):
    truth = {"1": True, "2": False, "3": False, None: False}
    correct = [truth[a] for a in answers]
    expected = brute_majority(answers, correct)
    assert majority_vote(answers, correct) == pytest.approx(expected)
    order = list(range(len(answers)))
    rnd.shuffle(order)
    assert majority_vote([answers[i] for i in order], [correct[i] for i in order]) == pytest.approx(expected)


def test_bootstrap_reproducible_with_seed_and_seed_matters():
    rng = np.random.default_rng(1)
    x = rng.random(40)
    a = bootstrap_ci(x, seed=7)
    b = bootstrap_ci(x, seed=7)
    c = bootstrap_ci(x, seed=8)
    assert a == b
    assert a != c
    assert a[0] < x.mean() < a[1]


def test_bootstrap_interval_matches_exact_resampling_distribution():
    # values [0, 0, 1]: the resampled mean is k/3 with k ~ Binomial(3, 1/3); P(mean = 1) = 1/27 > 2.5%,
    # P(mean = 0) = 8/27 > 2.5%, so the exact 95% percentile interval is [0, 1].
    assert bootstrap_ci([0.0, 0.0, 1.0], n_resamples=20000, seed=0) == (0.0, 1.0)
    # 40 values: the bootstrap distribution of the mean is close to normal with sd = s/sqrt(n)
    x = np.array([1.0] * 12 + [0.0] * 28)
    lo, hi = bootstrap_ci(x, n_resamples=20000, seed=0)
    half = 1.96 * x.std() / math.sqrt(len(x))
    assert lo == pytest.approx(x.mean() - half, abs=0.03)
    assert hi == pytest.approx(x.mean() + half, abs=0.03)


def test_bootstrap_constant_values_and_shared_indices():
    assert bootstrap_ci([0.25] * 10) == (0.25, 0.25)
    idx = bootstrap_indices(5, 300, seed=3)
    assert idx.shape == (300, 5) and idx.min() >= 0 and idx.max() <= 4
    x = np.arange(5.0)
    assert bootstrap_ci(x, indices=idx) == bootstrap_ci(x, n_resamples=300, seed=3)


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [float("nan"), 1.0]])
def test_bootstrap_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        bootstrap_ci(bad)


def test_bootstrap_rejects_bad_confidence_and_indices():
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="do not match"):
        bootstrap_ci([1.0, 2.0], indices=bootstrap_indices(3, 10))


def test_paired_difference_identical_runs_are_within_noise():
    x = [0.0, 0.5, 1.0, 0.25]
    d = paired_difference(x, x)
    assert (d.mean, d.low, d.high) == (0.0, 0.0, 0.0)
    assert not d.distinguishable
    assert (d.a_better, d.b_better) == (0, 0)


def test_paired_difference_consistent_gain_is_distinguishable():
    base = np.linspace(0.0, 0.75, 20)
    better = base + 0.25
    d = paired_difference(better, base)
    assert d.mean == pytest.approx(0.25)
    assert d.low == pytest.approx(0.25) and d.high == pytest.approx(0.25)
    assert d.distinguishable and d.a_better == 20


def test_paired_difference_pairing_beats_unpaired_noise():
    # Problems vary wildly in difficulty, the run gains a little on each: pairing sees it.
    rnd = random.Random(0)
    base = [rnd.random() * 0.9 for _ in range(30)]
    run = [b + 0.05 for b in base]
    d = paired_difference(run, base)
    assert d.distinguishable
    # ...while a mix of gains and losses of the same size is not distinguishable
    run2 = [b + (0.05 if i % 2 else -0.05) for i, b in enumerate(base)]
    assert not paired_difference(run2, base).distinguishable


def test_paired_difference_needs_pairs():
    with pytest.raises(ValueError, match="pair them by problem"):
        paired_difference([1.0, 2.0], [1.0])


def test_percentile():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 90) == 10.0
