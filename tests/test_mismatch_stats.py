"""Rollout-vs-training mismatch statistics (rlhf_ext.algorithms.mismatch): hand-computed cases and invariants."""

import math

import pytest
import torch

from rlhf_ext.algorithms import MISMATCH_METRICS, mismatch_stats
from rlhf_ext.algorithms.mismatch import exceeds_threshold

LOG = math.log


def approx(x, rel=1e-9, abs=1e-12):
    return pytest.approx(x, rel=rel, abs=abs)


def test_hand_computed_three_tokens():
    P, Q = [0.5, 0.2, 0.9], [0.4, 0.2, 0.8]
    s = mismatch_stats(torch.tensor([LOG(x) for x in P]), torch.tensor([LOG(x) for x in Q], dtype=torch.float64))
    # |P - Q| = 0.1, 0, 0.1
    assert s["probs_diff_mean"] == approx(0.2 / 3, rel=1e-6)
    assert s["probs_diff_max"] == approx(0.1, rel=1e-6)
    assert s["probs_diff_std"] == approx(math.sqrt(1 / 300), rel=1e-6)  # Bessel: sum of squares 1/150, / 2
    # centred P = (-1, -10, 11)/30, centred Q = (-2, -8, 10)/30
    corr = 192 / math.sqrt(222 * 168)
    assert s["probs_pearson_corr"] == approx(corr, rel=1e-6)
    assert s["probs_corr_loss_1e4"] == approx((1 - corr) * 1e4, rel=1e-4)
    # rho = P / Q = 1.25, 1, 1.125
    d = [LOG(1.25), 0.0, LOG(1.125)]
    assert s["logprobs_abs_diff_mean"] == approx(sum(d) / 3, rel=1e-6)
    assert s["logprobs_abs_diff_max"] == approx(LOG(1.25), rel=1e-6)
    assert s["logprobs_abs_diff_p99"] == approx(LOG(1.125) + 0.98 * (LOG(1.25) - LOG(1.125)), rel=1e-6)
    assert s["k1_kl"] == approx(-sum(d) / 3, rel=1e-6)
    assert s["k3_kl"] == approx(((0.25 - LOG(1.25)) + (0.125 - LOG(1.125))) / 3, rel=1e-5)
    assert s["chi2"] == approx((1.5625 + 1 + 1.265625) / 3 - 1, rel=1e-6)
    assert s["ess"] == approx(3.375**2 / (3 * 3.828125), rel=1e-6)
    assert s["tokens"] == 3.0
    assert set(s) == set(MISMATCH_METRICS)


def test_token_frequencies_give_the_exact_divergences():
    # Tokens appear with the rollout's own frequencies Q = (1/2, 1/4, 1/4): the token mean is then the
    # expectation under Q, so k3 is exactly KL(Q || P) and mean(rho^2) - 1 exactly chi^2(P || Q).
    Q = {0: 0.5, 1: 0.25, 2: 0.25}
    P = {0: 0.25, 1: 0.5, 2: 0.25}
    tokens = [0, 0, 1, 2]
    s = mismatch_stats(torch.tensor([LOG(P[t]) for t in tokens]), torch.tensor([LOG(Q[t]) for t in tokens]))
    kl_q_p = sum(Q[t] * LOG(Q[t] / P[t]) for t in Q)
    chi2_p_q = sum(P[t] ** 2 / Q[t] for t in Q) - 1
    assert kl_q_p == approx(0.25 * LOG(2))
    assert s["k1_kl"] == approx(kl_q_p, rel=1e-6)
    assert s["k3_kl"] == approx(kl_q_p, rel=1e-6)
    assert s["chi2"] == approx(chi2_p_q, rel=1e-6) and chi2_p_q == approx(0.375)
    assert s["ess"] == approx(4.0**2 / (4 * 5.5), rel=1e-6)  # rho = .5, .5, 2, 1: sum 4, sum of squares 5.5


def test_identical_engines_agree_perfectly():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(4, 7, 11), -1)[..., 0]
    s = mismatch_stats(lp, lp.clone())
    assert s["probs_diff_mean"] == 0 and s["probs_diff_max"] == 0 and s["probs_diff_std"] == 0
    assert s["logprobs_abs_diff_max"] == 0 and s["k1_kl"] == 0 and s["k3_kl"] == 0
    assert s["chi2"] == approx(0.0) and s["ess"] == approx(1.0)
    assert s["probs_pearson_corr"] == approx(1.0) and s["probs_corr_loss_1e4"] == approx(0.0, abs=1e-9)


