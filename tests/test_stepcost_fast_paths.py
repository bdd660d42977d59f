"""The per-step fast paths keep the numbers of the code they replace (issue #15, part 2).

* ``ppo_clip_fractions`` (OpenRLHF's PPO loss: the split clip fractions without a second loss pass)
  against :func:`rlhf_ext.algorithms.ppo`'s metrics;
* the KL clamp flags read off OpenRLHF's clamped value against the unclamped estimate;
* the actor's micro-batch signal against :func:`rlhf_ext.algorithms.has_signal`.
"""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import has_signal, kl_estimate, ppo, ppo_clip_fractions


def batch(seed, b=6, t=9, scale=0.4, empty_row=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    new = old + torch.randn(b, t, generator=g) * scale
    adv = torch.randn(b, t, generator=g)
    adv[0] = 0.0  # a zero-advantage row: never clipped
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if empty_row:
        mask[2] = False
    return new, old, adv, mask


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.05)])
def test_clip_fractions_match_ppo_metrics(seed, eps):
    new, old, adv, mask = batch(seed, empty_row=seed % 2 == 1)
    keep = mask.any(-1)  # ppo rejects empty rows; they hold no tokens, so the fractions are the same
    _, metrics = ppo(new[keep], old[keep], adv[keep], mask[keep], eps_low=eps[0], eps_high=eps[1])
    fast = ppo_clip_fractions(new, old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    for key in ("clip_frac_low", "clip_frac_high"):
        torch.testing.assert_close(fast[key], metrics[key])
    assert float(metrics["clip_frac_low"]) > 0 and float(metrics["clip_frac_high"]) > 0  # both bounds bind here


def test_clip_fractions_hand_computed_and_mask_types():
    old = torch.zeros(1, 5)
    new = torch.log(torch.tensor([[0.5, 1.5, 0.5, 1.5, 3.0]]))
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 2.0]])
    # low binds at token 0 (ratio 0.5 < 0.9, A < 0); high at tokens 1 and 4 (ratio > 1.1, A > 0); token 4 masked out
    for mask in (torch.tensor([[1, 1, 1, 1, 0]]), torch.tensor([[True, True, True, True, False]])):
        out = ppo_clip_fractions(new, old, adv, mask, eps_low=0.1, eps_high=0.1)
        assert float(out["clip_frac_low"]) == 0.25 and float(out["clip_frac_high"]) == 0.25
    empty = ppo_clip_fractions(new, old, adv, torch.zeros(1, 5, dtype=torch.bool), eps_low=0.1)
    assert float(empty["clip_frac_low"]) == 0.0 and float(empty["clip_frac_high"]) == 0.0
    with pytest.raises(ValueError, match="eps_low"):
        ppo_clip_fractions(new, old, adv, torch.ones(1, 5), eps_low=1.5)


def test_clip_fractions_do_not_track_gradients():
    new, old, adv, mask = batch(0)
    new.requires_grad_()
    out = ppo_clip_fractions(new, old, adv, mask)
    assert not any(v.requires_grad for v in out.values())


@pytest.fixture(scope="module")
def patched():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.models import loss, utils
    from openrlhf.trainer.ray import ppo_actor

    yield SimpleNamespace(actor=ppo_actor, utils=utils, loss=loss)
    deactivate()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_openrlhf_ppo_loss_reports_ppos_clip_fractions(patched, mode):
    new, old, adv, mask = batch(5, empty_row=True)
    loss_fn = patched.actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type="ppo").configure(
        mode, max_len=9)
    out = loss_fn(new.clone().requires_grad_(), old, adv, action_mask=mask)
    keep = mask.any(-1)
    _, metrics = ppo(new[keep], old[keep], adv[keep], mask[keep], eps_low=0.2, eps_high=0.28)
    for key in ("clip_frac_low", "clip_frac_high"):
        torch.testing.assert_close(loss_fn.last_metrics[key], metrics[key])
    if mode == "token-mean":  # OpenRLHF's own clip ratio is the sum of the two
        torch.testing.assert_close(out[1], metrics["clip_frac_low"] + metrics["clip_frac_high"])


def test_dual_clip_still_reports_its_fraction(patched):
    new, old, adv, mask = batch(6, scale=1.0)
    loss_fn = patched.actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0).configure("token-mean")
    loss_fn(new, old, adv, action_mask=mask)
    _, metrics = ppo(new, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert set(loss_fn.last_metrics) == {"clip_frac_low", "clip_frac_high", "dual_clip_frac"}
    torch.testing.assert_close(loss_fn.last_metrics["dual_clip_frac"], metrics["dual_clip_frac"])


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("where", ["em", "actor"])
def test_kl_clamp_flags_from_openrlhfs_value(patched, estimator, where):
    from openrlhf.trainer.ppo_utils import experience_maker

    from rlhf_ext.patches.openrlhf.kl import clipped_fraction, kl_settings

    fn = experience_maker.compute_approx_kl if where == "em" else patched.actor.compute_approx_kl
    g = torch.Generator().manual_seed(3)
    base = -torch.rand(4, 7, generator=g) * 2
    lp = (base + torch.randn(4, 7, generator=g) * 8).requires_grad_()
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, 3:] = 0
    args = SimpleNamespace(algo=SimpleNamespace(kl=SimpleNamespace(clip=None)))
    with kl_settings(args) as ctx:
        value = fn(lp, base, kl_estimator=estimator)
    assert torch.equal(value, patched.utils.compute_approx_kl(lp, base, kl_estimator=estimator))  # OpenRLHF's value
    assert value.requires_grad  # the gradient path is OpenRLHF's, untouched
    raw, _ = kl_estimate(lp.detach(), base, estimator, clip=None)
    expected = (raw < -10) | (raw > 10)
    assert torch.equal(ctx.flags[0], expected)
    assert bool(expected.any()) and not bool(expected.all())
    frac = clipped_fraction(ctx.flags[0], mask, per_sample=True)
    hand = (expected & mask.bool()).sum(-1).float() / mask.sum(-1).float()
    torch.testing.assert_close(frac, hand)


