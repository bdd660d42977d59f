"""Issue 22's estimators, KL terms and masks, framework-free: hand-computed cases, invariants, edge cases.

Parity with verl 0.9.1 and TRL 1.16 is in tests/verl_env/test_verl_estimators_parity.py.
"""

import math

import pytest
import torch

from rlhf_ext.algorithms import (
    aggregate_loss,
    available_advantages,
    available_kl_estimators,
    gdpo,
    get_advantage,
    gpg,
    grpo,
    host_inputs,
    k3,
    k3_bias_corrected,
    k3_plus,
    kl_estimate,
    off_policy_sequence_mask,
    opo,
    passk_best,
    top_entropy_mask,
    truncated_completion_mask,
)

T = torch.tensor


def test_registered_under_their_names():
    assert {"gpg", "opo", "passk_best", "gdpo"} <= set(available_advantages())
    assert {"abs", "k3+"} <= set(available_kl_estimators())
    assert host_inputs(get_advantage("opo")) == ("lengths",)
    assert host_inputs(get_advantage("gdpo")) == ("components",)
    assert host_inputs(get_advantage("grpo")) == ()


def test_gpg_hand_computed():
    s = T([[1.0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0.5]])
    # paper: B = 12, samples in varied groups M = 8 -> alpha = 1.5; verl: 7 non-zero rewards -> 12/7
    torch.testing.assert_close(gpg(s)[0], T([0.75, -0.75, -0.75, 0.75]))
    torch.testing.assert_close(gpg(s, alpha_count="nonzero_reward")[0], 12 / 7 * T([0.5, -0.5, -0.5, 0.5]))
    torch.testing.assert_close(gpg(s, f_norm=2.0), gpg(s) / 2)
    assert torch.equal(gpg(s)[1], torch.zeros(4))  # all-equal group
    # no signal anywhere: advantage 0, not a division by zero
    assert torch.equal(gpg(torch.ones(2, 3)), torch.zeros(2, 3))
    assert torch.equal(gpg(torch.zeros(2, 3), alpha_count="nonzero_reward"), torch.zeros(2, 3))


def test_opo_hand_computed_and_invariants():
    s = T([[1.0, 0, 0, 1], [2, 2, 2, 2]])
    lengths = T([[1.0, 2, 3, 4], [5, 1, 1, 1]])
    b = (1 + 4) / 10
    torch.testing.assert_close(opo(s, lengths=lengths)[0], T([1 - b, -b, -b, 1 - b]))
    assert torch.equal(opo(s, lengths=lengths)[1], torch.zeros(4))
    # equal lengths: the plain group mean (Dr.GRPO); the length-weighted sum of A is 0
    torch.testing.assert_close(opo(s, lengths=torch.full_like(s, 7.0)), s - s.mean(1, keepdim=True))
    assert (opo(s, lengths=lengths) * lengths).sum(1).abs().max() < 1e-6


def test_passk_best_hand_computed():
    s = T([[0.0, 3, 1, 2], [1, 1, 0, 0], [5, 5, 5, 5]])
    std0 = s[0].std()
    torch.testing.assert_close(passk_best(s)[0], T([0.0, 1 / (std0 + 1e-6), 0, 0]))
    assert torch.equal(passk_best(s)[1], torch.zeros(4))  # tie for the best: r_max - r_second = 0
    assert torch.equal(passk_best(s)[2], torch.zeros(4))  # all-equal group
    torch.testing.assert_close(passk_best(s, norm_adv_by_std_in_grpo=False)[0], T([0.0, 1, 0, 0]))