def test_invariants_on_random_perturbations():
    torch.manual_seed(1)
    for scale in (1e-3, 1e-1, 1.0):
        q = torch.log_softmax(torch.randn(64, 50), -1).gather(1, torch.randint(0, 50, (64, 1))).squeeze(1)
        p = (q + scale * torch.randn(64)).clamp(max=0.0)
        s = mismatch_stats(p, q)
        assert s["k3_kl"] >= 0
        assert 0 < s["ess"] <= 1 + 1e-12
        assert -1 <= s["probs_pearson_corr"] <= 1
        assert s["probs_diff_mean"] <= s["probs_diff_max"] <= 1
        assert s["logprobs_abs_diff_mean"] <= s["logprobs_abs_diff_p99"] <= s["logprobs_abs_diff_max"]
        # Cauchy-Schwarz: mean(rho^2) >= mean(rho)^2, and ess = mean(rho)^2 / mean(rho^2)
        rho = (p.double() - q.double()).exp()
        assert s["ess"] == approx(float(rho.mean() ** 2 / (rho * rho).mean()), rel=1e-9)


def test_mismatch_grows_with_the_perturbation():
    torch.manual_seed(2)
    q = -torch.rand(1000)
    noise = torch.randn(1000)
    small = mismatch_stats((q + 1e-3 * noise).clamp(max=0), q)
    large = mismatch_stats((q + 1e-1 * noise).clamp(max=0), q)
    for key in ("probs_diff_mean", "logprobs_abs_diff_mean", "k3_kl", "chi2", "probs_corr_loss_1e4"):
        assert large[key] > small[key], key
    assert large["ess"] < small["ess"]


def test_mask_selects_response_tokens_and_ignores_padding_values():
    p = torch.tensor([[LOG(0.5), float("nan"), LOG(0.9)], [LOG(0.2), 0.0, float("nan")]])
    q = torch.tensor([[LOG(0.4), 123.0, LOG(0.8)], [LOG(0.2), 0.0, 7.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    s = mismatch_stats(p, q, mask)
    assert s["tokens"] == 3 and s["probs_diff_mean"] == approx(0.2 / 3, rel=1e-6)


def test_undefined_values_are_left_out():
    one = mismatch_stats(torch.tensor([LOG(0.5)]), torch.tensor([LOG(0.4)]))
    assert "probs_diff_std" not in one and "probs_pearson_corr" not in one
    assert one["probs_diff_mean"] == approx(0.1, rel=1e-6)
    constant = mismatch_stats(torch.tensor([LOG(0.5)] * 3), torch.tensor([LOG(0.5), LOG(0.4), LOG(0.3)]))
    assert "probs_pearson_corr" not in constant and "probs_diff_std" in constant
    assert mismatch_stats(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3)) == {"tokens": 0.0}


def test_zero_probability_is_extreme_not_an_error():
    s = mismatch_stats(torch.tensor([-math.inf, LOG(0.5), -math.inf]), torch.tensor([LOG(0.5), LOG(0.5), -math.inf]))
    assert s["probs_diff_max"] == approx(0.5, rel=1e-6)
    assert s["logprobs_abs_diff_max"] == math.inf
    # the log ratio is clamped to +-20 before exp (verl's bound), so the ratio statistics stay finite
    assert math.isfinite(s["k3_kl"]) and math.isfinite(s["chi2"]) and s["k3_kl"] > 5


@pytest.mark.parametrize("p, q, mask, message", [
    (torch.zeros(3), torch.zeros(4), None, "shape mismatch"),
    (torch.zeros(3), torch.zeros(3), torch.ones(2), "shape mismatch"),
    (torch.tensor([0.0, float("nan")]), torch.zeros(2), None, "1 from training, 0 from the rollout"),
    (torch.zeros(2), torch.tensor([float("nan")] * 2), None, "0 from training, 2 from the rollout"),
    (torch.zeros(2), torch.tensor([0.0, math.inf]), None, r"\+inf"),
])  # fmt: skip
def test_bad_input_is_named(p, q, mask, message):
    with pytest.raises(ValueError, match=message):
        mismatch_stats(p, q, mask)


def test_threshold():
    assert exceeds_threshold({"probs_diff_mean": 0.006})
    assert not exceeds_threshold({"probs_diff_mean": 0.005})
    assert not exceeds_threshold({"tokens": 0.0})
    assert exceeds_threshold({"probs_diff_mean": 0.002}, threshold=0.001)
