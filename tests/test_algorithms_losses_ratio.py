"""The losses of rlhf_ext.algorithms.ratio_losses: hand-computed cases, invariants, edge cases
(all-equal groups, one token, NaN padding, extreme ratios) and bad input.

Parity with verl 0.9.1 and TRL 1.16 is in tests/verl_env/test_verl_losses_parity.py (run in .venv-verl).
"""

import math

import pytest
import torch

from rlhf_ext.algorithms import LOSS_AGG_MODES, aggregate_loss, available_policy_losses, get_policy_loss, gspo

T = torch.tensor
LOG = math.log
NEW = ["cispo", "sapo", "gmpo", "geo_mean", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "luspo", "vespo"]


def grad_of(name, lp, old, adv, mask, mode="token-sum", **options):
    lp = lp.clone().requires_grad_(True)
    per_token, metrics = get_policy_loss(name)(lp, old, adv, mask, **options)
    (g,) = torch.autograd.grad(aggregate_loss(per_token, mask, mode) if mode != "token-sum" else per_token.sum(), lp)
    return per_token.detach(), g, metrics


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_registered_with_the_alias():
    assert set(NEW) <= set(available_policy_losses())
    assert get_policy_loss("geo_mean") is get_policy_loss("gmpo")


# ---- hand-computed ----------------------------------------------------------------------------

def test_cispo_clips_the_weight_and_keeps_every_token():
    lp, old = T([[LOG(1.5), LOG(0.5)]]), torch.zeros(1, 2)
    adv, mask = T([[1.0, -1.0]]), torch.ones(1, 2)
    loss, g, m = grad_of("cispo", lp, old, adv, mask, clip_ratio_high=0.2)
    assert close(loss, [[-1.2, 0.5]]) and close(g, [[-1.2, 0.5]])  # no lower bound: 0.5 stays
    loss, g, m = grad_of("cispo", lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert close(loss, [[-1.2, 0.8]]) and close(g, [[-1.2, 0.8]])  # both clipped, both still have a gradient
    assert m["clip_frac_low"] == 0.5 and m["clip_frac_high"] == 0.5


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (3.0, 0.5)])
def test_sapo_on_policy_is_the_policy_gradient(tau_pos, tau_neg):
    adv = T([[2.0, -1.0, 0.5]])
    loss, g, m = grad_of("sapo", torch.full((1, 3), -1.0), torch.full((1, 3), -1.0), adv, torch.ones(1, 3),
                         tau_pos=tau_pos, tau_neg=tau_neg)
    assert close(loss, [[-2 * 2.0 / tau_pos, 2 * 1.0 / tau_neg, -2 * 0.5 / tau_pos]])  # f(1) = 2 / tau
    assert close(g, -adv)  # f'(1) = 1
    assert close(m["gate_mean"], 1.0)


def test_sapo_gate_fades_far_from_one_and_faster_with_a_larger_tau():
    lp = T([[LOG(3.0)]])
    _, g_small, _ = grad_of("sapo", lp, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1), tau_neg=1.0)
    _, g_large, _ = grad_of("sapo", lp, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1), tau_neg=4.0)
    s = 1 / (1 + math.exp(-2.0))  # sigmoid(tau (r - 1)), tau = 1, r = 3
    assert close(g_small, [[4 * s * (1 - s) * 3.0]])
    assert 0 < g_large.item() < g_small.item()


def test_gmpo_clips_in_log_space_and_takes_the_geometric_mean():
    # one sequence, A = +1, log ratios 0.2 (clipped to 0.1) and -0.05: mean 0.025
    lp, old, adv, mask = T([[0.2, -0.05]]) - 1, torch.full((1, 2), -1.0), torch.ones(1, 2), torch.ones(1, 2)
    loss, g, m = grad_of("gmpo", lp, old, adv, mask, mode="seq-mean-token-mean", clip_ratio_low=0.1, clip_ratio_high=0.1)
    r = math.exp(0.025)
    assert close(loss, [[-r, -r]])
    assert close(g, [[0.0, -r / 2]])  # d/dlp_t of -exp(mean_t l_t): the clipped token has none
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0
    # A < 0: the pessimistic side keeps a large ratio unclipped
    loss, _, _ = grad_of("gmpo", T([[0.3]]), torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1),
                         clip_ratio_low=0.1, clip_ratio_high=0.1)
    assert close(loss, [[math.exp(0.3)]])


