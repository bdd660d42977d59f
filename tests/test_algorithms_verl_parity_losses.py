"""Issue 42's losses and estimators in the main environment: hand-computed cases and invariants (the parity
with verl 0.9.1 itself is in tests/verl_env/test_verl_new_losses_parity.py)."""

import math

import pytest
import torch

from rlhf_ext.algorithms import (RolloutCorrection, get_policy_loss, optimal_token_baseline, ppo, rollout_correction,
                                 tir_optimal_token_baseline)


def test_dro_hand_computed():
    lp = torch.tensor([[-0.8, -0.9, 5.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -0.7, float("nan")]])  # padding may hold NaN
    adv = torch.tensor([[2.0, -1.5, 9.0]])
    mask = torch.tensor([[True, True, False]])
    per_token, metrics = get_policy_loss("dro")(lp, old, adv, mask, dro_beta=0.5)
    # -(A lp - beta/2 d^2): -(2 * -0.8 - 0.25 * 0.04) = 1.61; -(-1.5 * -0.9 - 0.25 * 0.04) = -1.34
    torch.testing.assert_close(per_token.detach(), torch.tensor([[1.61, -1.34, 0.0]]))
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    torch.testing.assert_close(grad, torch.tensor([[-2.0 + 0.5 * 0.2, 1.5 + 0.5 * -0.2, 0.0]]))
    assert float(metrics["ppo_kl"]) == pytest.approx(0.0, abs=1e-7)  # (-0.2 + 0.2) / 2
    assert float(metrics["dro_penalty"]) == pytest.approx(0.02)


def test_gpg_loss_is_pg():
    assert get_policy_loss("gpg") is get_policy_loss("pg")


def test_bypass_mode_ppo_clip_without_rejection_is_ppo_and_reinforce_weights_pg():
    g = torch.Generator().manual_seed(0)
    rollout = -torch.rand(3, 5, generator=g)
    new = rollout + 0.3 * torch.randn(3, 5, generator=g)
    adv, mask = torch.randn(3, 5, generator=g), torch.ones(3, 5, dtype=torch.bool)
    ours, metrics = get_policy_loss("bypass_mode")(new, rollout, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(ours, ppo(new, rollout, adv, mask, dual_clip=3.0)[0])
    assert "rollout_corr/is_mean" in metrics  # verl's default: sequence IS, reported, not applied
    reinforce, _ = get_policy_loss("bypass_mode")(new, rollout, adv, mask, loss_type="reinforce", rollout_is="token",
                                                  rollout_is_threshold=1.2)
    w = torch.exp(new - rollout).clamp(max=1.2)
    torch.testing.assert_close(reinforce, -adv * new * w)


def test_k3_kl_is_not_clamped():
    rollout = torch.tensor([[-40.0, -1.0]])
    train = torch.tensor([[-5.0, -1.0]])  # log-ratio 35, beyond the weights' +-20
    k3 = float(rollout_correction(train, rollout, torch.ones(1, 2, dtype=torch.bool), RolloutCorrection()).metrics["k3_kl"])
    assert k3 == pytest.approx((math.exp(35) - 1 - 35) / 2, rel=1e-5)
    # a rollout probability of 0: inf, never NaN
    zero = rollout_correction(train, torch.tensor([[-math.inf, -1.0]]), torch.ones(1, 2, dtype=torch.bool),
                              RolloutCorrection()).metrics["k3_kl"]
    assert math.isinf(float(zero)) and float(zero) > 0


def test_tir_token_baseline_without_holes_is_the_token_baseline():
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([5, 3, 4, 2])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    rewards = torch.zeros(4, 5)
    rewards[torch.arange(4), lengths - 1] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    old, sq = -torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g) * 0.3
    groups = ["a", "a", "b", "b"]
    tir, _ = tir_optimal_token_baseline(rewards, mask, groups, old, sq)
    plain, _ = optimal_token_baseline(rewards, mask, groups, old, sq)
    torch.testing.assert_close(tir, plain)
    # a hole moves the later tokens one step back: the same tokens, compacted, give the same advantages
    holed_mask = torch.cat([mask[:, :1], torch.zeros(4, 1, dtype=torch.bool), mask[:, 1:]], dim=1)
    spread = lambda x: torch.cat([x[:, :1], torch.zeros(4, 1), x[:, 1:]], dim=1)  # noqa: E731
    holed, _ = tir_optimal_token_baseline(spread(rewards), holed_mask, groups, spread(old), spread(sq))
    torch.testing.assert_close(holed[holed_mask], plain[mask])
