"""The ratio caps (rlhf_ext.algorithms.ratio_caps): TRL's two-sided clip ``delta`` and verl's dual clip on
ppo / gspo / luspo / bypass_mode, hand-computed; their equivalence for ``delta >= 1 + clip_ratio_high``; the
refusals of every other registered loss and on each host. Parity with TRL 1.16 / verl 0.9.1 on random inputs:
tests/verl_env/test_ratio_caps_parity.py."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from rlhf_ext.algorithms import aggregate_loss, available_policy_losses, get_policy_loss, ratio_cap_refusal
from rlhf_ext.algorithms.ratio_caps import REFUSED, TAKES_CAPS


def _one(name, ratio, adv, **options):
    """Loss and d loss / d log pi of a single token with the given ratio and advantage."""
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    lp = (old + math.log(ratio)).requires_grad_()
    per_token, metrics = get_policy_loss(name)(lp, old, torch.tensor([[adv]], dtype=torch.float64),
                                               torch.ones(1, 1, dtype=torch.bool), **options)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    return float(per_token.detach()), float(grad), metrics


@pytest.mark.parametrize("name", ["ppo", "gspo", "luspo"])
def test_delta_hand_computed(name):
    clip = dict(clip_ratio_low=0.2, clip_ratio_high=0.2)
    # A < 0, ratio 5: unclipped -A r = 5 (gradient -A r = 5); delta 4 caps it at 4 (gradient 0)
    assert _one(name, 5.0, -1.0, **clip)[:2] == pytest.approx((5.0, 5.0))
    loss, grad, metrics = _one(name, 5.0, -1.0, delta=4.0, **clip)
    assert (loss, grad) == pytest.approx((4.0, 0.0)) and float(metrics["delta_clip_frac"]) == 1.0
    # below delta nothing changes: ratio 3, A = -2 -> 6, gradient 6
    assert _one(name, 3.0, -2.0, delta=4.0, **clip)[:2] == pytest.approx((6.0, 6.0))
    # delta under 1 + high (TRL's formula, not its recommended range): the A > 0 upper clip becomes delta
    assert _one(name, 1.1, 1.0, **clip)[:2] == pytest.approx((-1.1, -1.1))
    assert _one(name, 1.1, 1.0, delta=1.05, **clip)[:2] == pytest.approx((-1.05, 0.0))


@pytest.mark.parametrize("name", ["ppo", "gspo", "luspo"])
def test_dual_clip_hand_computed(name):
    clip = dict(clip_ratio_low=0.2, clip_ratio_high=0.2)
    # A = -2, ratio 5: max(10, 2.4) = 10, capped at -c A = 6 with c = 3, no gradient
    loss, grad, metrics = _one(name, 5.0, -2.0, dual_clip=3.0, **clip)
    assert (loss, grad) == pytest.approx((6.0, 0.0)) and float(metrics["dual_clip_frac"]) == 1.0
    assert _one(name, 2.0, -2.0, dual_clip=3.0, **clip)[:2] == pytest.approx((4.0, 4.0))  # under the cap
    assert _one(name, 5.0, 2.0, dual_clip=3.0, **clip)[:2] == pytest.approx((-2.4, 0.0))  # A > 0: PPO's clip


def _random(seed, B=5, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 2, 5, 1, 4])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # rows 0 and 3 far above the caps with A < 0, row 2 on-policy (unclipped), the others in between
    shift = torch.tensor([[0.7], [-0.4], [0.0], [0.9], [0.01]], dtype=torch.float64)
    new = old + shift + 0.02 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([[-1.5], [1.0], [0.5], [-2.0], [-0.7]], dtype=torch.float64).expand(B, T).clone()
    return new, old, adv, mask


def _value_grad(name, inputs, mode, **options):
    new, old, adv, mask = inputs
    lp = new.clone().requires_grad_()
    per_token, metrics = get_policy_loss(name)(lp, old, adv, mask, **options)
    loss = aggregate_loss(per_token, mask, mode)
    return loss.detach(), torch.autograd.grad(loss, lp)[0], metrics


@pytest.mark.parametrize("name, clip", [("ppo", 0.2), ("gspo", 0.05), ("luspo", 0.05)])
def test_delta_above_the_upper_clip_is_the_dual_clip(name, clip):
    """For delta >= 1 + clip_ratio_high TRL's two-sided clip and verl's dual clip are one function of the ratio."""
    inputs = _random(1)
    options = dict(clip_ratio_low=clip, clip_ratio_high=clip)
    a = _value_grad(name, inputs, "seq-mean-token-mean", delta=1.6, **options)
    b = _value_grad(name, inputs, "seq-mean-token-mean", dual_clip=1.6, **options)
    plain = _value_grad(name, inputs, "seq-mean-token-mean", **options)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    assert not torch.allclose(a[1], plain[1])  # the cap binds on these inputs
    assert float(b[2]["dual_clip_frac"]) > 0


def test_luspo_caps_are_length_times_gspos():
    """luspo's linearised derivative with the caps: |y_i| times gspo's autograd one, per token."""
    new, old, adv, mask = _random(2)
    for options in (dict(delta=1.3), dict(dual_clip=1.4), dict(delta=1.1, dual_clip=1.5)):
        lp1, lp2 = new.clone().requires_grad_(), new.clone().requires_grad_()
        lu, _ = get_policy_loss("luspo")(lp1, old, adv, mask, clip_ratio_low=0.05, clip_ratio_high=0.05, **options)
        gs, _ = get_policy_loss("gspo")(lp2, old, adv, mask, clip_ratio_low=0.05, clip_ratio_high=0.05, **options)
        lengths = mask.sum(1, keepdim=True).to(torch.float64)
        torch.testing.assert_close(lu.detach(), gs.detach() * lengths)
        weights = torch.rand(new.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad((lu * weights).sum(), lp1)[0],
                                   torch.autograd.grad((gs * weights * lengths).sum(), lp2)[0])


def test_bypass_mode_forwards_delta_and_refuses_it_for_reinforce():
    inputs = _random(3)
    new, old, adv, mask = inputs
    a = get_policy_loss("bypass_mode")(new, old, adv, mask, delta=1.5, rollout_is=None)[0]
    b = get_policy_loss("ppo")(new, old, adv, mask, delta=1.5)[0]
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="reinforce has no ratio to cap"):
        get_policy_loss("bypass_mode")(new, old, adv, mask, loss_type="reinforce", delta=1.5)


@pytest.mark.parametrize("bad", [1.0, 0.5, float("inf"), float("nan")])
@pytest.mark.parametrize("key", ["delta", "dual_clip"])
def test_caps_must_exceed_one(key, bad):
    new, old, adv, mask = _random(0)
    for name in TAKES_CAPS[:3]:
        with pytest.raises(ValueError, match=f"{key} must be a finite number > 1"):
            get_policy_loss(name)(new, old, adv, mask, **{key: bad})


def test_every_registered_loss_takes_the_caps_or_says_why_not():
    ours = [n for n in available_policy_losses()
            if getattr(get_policy_loss(n), "__module__", "").startswith("rlhf_ext.")]
    assert set(ours) <= set(REFUSED) | set(TAKES_CAPS), set(ours) - set(REFUSED) - set(TAKES_CAPS)
    assert not set(REFUSED) & set(TAKES_CAPS)
    for name in TAKES_CAPS:
        import inspect
        params = inspect.signature(get_policy_loss(name)).parameters
        assert "delta" in params and "dual_clip" in params, name
    for name in REFUSED:
        assert ratio_cap_refusal(name, {}) is None
        msg = ratio_cap_refusal(name, {"delta": 2.0})
        assert msg.startswith(f"policy loss {name!r} takes no delta") and REFUSED[name] in msg
    assert ratio_cap_refusal("ppo", {"delta": 2.0}) is None


def _openrlhf_args(**values):
    return argparse.Namespace(**{"algo.advantage.estimator": "reinforce", "rollout.n_samples_per_prompt": 4,
                                 "actor.policy_loss_option": [], "actor.dual_clip": None, **values})


@pytest.mark.parametrize("loss, dual, options, match", [
    ("cispo", 3.0, [], "'cispo' takes no dual_clip"),
    ("pg", None, ["delta=2"], "'pg' takes no delta"),
    ("dppo_tv", None, ["delta=2"], "'dppo_tv' takes no delta"),
    ("ppo", None, ["delta=2"], "OpenRLHF's own 'ppo' has no two-sided clip delta"),
])
def test_openrlhf_start_up_refusals(loss, dual, options, match):
    from rlhf_ext.patches.openrlhf import cli

    ns = _openrlhf_args(**{"actor.policy_loss_type": loss, "actor.dual_clip": dual,
                           "actor.policy_loss_option": options})
    with pytest.raises(ValueError) as info:
        cli.finalize(ns)
    assert match in str(info.value)


def test_openrlhf_start_up_passes_the_caps_to_a_loss_that_takes_them():
    from rlhf_ext.patches.openrlhf import cli

    ns = _openrlhf_args(**{"actor.policy_loss_type": "luspo", "actor.dual_clip": 3.0,
                           "actor.policy_loss_option": ["delta=2"]})
    cli.finalize(ns)  # raises on a refusal or a rejected option
    dppo = _openrlhf_args(**{"actor.policy_loss_type": "dppo_tv", "actor.dual_clip": 5.0})
    cli.finalize(dppo)  # --actor.dual_clip is DPPO's IS-weight cap there: not refused


def test_dppo_keeps_dual_clip_as_its_is_cap_on_openrlhf():
    from rlhf_ext.patches.openrlhf.policy_loss import flag_options

    assert flag_options(get_policy_loss("dppo_tv"), 0.2, 0.2, 7.0) == {
        "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 7.0}
    assert flag_options(get_policy_loss("luspo"), 0.2, 0.3, 7.0)["dual_clip"] == 7.0


def test_mindspeed_refuses_a_cap_with_the_reason():
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_policy_loss_options

    assert check_policy_loss_options("gspo", {"delta": 2.0, "dual_clip": 3.0}) == {"delta": 2.0, "dual_clip": 3.0}
    with pytest.raises(ConfigError, match="policy_loss_options.delta: policy loss 'sapo' takes no delta"):
        check_policy_loss_options("sapo", {"delta": 2.0})


# ---- the token-level estimators by name (rlhf_ext.algorithms.token_estimators) -------------------------

def test_token_estimators_are_registered_by_name_and_callable_from_the_registry():
    from rlhf_ext.algorithms import (available_advantages, available_token_advantages, get_token_advantage,
                                     optimal_token_baseline, tir_optimal_token_baseline)

    assert available_token_advantages() == ["optimal_token_baseline", "tir_optimal_token_baseline"]
    assert get_token_advantage("optimal_token_baseline") is optimal_token_baseline
    assert get_token_advantage("tir_optimal_token_baseline") is tir_optimal_token_baseline
    assert not set(available_token_advantages()) & set(available_advantages())  # not outcome estimators
    # hand-computed: two rows of one group, pi_t = 1/2 everywhere and sum pi^2 = 1/2, so w_t = 1/2 and
    # W = (1/2, 1); rewards 1 and 0 at the last token: G = (1, 1) and (0, 0); B_t = (1 * W) / (2 W) = 1/2
    mask = torch.ones(2, 2, dtype=torch.bool)
    lp = torch.full((2, 2), math.log(0.5), dtype=torch.float64)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    for name in available_token_advantages():
        adv, returns = get_token_advantage(name)(rewards, mask, ["g", "g"], lp, torch.full_like(lp, 0.5), eps=0.0)
        torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [-0.5, -0.5]], dtype=torch.float64))
        torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_openrlhf_and_mindspeed_refuse_the_token_estimators_naming_the_missing_input(name):
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_estimator
    from rlhf_ext.patches.openrlhf import cli

    ns = _openrlhf_args(**{"algo.advantage.estimator": name, "actor.policy_loss_type": "ppo"})
    with pytest.raises(ValueError) as info:
        cli.finalize(ns)
    for text in (f"--algo.advantage.estimator {name} is a token-level estimator", "sum_pi_squared (the sum over "
                 "the vocabulary of the squared token probabilities", "its actor returns only the sampled tokens'",
                 f"rlhf_ext_{name}"):
        assert text in str(info.value)
    with pytest.raises(ConfigError, match=f"rl_config.adv_estimator {name} is a token-level estimator: it needs, "
                                          "per response token, sum_pi_squared"):
        check_estimator(name, None)