def test_gmpo_token_form_gradient_equals_the_sequence_objective():
    g = torch.Generator().manual_seed(0)
    mask = T([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    old = -torch.rand(2, 4, generator=g)
    lp = old + 0.2 * torch.randn(2, 4, generator=g)
    adv = T([[1.0], [-0.5]]).expand(2, 4)
    _, g_tok, _ = grad_of("gmpo", lp, old, adv, mask, mode="seq-mean-token-mean", clip_ratio_low=0.1, clip_ratio_high=0.1)
    x = lp.clone().requires_grad_(True)
    d = x - old
    sgn = torch.sign(adv)
    lt = sgn * torch.min(sgn * d, sgn * d.clamp(-0.1, 0.1))
    seq = torch.where(mask, lt, torch.zeros(())).sum(1) / mask.sum(1)
    objective = (-adv[:, 0] * torch.exp(seq)).mean()
    (g_seq,) = torch.autograd.grad(objective, x)
    assert close(g_tok, g_seq)


def test_dppo_tv_region_on_the_probability_difference():
    old = torch.full((1, 4), LOG(0.5))
    lp = torch.log(T([[0.8, 0.6, 0.2, 0.4]]))
    adv = T([[1.0, 1.0, -1.0, -1.0]])
    loss, g, m = grad_of("dppo_tv", lp, old, adv, torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.2)
    # +0.3 (A > 0) and -0.3 (A < 0) leave the region: no loss, no gradient; the others keep -A rho
    assert close(loss, [[0.0, -1.2, 0.0, 0.8]]) and close(g, [[0.0, -1.2, 0.0, 0.8]])
    assert m["clip_frac_high"] == 0.25 and m["clip_frac_low"] == 0.25
    # the IS weight is truncated at clip_ratio_c, without removing the token
    loss, g, m = grad_of("dppo_tv", lp, old, adv, torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.2,
                         clip_ratio_c=1.1)
    assert close(loss[0, 1], -1.1) and close(g[0, 1], -1.1) and m["is_trunc_frac"] == 0.25


def test_dppo_kl_region_on_the_binary_kl():
    old = torch.full((1, 3), LOG(0.5))
    lp = torch.log(T([[0.8, 0.01, 0.8]]))
    adv = T([[1.0, 1.0, -1.0]])
    bkl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # 0.2231
    loss, _, _ = grad_of("dppo_kl", lp, old, adv, torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=0.2)
    # token 0: KL 0.223 > 0.2 with A > 0 -> out; token 1: pi < pi_old, always in; token 2: A < 0 moving up, in
    assert close(loss, [[0.0, -0.02, 1.6]])
    loss, _, _ = grad_of("dppo_kl", lp, old, adv, torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=bkl + 1e-3)
    assert close(loss[0, 0], -1.6)


def _cov_inputs():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 8, generator=g) * 3
    lp = old + 0.05 * torch.randn(4, 8, generator=g)
    adv = (2 * torch.randn(4, 1, generator=g)).expand(4, 8)
    mask = torch.ones(4, 8, dtype=torch.bool)
    mask[1, 5:] = False
    return lp, old, adv, mask


def test_clip_cov_detaches_the_chosen_tokens_reproducibly():
    lp, old, adv, mask = _cov_inputs()
    opts = dict(clip_cov_ratio=0.1, clip_cov_lb=0.0, clip_cov_ub=10.0)
    loss1, g1, m1 = grad_of("clip_cov", lp, old, adv, mask, seed=5, **opts)
    loss2, g2, _ = grad_of("clip_cov", lp, old, adv, mask, seed=5, **opts)
    assert torch.equal(loss1, loss2) and torch.equal(g1, g2)
    ppo_loss, ppo_g, _ = grad_of("ppo", lp, old, adv, mask)
    chosen = (loss1 != ppo_loss) | (g1 != ppo_g)
    assert chosen.sum() == int(0.1 * mask.sum()) == 2  # max(1, int(ratio * tokens))
    assert (loss1[chosen] == 0).all() and (g1[chosen] == 0).all()
    assert m1["cov_clip_frac"] == pytest.approx(2 / mask.sum().item())
    # they are tokens with covariance in (lb, ub), never padding
    cov = (adv - adv[mask].mean()) * (lp - lp[mask].mean())
    assert (cov[chosen] > 0).all() and mask[chosen].all()
    # a generator advances: two calls on one generator draw differently (with many candidates)
    gen = torch.Generator().manual_seed(5)
    picks = [grad_of("clip_cov", lp, old, adv, mask, generator=gen, **opts)[0] for _ in range(4)]
    assert any(not torch.equal(picks[0], p) for p in picks[1:])
    # no candidate: plain PPO
    loss, _, m = grad_of("clip_cov", lp, old, adv, mask, clip_cov_lb=50.0, clip_cov_ub=60.0, seed=1)
    assert torch.equal(loss, ppo_loss) and m["cov_clip_frac"] == 0


def test_kl_cov_penalises_the_top_covariance_tokens():
    lp = T([[-1.0, -2.0, -0.5, -3.0]])
    old = lp - T([[0.1, -0.2, 0.3, 0.0]])
    adv = T([[1.0, -1.0, 2.0, 0.0]])
    # cov = (A - 0.5)(lp - (-1.625)): 0.3125, 0.5625, 1.6875, 0.6875 -> top-1 is token 2
    loss, g, m = grad_of("kl_cov", lp, old, adv, torch.ones(1, 4), kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    ratio = torch.exp(lp - old)
    want = -adv * ratio
    want[0, 2] += 0.5 * 0.3
    assert close(loss, want) and m["kl_cov_frac"] == 0.25
    assert close(g[0, 2], -2.0 * ratio[0, 2] + 0.5)


def test_luspo_is_gspo_scaled_by_length():
    g = torch.Generator().manual_seed(1)
    mask = T([[1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    old = -torch.rand(2, 4, generator=g)
    lp = old + 0.1 * torch.randn(2, 4, generator=g)
    adv = T([[1.0], [-1.0]]).expand(2, 4)
    lus, g_lus, _ = grad_of("luspo", lp, old, adv, mask, mode="seq-mean-token-mean", clip_ratio_low=0.02,
                            clip_ratio_high=0.03)
    x = lp.clone().requires_grad_(True)
    gs, _ = gspo(x, old, adv, mask, eps_low=0.02, eps_high=0.03)
    ref = aggregate_loss(gs, mask, "seq-mean-token-sum")
    (g_ref,) = torch.autograd.grad(ref, x)
    assert close(lus, gs.detach() * mask.sum(1, keepdim=True))
    assert close(g_lus, g_ref)


def test_vespo_weight_is_one_on_policy_and_gamma_shaped():
    adv, mask = T([[1.0, 1.0], [-1.0, -1.0]]), torch.ones(2, 2)
    loss, g, m = grad_of("vespo", torch.full((2, 2), -1.0), torch.full((2, 2), -1.0), adv, mask)
    assert close(loss, -adv) and close(g, -adv) and close(m["phi_mean"], 1.0)
    # w = k / lambda maximises phi: e^lambda (k / lambda)^k e^-k; defaults k_pos 2, lambda_pos 3
    w = 2 / 3
    lp = T([[LOG(w), 0.0]])
    loss, _, _ = grad_of("vespo", lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert close(loss, torch.full((1, 2), -math.exp(3) * w ** 2 * math.exp(-2)))
    # far off-policy the weight vanishes instead of exploding
    loss, _, _ = grad_of("vespo", T([[8.0, 8.0]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert loss.abs().max() < 1e-20


# ---- edge cases, every new loss ---------------------------------------------------------------

def _random(seed=0, B=4, Tn=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, Tn, generator=g) * 2
    lp = old + 0.3 * torch.randn(B, Tn, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, Tn).clone()
    mask = torch.arange(Tn)[None, :] < T([5, 2, 4, 1])[:, None]
    return lp, old, adv, mask


@pytest.mark.parametrize("name", NEW)
def test_nan_padding_counts_nowhere(name):
    lp, old, adv, mask = _random()
    lp, old, adv = (torch.where(mask, x, torch.full_like(x, float("nan"))) for x in (lp, old, adv))
    for mode in LOSS_AGG_MODES:
        per_token, g, metrics = grad_of(name, lp, old, adv, mask, mode=mode, **({"seed": 0} if name == "clip_cov" else {}))
        assert torch.isfinite(per_token).all() and (per_token[~mask] == 0).all()
        assert torch.isfinite(g).all() and (g[~mask] == 0).all() and g.abs().sum() > 0
        assert all(torch.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("name", NEW)
def test_single_token(name):
    per_token, g, _ = grad_of(name, T([[-0.7]]), T([[-0.7001]]), T([[1.5]]), T([[1]]))  # inside every clip range
    assert per_token.shape == (1, 1) and torch.isfinite(per_token).all() and torch.isfinite(g).all()
    assert g.item() != 0 or name == "clip_cov"  # clip_cov detaches its one selected token, when it is a candidate


@pytest.mark.parametrize("name", NEW)
def test_all_equal_group_has_no_policy_gradient(name):
    lp, old, _, mask = _random(seed=1)
    zero = torch.zeros_like(lp)
    per_token, g, metrics = grad_of(name, lp, old, zero, mask)
    if name == "kl_cov":
        # every covariance is 0: the top-k tokens still carry the KL penalty, and only that
        k = max(1, int(mask.sum().item() * 0.0002))
        assert ((per_token != 0) & mask).sum() <= k
        assert close(per_token.sum(), 0.1 * ((lp - old).abs() * (per_token != 0)).sum())
    else:
        assert (per_token == 0).all() and (g == 0).all()


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_ratios_stay_finite(name, sign):
    lp, old, adv, mask = _random(seed=2)
    old = lp - sign * 60.0 * mask  # log ratios of +-60 on the response tokens
    for mode in LOSS_AGG_MODES:
        per_token, g, metrics = grad_of(name, lp, old, adv, mask, mode=mode)
        assert torch.isfinite(per_token).all() and torch.isfinite(g).all(), (mode, per_token, g)
        assert all(torch.isfinite(v) for v in metrics.values()), metrics


@pytest.mark.parametrize("name", NEW)
def test_every_mode_reduces_the_same_per_token_loss(name):
    lp, old, adv, mask = _random(seed=3)
    per_token, _, _ = grad_of(name, lp, old, adv, mask, **({"seed": 0} if name == "clip_cov" else {}))
    for mode in LOSS_AGG_MODES:
        value = aggregate_loss(per_token, mask, mode)
        assert torch.isfinite(value)


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NEW)
def test_bad_input_is_named(name):
    fn = get_policy_loss(name)
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shape mismatch: advantages"):
        fn(x, x, torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="no tokens"):
        fn(x, x, x, T([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="Inf"):
        fn(x, T([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0]]), x, torch.ones(2, 3))


@pytest.mark.parametrize("name, options, message", [
    ("cispo", {"clip_ratio_low": 1.5}, "clip_ratio_low must be in"),
    ("cispo", {"clip_ratio_high": -1.0}, "clip_ratio_high must be >= 0"),
    ("sapo", {"tau_pos": 0.0}, "tau_pos must be a finite number > 0"),
    ("sapo", {"tau_neg": float("inf")}, "tau_neg must be a finite number > 0"),
    ("gmpo", {"clip_ratio_low": -0.1}, "clip_ratio_low must be in"),
    ("clip_cov", {"clip_cov_ratio": 0.0}, "clip_cov_ratio must be in"),
    ("clip_cov", {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_lb must be < clip_cov_ub"),
    ("kl_cov", {"kl_cov_ratio": 2.0}, "kl_cov_ratio must be in"),
    ("kl_cov", {"ppo_kl_coef": -1.0}, "ppo_kl_coef must be >= 0"),
    ("dppo_tv", {"clip_ratio_c": 0.0}, "clip_ratio_c must be a finite number > 0"),
    ("dppo_kl", {"clip_ratio_low": 0.0}, "clip_ratio_low must be a finite number > 0"),
    ("luspo", {"clip_ratio_low": 1.0}, "eps_low must be in"),
    ("vespo", {"vespo_k_pos": -1.0}, "vespo_k_pos must be a finite number >= 0"),
    ("vespo", {"vespo_lambda_neg": 0.0}, "vespo_lambda_neg must be a finite number > 0"),
])
def test_bad_options_are_named(name, options, message):
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=message):
        get_policy_loss(name)(x, x, x, torch.ones(1, 2), **options)
