"""Advantage estimators: hand-computed cases, invariants, and bad input."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.algorithms import (
    available_advantages,
    dr_grpo,
    get_advantage,
    grpo,
    maxrl,
    passk,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    whiten,
)

T = torch.tensor


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_all_mission_estimators_registered():
    names = set(available_advantages())
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "passk", "maxrl"} <= names
    assert get_advantage("grpo") is grpo


# ---- grpo ---------------------------------------------------------------------------------

def test_grpo_hand_computed():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) -> +-0.5/0.57735 = +-0.866025
    a = grpo(T([[1.0, 0.0, 0.0, 1.0]]))
    assert close(a, [[0.866025, -0.866025, -0.866025, 0.866025]])
    # group [3, 1]: mean 2, unbiased std sqrt(2) -> +-1/1.41421
    a = grpo(T([[3.0, 1.0]]), eps=0.0)
    assert close(a, [[1 / math.sqrt(2), -1 / math.sqrt(2)]])


def test_grpo_eps_is_added_to_std():
    a = grpo(T([[3.0, 1.0]]), eps=1.0)
    assert close(a, [[1 / (math.sqrt(2) + 1), -1 / (math.sqrt(2) + 1)]])


def test_grpo_zero_variance_group_is_zero_not_nan():
    for eps in (1e-6, 0.0):
        a = grpo(T([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]]), eps=eps)
        assert torch.isfinite(a).all()
        assert torch.equal(a[0], torch.zeros(3))
        assert close(a[1], [-1.0, 0.0, 1.0], tol=1e-5)


def test_grpo_batch_and_none_scopes():
    s = T([[1.0, 0.0], [4.0, 0.0]])
    batch_std = s.flatten().std(unbiased=True)  # of [1, 0, 4, 0]
    a = grpo(s, std_scope="batch", eps=0.0)
    assert close(a, [[0.5 / batch_std, -0.5 / batch_std], [2 / batch_std, -2 / batch_std]])
    assert close(grpo(s, std_scope="none"), dr_grpo(s))
    with pytest.raises(ValueError, match="std_scope"):
        grpo(s, std_scope="global")


# ---- group-centred estimators ------------------------------------------------------------

def test_dr_grpo_hand_computed():
    assert close(dr_grpo(T([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]])), [[0.5, -0.5, -0.5, 0.5], [1, -1, 0, 0]])


def test_rloo_hand_computed():
    # r=1 with others [0, 0]: 1 - 0 = 1; r=0 with others [1, 0]: 0 - 0.5 = -0.5
    assert close(rloo(T([[1.0, 0.0, 0.0]])), [[1.0, -0.5, -0.5]])
    # equals N/(N-1) (r - mean)
    s = T([[0.3, 0.9, 0.1, 0.5]])
    assert close(rloo(s), 4 / 3 * (s - s.mean()))


def test_reinforce_pp_family():
    s = T([[1.0, 0.0, 0.5]])
    assert torch.equal(reinforce_pp(s), s)
    assert reinforce_pp(s) is not s  # callers may edit it in place
    assert torch.equal(reinforce_pp(T([[2.0], [3.0]])), T([[2.0], [3.0]]))  # groups of one are fine
    assert close(reinforce_pp_baseline(s), [[0.5, -0.5, 0.0]])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda p: st.integers(2, 6).flatmap(
            lambda n: st.lists(st.lists(st.floats(-5, 5), min_size=n, max_size=n), min_size=p, max_size=p)
        )
    )
)
def test_centred_estimators_sum_to_zero_per_group(rows):
    s = T(rows, dtype=torch.float64)
    for fn in (rloo, dr_grpo, reinforce_pp_baseline):
        assert close(fn(s).sum(dim=1), torch.zeros(s.shape[0]), tol=1e-9)


# ---- passk --------------------------------------------------------------------------------

def test_passk_reference_case():
    # Pass@k Training (arXiv 2508.10751), its analytic advantages: N=8, c=2, k=4 -> A_pos = 0.522, A_neg = -0.174
    a = passk(T([[1.0, 1, 0, 0, 0, 0, 0, 0]]), k=4)
    assert abs(a[0, 0].item() - 0.522) < 5e-4
    assert abs(a[0, 2].item() + 0.174) < 5e-4
    # exact values: R = 1 - 15/70, sigma = sqrt(R(1-R)), A_neg uses C(5,3)/C(7,3) = 10/35
    R = 1 - 15 / 70
    sigma = math.sqrt(R * (1 - R))
    assert close(a[0, 0], (1 - R) / (sigma + 1e-6), tol=1e-6)
    assert close(a[0, 7], (1 - R - 10 / 35) / (sigma + 1e-6), tol=1e-6)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_passk_invariants(case):
    n, c, k = case
    row = [1.0] * c + [0.0] * (n - c)
    a = passk(T([row], dtype=torch.float64), k=k)[0]
    n_neg = n - c
    # per-group sum of advantages is zero
    assert abs(a.sum().item()) < 1e-6
    if n_neg < k or c == 0:
        assert torch.equal(a, torch.zeros(n, dtype=torch.float64))
    else:
        assert (a[:c] > 0).all() and (a[c:] <= 0).all()
        # analytic values with exact binomials
        R = 1 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(R * (1 - R))
        assert close(a[0], (1 - R) / (sigma + 1e-6), tol=1e-6)
        assert close(a[-1], (1 - R - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / (sigma + 1e-6), tol=1e-6)


def test_passk_k1_is_grpo_with_population_std():
    s = T([[1.0, 0, 0, 1, 1, 0, 0, 0], [0.0, 0, 0, 1, 0, 0, 0, 0]], dtype=torch.float64)
    pop_std = s.std(dim=1, unbiased=False, keepdim=True)
    expected = (s - s.mean(dim=1, keepdim=True)) / (pop_std + 1e-6)
    assert close(passk(s, k=1), expected, tol=1e-9)


def test_passk_large_groups_stay_finite():
    s = torch.zeros(1, 64)
    s[0, :3] = 1
    a = passk(s, k=32)
    assert torch.isfinite(a).all() and abs(a.sum().item()) < 1e-3


def test_passk_bad_input():
    s = T([[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="k=4 is larger than the group size N=3"):
        passk(s, k=4)
    with pytest.raises(ValueError, match="k is required"):
        passk(s)
    with pytest.raises(ValueError, match="positive integer"):
        passk(s, k=0)
    with pytest.raises(ValueError, match="binary"):
        passk(T([[1.0, 0.5, 0.0]]), k=2)


# ---- maxrl --------------------------------------------------------------------------------

def test_maxrl_hand_computed():
    # group [1, 0, 0, 0]: mean 1/4 -> (1 - .25)/.25 = 3, (0 - .25)/.25 = -1; all-fail -> 0
    a = maxrl(T([[1.0, 0, 0, 0], [0.0, 0, 0, 0], [1.0, 1, 1, 1], [1.0, 1, 0, 0]]))
    assert close(a, [[3, -1, -1, -1], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, -1, -1]])


def test_maxrl_is_mean_of_successes_gradient():
    # sum_i A_i g_i / N + sum_i g_i / N  ==  mean of g over successes (the ML gradient estimate)
    s = T([[1.0, 0, 1, 0, 0]], dtype=torch.float64)
    g = torch.randn(5, 3, dtype=torch.float64)
    a = maxrl(s)[0]
    est = (a[:, None] * g).mean(0) + g.mean(0)
    assert close(est, g[s[0] == 1].mean(0), tol=1e-9)


def test_maxrl_rejects_non_binary():
    with pytest.raises(ValueError, match="binary"):
        maxrl(T([[1.0, 0.2]]))


# ---- shared bad-input handling ------------------------------------------------------------

@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "passk", "maxrl"])
def test_group_estimators_reject_groups_of_one(name):
    with pytest.raises(ValueError, match="at least 2 samples per prompt"):
        get_advantage(name)(T([[1.0], [0.0]]), **({"k": 1} if name == "passk" else {}))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "passk", "maxrl"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_estimators_reject_non_finite(name, bad):
    s = T([[1.0, 0.0], [bad, 1.0]])
    with pytest.raises(ValueError, match="NaN|Inf"):
        get_advantage(name)(s, **({"k": 1} if name == "passk" else {}))


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2)])
def test_estimators_reject_wrong_rank(shape):
    with pytest.raises(ValueError, match="shape"):
        grpo(torch.zeros(shape))


def test_estimators_accept_lists_and_keep_dtype():
    assert grpo([[1, 0], [0, 1]]).dtype == torch.float32
    assert rloo(torch.tensor([[1.0, 0.0]], dtype=torch.float64)).dtype == torch.float64
    assert passk(torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16), k=1).dtype == torch.bfloat16


# ---- whiten -------------------------------------------------------------------------------

def test_whiten_hand_computed():
    v = T([[1.0, 3.0, 99.0], [5.0, 7.0, 99.0]])
    m = T([[1, 1, 0], [1, 1, 0]])
    out = whiten(v, m, eps=0.0)
    # masked values [1,3,5,7]: mean 4, population var 5
    assert close(out, [[-3 / math.sqrt(5), -1 / math.sqrt(5), 0], [1 / math.sqrt(5), 3 / math.sqrt(5), 0]])
    assert abs(out[m.bool()].mean().item()) < 1e-6
    assert abs(out[m.bool()].var(unbiased=False).item() - 1) < 1e-5
    scaled = whiten(v, m, eps=0.0, shift_mean=False)
    assert close(scaled[0, :2], T([1.0, 3.0]) / math.sqrt(5))


def test_whiten_bad_input():
    with pytest.raises(ValueError, match="no tokens"):
        whiten(torch.ones(2, 3), T([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="shape mismatch"):
        whiten(torch.ones(2, 3), torch.ones(2, 2))
    # NaN outside the mask is ignored (padding), inside it is an error
    v = T([[1.0, float("nan")], [2.0, 3.0]])
    assert torch.isfinite(whiten(v, T([[1, 0], [1, 1]]))).all()
    with pytest.raises(ValueError, match="NaN"):
        whiten(v, torch.ones(2, 2))