def test_custom_kl_clip_is_one_pass_with_the_same_value_and_gradient(patched):
    from rlhf_ext.patches.openrlhf.kl import kl_settings

    g = torch.Generator().manual_seed(4)
    base = -torch.rand(3, 6, generator=g) * 2
    lp = base + torch.randn(3, 6, generator=g) * 2
    args = SimpleNamespace(algo=SimpleNamespace(kl=SimpleNamespace(clip=[-1, 1])))
    x = lp.clone().requires_grad_()
    with kl_settings(args) as ctx:
        value = patched.actor.compute_approx_kl(x, base, kl_estimator="k3")
    value.sum().backward()
    y = lp.clone().requires_grad_()
    expected, _ = kl_estimate(y, base, "k3", clip=(-1.0, 1.0))
    expected.sum().backward()
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(x.grad, y.grad)
    raw, _ = kl_estimate(lp, base, "k3", clip=None)
    assert torch.equal(ctx.flags[0], (raw < -1) | (raw > 1))


@pytest.mark.parametrize("seed", range(3))
def test_micro_batch_signal_matches_has_signal(seed):
    from rlhf_ext.patches.openrlhf.updates import micro_batch_signal

    _, _, adv, mask = batch(seed)
    assert micro_batch_signal(adv, mask) == has_signal(adv, mask) is True
    zero_on_mask = torch.where(mask, torch.zeros_like(adv), adv)  # non-zero only on padding
    assert micro_batch_signal(zero_on_mask, mask.long()) == has_signal(zero_on_mask, mask) is False


def test_zero_variance_flags_match_zero_variance_groups():
    from rlhf_ext.algorithms import zero_variance_groups
    from rlhf_ext.patches.openrlhf.advantages import attach_zero_variance

    grouped = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2], [1.2, 0.2, 1.2, 1.2]])
    indices = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    exp_len = [5, 6, 5]
    experiences = [SimpleNamespace(info={}) for _ in exp_len]
    attach_zero_variance(experiences, grouped, indices, exp_len)
    got = torch.empty(16)
    got[indices] = torch.cat([e.info["zero_variance_group_frac"] for e in experiences])
    expected = zero_variance_groups(grouped).float()[:, None].expand(-1, 4).reshape(-1)
    assert torch.equal(got, expected) and got.tolist().count(1.0) == 8


@pytest.mark.parametrize("seed", range(4))
def test_clip_fractions_from_a_known_total(seed):
    new, old, adv, mask = batch(seed, empty_row=seed % 2 == 0)
    full = ppo_clip_fractions(new, old, adv, mask, eps_low=0.2, eps_high=0.28)
    total = full["clip_frac_low"] + full["clip_frac_high"]
    split = ppo_clip_fractions(new, old, adv, mask, eps_low=0.2, eps_high=0.28, clipped=total)
    torch.testing.assert_close(split["clip_frac_high"], full["clip_frac_high"])
    torch.testing.assert_close(split["clip_frac_low"], full["clip_frac_low"])
    # a total below the upper count (a rounding tie in the caller's count) never gives a negative fraction
    low_total = ppo_clip_fractions(new, old, adv, mask, eps_low=0.2, eps_high=0.28, clipped=full["clip_frac_high"] / 2)
    assert float(low_total["clip_frac_low"]) == 0.0
    assert float(low_total["clip_frac_high"]) == pytest.approx(float(full["clip_frac_high"]) / 2)


def test_update_counter_takes_a_known_signal():
    from rlhf_ext.algorithms import UpdateCounter

    c = UpdateCounter()
    assert c.add_signal(False) is False and c.add_signal(torch.tensor(True)) is True
    assert c.end_update() is True  # one micro-batch of the window had signal
    c.add_signal(False)
    assert c.end_update() is False
    assert (c.attempted, c.applied, c.zero_advantage) == (2, 1, 1)


def test_step_metrics_off_leaves_only_openrlhfs_work(patched):
    """--rlhf_ext.step_metrics off: the same loss and KL values, and none of rlhf_ext's extra metrics."""
    from openrlhf.trainer.ppo_utils import experience_maker

    from rlhf_ext.patches.openrlhf.config import step_metrics
    from rlhf_ext.patches.openrlhf.kl import kl_settings

    new, old, adv, mask = batch(7)
    on = patched.actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28).configure("token-mean")
    off = patched.actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28).configure("token-mean", side_metrics=False)
    out_on, out_off = on(new, old, adv, action_mask=mask), off(new, old, adv, action_mask=mask)
    assert torch.equal(out_on[0], out_off[0]) and torch.equal(out_on[1], out_off[1])
    assert set(on.last_metrics) == {"clip_frac_low", "clip_frac_high"} and off.last_metrics == {}

    base = -torch.rand(4, 7)
    lp = base + torch.randn(4, 7) * 8
    for setting, flags in (("all", 1), ("off", 0)):
        args = SimpleNamespace(algo=SimpleNamespace(kl=SimpleNamespace(clip=None)),
                               rlhf_ext=SimpleNamespace(step_metrics=setting))
        assert step_metrics(args) is (setting == "all")
        with kl_settings(args) as ctx:
            value = experience_maker.compute_approx_kl(lp, base, kl_estimator="k3")
        assert torch.equal(value, patched.utils.compute_approx_kl(lp, base, kl_estimator="k3"))
        assert len(ctx.flags) == flags
    assert step_metrics(SimpleNamespace()) is True  # the default: all
