"""G-Pass@k_tau and mG-Pass@k (arXiv 2412.13147): hand-computed cases, the paper's hypergeometric
formula (scipy), lighteval 0.13's way of computing it, and the summary's bootstrap intervals."""

import math
import random

import numpy as np
import pytest
from scipy.stats import hypergeom

from rlhf_ext.evalkit.metrics import (G_PASS_THRESHOLDS, bootstrap_ci, bootstrap_indices, g_pass_at_k,
                                      g_pass_threshold_count, mg_pass_at_k, pass_at_k)
from rlhf_ext.evalkit.summary import render_markdown, summarize

from test_evalkit_report import make_config, three_problem_records


def lighteval_g_pass(n, c, k, t):
    """lighteval 0.13's GPassAtK (src/lighteval/metrics/metrics_sample.py), written out from its formula:
    m = max(int(np.ceil(k * t)), 1) in floats; 0 when m > min(c, k); else hypergeom.sf(m - 1, n, c, k)."""
    m = max(int(np.ceil(k * t)), 1)
    return 0.0 if m > min(c, k) else float(hypergeom.sf(m - 1, n, c, k))


def lighteval_mg_pass(n, c, k):
    """Its mG-Pass: (2 / k) * sum over i = ceil(k * 0.5) + 1 .. k of P(X >= i)."""
    total = 0.0
    for i in range(int(np.ceil(k * 0.5)) + 1, k + 1):
        total += 0.0 if i > min(c, k) else float(hypergeom.sf(i - 1, n, c, k))
    return 2 * total / k


def test_hand_computed_n4_c2_k2():
    # C(4,2) = 6 pairs, one of them holds both right samples.
    for tau in (0.0, 0.25, 0.5):  # m = 1: at least one right = pass@2 = 5/6
        assert g_pass_at_k(4, 2, 2, tau) == pytest.approx(5 / 6)
    for tau in (0.75, 1.0):  # m = 2: both right
        assert g_pass_at_k(4, 2, 2, tau) == pytest.approx(1 / 6)
    assert mg_pass_at_k(4, 2, 2) == pytest.approx(1 / 6)  # (2/2) * P(X >= 2)


def test_hand_computed_n5_c3_k4():
    # C(5,4) = 5 draws: X = 3 in C(3,3)C(2,1) = 2 of them, X = 2 in C(3,2)C(2,2) = 3.
    assert g_pass_at_k(5, 3, 4, 0.5) == pytest.approx(1.0)   # m = 2
    assert g_pass_at_k(5, 3, 4, 0.75) == pytest.approx(2 / 5)  # m = 3
    assert g_pass_at_k(5, 3, 4, 1.0) == 0.0                   # m = 4 > c
    assert mg_pass_at_k(5, 3, 4) == pytest.approx((2 / 4) * (2 / 5 + 0))  # i = 3, 4


def test_edges_and_identities():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 40)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert g_pass_at_k(n, c, k, 0.0) == pytest.approx(pass_at_k(n, c, k), abs=1e-12)
        assert g_pass_at_k(n, c, 1, rng.random()) == pytest.approx(c / n)
        values = [g_pass_at_k(n, c, k, t) for t in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)]
        assert all(a >= b - 1e-15 for a, b in zip(values, values[1:]))  # stricter tau, never more
        assert 0.0 <= mg_pass_at_k(n, c, k) <= g_pass_at_k(n, c, k, 0.5) + 1e-12
        if c <= k / 2:
            assert mg_pass_at_k(n, c, k) == 0.0
    assert g_pass_at_k(8, 8, 8, 1.0) == 1.0 and mg_pass_at_k(8, 8, 4) == 1.0
    assert mg_pass_at_k(9, 9, 3) == pytest.approx(2 / 3)  # odd k: (k-1)/k at most
    assert g_pass_at_k(8, 0, 3, 0.0) == 0.0


def test_matches_the_papers_hypergeometric_formula_on_random_inputs():
    rng = random.Random(1)
    for _ in range(500):
        n = rng.randint(1, 64)
        c, k = rng.randint(0, n), rng.randint(1, n)
        tau = rng.choice([*G_PASS_THRESHOLDS, rng.random()])
        m = max(math.ceil(tau * k), 1)
        # where tau * k sits within float error of an integer the paper's ceil is the decimal one
        if abs(tau * k - round(tau * k)) < 1e-9:
            m = max(round(tau * k), 1)
        assert g_pass_at_k(n, c, k, tau) == pytest.approx(float(hypergeom.sf(m - 1, n, c, k)), rel=1e-9, abs=1e-12)