def test_gdpo_normalises_each_component_then_sums():
    acc = T([[1.0, 0, 0, 1], [1, 1, 1, 1]])
    fmt = T([[1.0, 1, 1, 0], [0, 1, 0, 1]])
    out = gdpo(acc + 0.2 * fmt, components={"accuracy": acc, "format": fmt}, weights={"format": 0.5})
    torch.testing.assert_close(out, grpo(acc) + 0.5 * grpo(fmt))
    # unlike GRPO on the sum, the small-scale format term weighs as much as accuracy
    assert not torch.allclose(out, grpo(acc + 0.2 * fmt))
    torch.testing.assert_close(gdpo(acc, components={"a": acc}, norm_adv_by_std_in_grpo=False),
                               acc - acc.mean(1, keepdim=True))


def test_single_sample_groups_are_refused_clearly():
    one = torch.ones(3, 1)
    for fn, extra in ((gpg, {}), (passk_best, {}), (opo, {"lengths": one}), (gdpo, {"components": {"a": one}})):
        with pytest.raises(ValueError, match="needs at least 2 samples per prompt"):
            fn(one, **extra)


def test_missing_and_bad_host_inputs_are_clear_errors():
    s = T([[1.0, 0], [0, 1]])
    with pytest.raises(ValueError, match="opo needs lengths="):
        opo(s)
    with pytest.raises(ValueError, match="lengths has shape"):
        opo(s, lengths=torch.ones(4))
    with pytest.raises(ValueError, match="lengths contains 1 NaN"):
        opo(s, lengths=T([[1.0, float("nan")], [1, 1]]))
    with pytest.raises(ValueError, match="lengths must be > 0"):
        opo(s, lengths=T([[1.0, 0], [1, 1]]))
    with pytest.raises(ValueError, match="gdpo needs components="):
        gdpo(s)
    with pytest.raises(ValueError, match="weights name unknown components"):
        gdpo(s, components={"a": s}, weights={"b": 1.0})
    with pytest.raises(ValueError, match="alpha_count"):
        gpg(s, alpha_count="all")
    with pytest.raises(ValueError, match="f_norm"):
        gpg(s, f_norm=0)


def test_token_sum_ignores_nan_padding_and_counts():
    loss = T([[1.0, 2, float("nan")], [3, float("inf"), float("nan")]])
    mask = T([[1, 1, 0], [1, 0, 0]])
    assert aggregate_loss(loss, mask, "token-sum").item() == 6.0
    assert aggregate_loss(loss, mask, "token-sum", num_tokens=100, num_seqs=7).item() == 6.0


def test_abs_and_k3_plus_values_and_gradients():
    lp = T([0.5, -1.0, 2.0], requires_grad=True)
    ref = T([0.0, 0.0, 1.0])
    value, _ = kl_estimate(lp, ref, "abs", clip=None)
    torch.testing.assert_close(value, T([0.5, 1.0, 1.0]))
    value.sum().backward()
    torch.testing.assert_close(lp.grad, T([1.0, -1.0, 1.0]))
    lp.grad = None
    plus = k3_plus(lp, ref)
    torch.testing.assert_close(plus, k3(lp, ref))  # k3's value ...
    plus.sum().backward()
    torch.testing.assert_close(lp.grad, (lp - ref).detach())  # ... k2's gradient
    # the clamp bounds the value and leaves the straight-through gradient
    lp2 = T([15.0], requires_grad=True)
    clamped, metrics = kl_estimate(lp2, T([0.0]), "k3+", clip=(-10.0, 10.0))
    assert clamped.item() == 10.0 and metrics["kl_clip_frac"].item() == 1.0
    clamped.sum().backward()
    assert lp2.grad.item() == 15.0
    # a huge k3 value (exp(20)) is clamped exactly, with no float cancellation
    far = T([-30.0], requires_grad=True)
    clamped, _ = kl_estimate(far, T([0.0]), "k3+", clip=(-10.0, 10.0), log_ratio_clip=20.0)
    assert clamped.item() == 10.0
    clamped.sum().backward()
    assert far.grad.item() == -30.0  # k2's gradient of the unclamped log ratio, as verl's k3+


