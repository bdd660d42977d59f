"""--algo.kl.clip: the patched compute_approx_kl in both OpenRLHF modules that use it."""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import kl_estimate


@pytest.fixture(scope="module")
def modules():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.models import utils
    from openrlhf.trainer.ppo_utils import experience_maker
    from openrlhf.trainer.ray import ppo_actor

    yield SimpleNamespace(utils=utils, em=experience_maker, actor=ppo_actor)
    deactivate()


def settings(clip=None):
    from rlhf_ext.patches.openrlhf.kl import kl_settings

    return kl_settings(SimpleNamespace(algo=SimpleNamespace(kl=SimpleNamespace(clip=clip))))


def log_probs(seed=0, scale=8.0):
    g = torch.Generator().manual_seed(seed)
    base = -torch.rand(3, 5, generator=g) * 2
    return base + torch.randn(3, 5, generator=g) * scale, base


@pytest.mark.parametrize("where", ["em", "actor"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_both_importers_are_patched_and_default_is_openrlhf(modules, where, estimator):
    patched = getattr(modules, where).compute_approx_kl
    original = modules.utils.compute_approx_kl
    assert patched is not original and patched.__wrapped__ is original
    lp, base = log_probs()
    expected = original(lp, base, kl_estimator=estimator)
    assert torch.equal(patched(lp, base, kl_estimator=estimator), expected)  # outside a training step
    with settings(None) as ctx:  # a run without --algo.kl.clip
        assert torch.equal(patched(lp, base, kl_estimator=estimator), expected)
    raw, _ = kl_estimate(lp, base, estimator, clip=None)
    assert torch.equal(ctx.flags[0], raw.abs() > 10)
    if estimator != "k1":
        assert bool(ctx.flags[0].any())  # scale 8 log ratios do exceed OpenRLHF's clamp


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_custom_clip_and_none(modules, estimator):
    patched = modules.em.compute_approx_kl
    lp, base = log_probs(seed=1, scale=3.0)
    with settings([-0.5, 0.5]) as ctx:
        value = patched(lp, base, kl_estimator=estimator)
    expected, _ = kl_estimate(lp, base, estimator, clip=(-0.5, 0.5))
    torch.testing.assert_close(value, expected)
    assert float(value.max()) <= 0.5 and float(value.min()) >= -0.5
    with settings("none"):
        unclipped = patched(lp, base, kl_estimator=estimator)
    raw, _ = kl_estimate(lp, base, estimator, clip=None)
    torch.testing.assert_close(unclipped, raw)
    assert float(raw.abs().max()) > 0.5
    assert torch.equal(ctx.flags[0], (raw < -0.5) | (raw > 0.5))


def test_hand_computed_k1_clip():
    from rlhf_ext.patches.openrlhf.kl import make_compute_approx_kl

    from openrlhf.models.utils import compute_approx_kl

    fn = make_compute_approx_kl(compute_approx_kl)
    lp = torch.tensor([[0.0, -1.0, -5.0, -30.0]])
    base = torch.zeros(1, 4)
    with settings([-2, 2]) as ctx:
        assert fn(lp, base).tolist() == [[0.0, -1.0, -2.0, -2.0]]
    with settings("none"):
        assert fn(lp, base).tolist() == [[0.0, -1.0, -5.0, -20.0]]  # log ratio bounded to +-20 before the estimator
    from rlhf_ext.patches.openrlhf.kl import clipped_fraction

    # flagged: -5 and -30; the mask drops the last token -> 1 of 3
    assert clipped_fraction(ctx.flags[0], torch.tensor([[1, 1, 1, 0]]), per_sample=True).tolist() == pytest.approx([1 / 3])


def test_unbiased_gradient_keeps_openrlhfs_gradient(modules):
    patched, original = modules.actor.compute_approx_kl, modules.utils.compute_approx_kl
    lp, base = log_probs(seed=2, scale=1.0)
    old = lp + 0.1

    def grad_and_value(fn, **kw):
        x = lp.clone().requires_grad_()
        v = fn(x, base, log_probs_old=old, kl_estimator="k3", unbiased_gradient=True, **kw)
        v.sum().backward()
        return v.detach(), x.grad

    ref_value, ref_grad = grad_and_value(original)
    with settings([-0.05, 0.05]):
        value, grad = grad_and_value(patched)
    torch.testing.assert_close(grad, ref_grad)  # the straight-through gradient is OpenRLHF's
    expected, _ = kl_estimate(lp, base, "k3", clip=(-0.05, 0.05))
    torch.testing.assert_close(value, expected)
    assert not torch.allclose(value, ref_value)


def test_bad_clip_settings_are_named():
    from rlhf_ext.patches.openrlhf.config import normalize_kl_clip

    assert normalize_kl_clip(["none"]) is None and normalize_kl_clip(["-1", "2"]) == (-1.0, 2.0)
    with pytest.raises(ValueError, match="LO < HI"):
        normalize_kl_clip([2, 1])
    with pytest.raises(ValueError, match="two numbers"):
        normalize_kl_clip(["a", "b"])
    with pytest.raises(ValueError, match="LO HI or 'none'"):
        normalize_kl_clip([1, 2, 3])


@pytest.mark.parametrize("where", ["em", "actor"])
def test_abs_estimator_is_added(modules, where):
    """--algo.kl.estimator abs: |log pi - log pi_ref|, clamped to OpenRLHF's [-10, 10] or --algo.kl.clip."""
    patched = getattr(modules, where).compute_approx_kl
    lp, base = log_probs(scale=8.0)
    want = (lp - base).abs()
    torch.testing.assert_close(patched(lp, base, kl_estimator="abs"), want.clamp(max=10.0))
    with settings(["-1", "3"]) as ctx:
        torch.testing.assert_close(patched(lp, base, kl_estimator="abs"), want.clamp(-1, 3))
    assert torch.equal(ctx.flags[0], want > 3)
    with settings("none"):
        torch.testing.assert_close(patched(lp, base, kl_estimator="abs"), want)
    # --algo.kl.unbiased_gradient: abs's value with OpenRLHF's unbiased gradient (k1 * grad log pi on-policy)
    x = lp.clone().requires_grad_()
    value = patched(x, base, None, "abs", True)
    torch.testing.assert_close(value, want.clamp(max=10.0))
    value.sum().backward()
    torch.testing.assert_close(x.grad, lp - base)