def test_matches_lighteval_on_its_thresholds_and_large_n():
    # lighteval's AIME setting is n = 48, k = 16; its default thresholds are G_PASS_THRESHOLDS.
    cases = [(48, c, 16) for c in range(0, 49, 3)] + [(16, 5, 8), (64, 40, 32), (1024, 700, 64)]
    for n, c, k in cases:
        for t in G_PASS_THRESHOLDS:
            assert g_pass_at_k(n, c, k, t) == pytest.approx(lighteval_g_pass(n, c, k, t), rel=1e-9, abs=1e-12)
        assert mg_pass_at_k(n, c, k) == pytest.approx(lighteval_mg_pass(n, c, k), rel=1e-9, abs=1e-12)
    # One value pinned by hand: n=48, c=20, k=16, tau=0.5 -> P(X >= 8) = 0.30128835102224...
    assert g_pass_at_k(48, 20, 16, 0.5) == pytest.approx(0.3012883510222427, rel=1e-12)


def test_threshold_read_as_written_where_lighteval_floats_round_up():
    assert g_pass_threshold_count(25, 0.28) == 7  # 25 * 0.28 = 7.000000000000001 in floats
    assert int(np.ceil(25 * 0.28)) == 8           # lighteval asks for 8 of 25 there
    assert g_pass_at_k(40, 14, 25, 0.28) == pytest.approx(float(hypergeom.sf(6, 40, 14, 25)))
    assert g_pass_at_k(40, 14, 25, 0.28) > lighteval_g_pass(40, 14, 25, 0.28)
    assert g_pass_threshold_count(10, 0.1) == 1 and g_pass_threshold_count(3, 0.7) == 3
    assert g_pass_threshold_count(16, 0.0) == 1


@pytest.mark.parametrize("args, match", [
    ((4, 5, 2, 0.5), "c must be in"), ((4, 2, 5, 0.5), "k must be in"), ((0, 0, 1, 0.5), "n must be >= 1"),
    ((4, 2, 2, 1.5), "tau must be a number in"), ((4, 2, 2, float("nan")), "tau must be"),
    ((4, 2, 2, True), "tau must be"), ((4.0, 2, 2, 0.5), "n must be an integer"),
])
def test_bad_input_names_the_cause(args, match):
    with pytest.raises(ValueError, match=match):
        g_pass_at_k(*args)


def test_summary_reports_g_pass_with_bootstrap_intervals():
    cfg = make_config(["math500"], 4, {"math500": ["p1", "p2", "p3"]})
    s = summarize(three_problem_records(), cfg)  # per problem c = 4, 2, 0 of n = 4
    t = s["tasks"]["math500"]
    assert set(t["g-pass@k"]) == {"2", "4"} and set(t["mg-pass@k"]) == {"2", "4"}
    assert set(t["g-pass@k"]["2"]) == {str(x) for x in G_PASS_THRESHOLDS}
    # k = 2: p1 always 1; p2 (c = 2 of 4) 5/6 for tau <= 0.5 and 1/6 above; p3 0
    assert t["g-pass@k"]["2"]["0.5"]["value"] == pytest.approx((1 + 5 / 6) / 3)
    assert t["g-pass@k"]["2"]["1.0"]["value"] == pytest.approx((1 + 1 / 6) / 3)
    assert t["g-pass@k"]["2"]["0.0"]["value"] == pytest.approx(t["pass@k"]["2"]["value"])
    assert t["mg-pass@k"]["2"]["value"] == pytest.approx((1 + 1 / 6) / 3)
    # k = n = 4: all four drawn, so G-Pass is whether c >= m
    assert t["g-pass@k"]["4"]["0.5"]["value"] == pytest.approx(2 / 3)
    assert t["g-pass@k"]["4"]["0.75"]["value"] == pytest.approx(1 / 3)
    # the interval is the same percentile bootstrap over problems as the other metrics
    per_problem = np.array([1.0, 1 / 6, 0.0])
    idx = bootstrap_indices(3, 1000, 0)
    assert t["g-pass@k"]["2"]["1.0"]["ci95"] == pytest.approx(list(bootstrap_ci(per_problem, indices=idx)))
    lo, hi = t["mg-pass@k"]["2"]["ci95"]
    assert 0.0 <= lo <= t["mg-pass@k"]["2"]["value"] <= hi <= 1.0
    md = render_markdown(s)
    assert "| task | k | G-Pass@k 0.5 | G-Pass@k 0.75 | G-Pass@k 1.0 | mG-Pass@k |" in md
    assert "| math500 | 2 | 61.1 [" in md


def test_summary_leaves_g_pass_out_with_one_sample():
    cfg = make_config(["math500"], 1, {"math500": ["p1"]})
    s = summarize([three_problem_records()[0]], cfg)
    assert s["tasks"]["math500"]["g-pass@k"] == {} and "G-Pass" not in render_markdown(s)