def test_k3_bias_corrected():
    lp = T([[-1.0, -2.0]], requires_grad=True)
    ref, old = T([[-1.5, -1.0]]), T([[-1.2, -2.5]])
    torch.testing.assert_close(k3_bias_corrected(lp, ref, old), k3(lp, ref) * torch.exp(lp - old))
    # on-policy (old = current) the value is k3 and the gradient is the unbiased one, grad of E[k1]
    on = k3_bias_corrected(lp, ref, lp.detach())
    torch.testing.assert_close(on, k3(lp, ref))
    on.sum().backward()
    lr = (lp - ref).detach()
    torch.testing.assert_close(lp.grad, lr)  # d/dlp [exp(-lr) - 1 + lr] e^(lp-old) at old = lp: lr
    with pytest.raises(ValueError, match="shape mismatch"):
        k3_bias_corrected(lp, ref, old[:, :1])


def test_truncated_completion_mask():
    mask = T([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = truncated_completion_mask(mask, T([False, True, False]))
    assert out.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    with pytest.raises(ValueError, match="one flag per response"):
        truncated_completion_mask(mask, T([True]))


def test_off_policy_sequence_mask_hand_computed():
    mask = T([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    lp = torch.zeros(4, 3)
    sample = T([[0.4, 0.4, float("nan")], [0.1, 0.1, 0.1], [float("nan"), 0, 0], [0.4, 0.4, 0]])
    adv = T([-1.0, -1.0, -1.0, 2.0])
    # mean KL 0.4 (padding NaN ignored), 0.1, 0 (unscored token = 0), 0.4 with a positive advantage
    assert off_policy_sequence_mask(adv, lp, sample, mask, 0.2).tolist() == [False, True, True, True]
    assert off_policy_sequence_mask(adv, lp, sample, mask, 0.5).tolist() == [True, True, True, True]
    with pytest.raises(ValueError, match="threshold"):
        off_policy_sequence_mask(adv, lp, sample, mask, -1)


def test_top_entropy_mask_keeps_the_top_fraction():
    ent = T([[0.1, 0.9, 0.5, float("nan")], [0.3, 0.7, float("nan"), float("nan")]])
    mask = T([[1, 1, 1, 0], [1, 1, 0, 0]])
    keep = top_entropy_mask(ent, mask, 0.4)  # 5 tokens: quantile 0.6 of (0.1, 0.3, 0.5, 0.7, 0.9) = 0.58
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert torch.equal(top_entropy_mask(ent, mask, 1.0), mask.bool())
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        top_entropy_mask(ent, mask, 0.0)
    assert math.isclose(float(keep.sum()) / float(mask.sum()), 0.4)


def test_optimal_token_baseline_hand_computed():
    from rlhf_ext.algorithms import optimal_token_baseline

    # two rows of one group, outcome on the last token; pi_t = 1/2 and sum pi^2 = 1/2 -> w_t = 1/2
    rewards = T([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    lp = torch.full((2, 2), math.log(0.5))
    spi2 = torch.full((2, 2), 0.5)
    adv, ret = optimal_token_baseline(rewards, mask, ["a", "a"], lp, spi2)
    # W = (0.5, 1.0) on both rows: B_t = mean of G_t = (0.5, 0.5)
    torch.testing.assert_close(ret, T([[1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.5, 0.5], [-0.5, -0.5]]), atol=1e-6, rtol=0)
    # a group of one has no baseline; all-equal rewards give advantage 0
    adv1, ret1 = optimal_token_baseline(rewards, mask, ["a", "b"], lp, spi2)
    torch.testing.assert_close(adv1, ret1)
    adv2, _ = optimal_token_baseline(torch.ones(2, 2), mask, ["a", "a"], lp, spi2)
    assert adv2.abs().max() < 1e-6
    with pytest.raises(ValueError, match="group ids"):
        optimal_token_baseline(rewards, mask, ["a"], lp, spi2)
