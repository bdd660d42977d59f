"""The registered losses' fast paths keep every value and gradient (issue #22, the loss-cost check).

* :func:`rlhf_ext.algorithms.only_metrics`: a loss asked for fewer metrics returns the same loss and
  gradient, and the metrics it was asked for with the values of the full set;
* the fused finite check of ``check_token_inputs``: one sum decides the common case, and every case
  it cannot decide (NaN/Inf in the padding, a sum that overflows, a NaN in a response token, under the
  guard's deferral or not) ends as the exact per-input check decided it before;
* OpenRLHF's patched ``PolicyLoss`` with ``--rlhf_ext.step_metrics off``: the same loss, gradient,
  ``clip_ratio`` and ``ppo_kl`` as with ``all``, and no extra metrics.
"""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import deferred_finite_checks, get_policy_loss, only_metrics
from rlhf_ext.algorithms.checks import check_token_inputs

LOSSES = ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "luspo", "vespo", "gspo")
HOST = ("clip_frac_low", "clip_frac_high", "ppo_kl")


def batch(seed, b=5, t=40, padding=0.0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    new = old + torch.randn(b, t, generator=g) * 0.3
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    adv[1, ::3] = 0.0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    for x in (new, old, adv):
        x[~mask] = padding
    return new, old, adv, mask


def run(name, new, old, adv, mask):
    lp = new.clone().requires_grad_()
    kwargs = {"seed": 3} if name == "clip_cov" else {}
    per_token, metrics = get_policy_loss(name)(lp, old, adv, mask, **kwargs)
    per_token.sum().backward()
    return per_token.detach(), lp.grad, metrics


@pytest.mark.parametrize("padding", [0.0, 0.7, float("nan")])
@pytest.mark.parametrize("name", LOSSES)
def test_fewer_metrics_same_loss_gradient_and_values(name, padding):
    new, old, adv, mask = batch(1, padding=padding)
    full_loss, full_grad, full = run(name, new, old, adv, mask)
    with only_metrics(HOST):
        loss, grad, some = run(name, new, old, adv, mask)
    same = dict(rtol=0, atol=0, equal_nan=True)  # bit for bit (gspo's padding gradient is NaN then)
    torch.testing.assert_close(loss, full_loss, **same)
    torch.testing.assert_close(grad, full_grad, **same)
    assert set(some) == set(HOST) & set(full)
    for key in some:
        assert torch.equal(some[key], full[key]), key
    assert torch.isfinite(full_loss).all() and not full_loss[~mask].any()  # 0 on the padding
    if name != "gspo":  # the ratio losses zero their inputs on the padding: the gradient too
        assert torch.isfinite(full_grad).all() and not full_grad[~mask].any()
    with only_metrics(()):
        assert run(name, new, old, adv, mask)[2] == {}
    assert set(run(name, new, old, adv, mask)[2]) == set(full)  # the block ended: all again


def test_a_loss_that_does_not_ask_computes_every_metric():
    new, old, adv, mask = batch(4)
    with only_metrics(HOST):  # ppo (OpenRLHF's own runs in the host) does not read the request: all, still right
        assert {"ratio_mean", "ppo_kl"} <= set(run("ppo", new, old, adv, mask)[2])


def test_fused_check_decides_as_the_exact_one():
    new, old, adv, mask = batch(2)
    huge = new.clone()
    huge[mask] = 3e38  # finite, but the sum overflows: the exact check runs and finds nothing
    assert torch.equal(check_token_inputs(mask, a=huge, b=-huge), mask)
    pad = new.clone()
    pad[~mask] = float("inf")
    neg_pad = old.clone()
    neg_pad[~mask] = -float("inf")  # Inf - Inf = NaN in the combined sum: still only padding
    check_token_inputs(mask, log_probs=pad, old_log_probs=neg_pad)
    half = new.half()
    half[mask] = -60000.0  # float16 sums in float32: no overflow, no false alarm either way
    check_token_inputs(mask, log_probs=half)

    bad = adv.clone()
    bad[0, 0] = float("nan")
    bad[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"advantages contains 1 NaN and 1 Inf value\(s\) \(first at index \(0, 0\)\)"):
        check_token_inputs(mask, log_probs=new, old_log_probs=old, advantages=bad)
    with deferred_finite_checks() as findings:
        check_token_inputs(mask, log_probs=new, old_log_probs=bad, advantages=bad)
    assert findings == [
        {"name": "old_log_probs", "nan_count": 1, "inf_count": 1, "first_index": [0, 0]},
        {"name": "advantages", "nan_count": 1, "inf_count": 1, "first_index": [0, 0]},
    ]
    empty = mask.clone()
    empty[2] = False
    with pytest.raises(ValueError, match=r"1 row\(s\) with no tokens \(rows \[2\]\)"):
        check_token_inputs(empty, log_probs=new)
    with deferred_finite_checks(), pytest.raises(ValueError, match="no tokens"):  # before the finite checks
        check_token_inputs(empty, advantages=bad)


@pytest.fixture(scope="module")
def patched():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ray import ppo_actor

    yield ppo_actor
    deactivate()


@pytest.mark.parametrize("name", LOSSES[:9])
def test_step_metrics_off_same_numbers_for_openrlhf(patched, name):
    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

    new, old, adv, mask = batch(3)
    outs = {}
    for setting in ("all", "off"):
        loss_fn = patched.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=name)
        args = SimpleNamespace(actor=SimpleNamespace(loss_agg_mode="token-mean", policy_loss_type=name,
                                                     loss_agg_max_len=None,
                                                     policy_loss_option=["seed=0"] if name == "clip_cov" else None),
                               rlhf_ext=SimpleNamespace(step_metrics=setting))
        configure_from_args(loss_fn, args)
        lp = new.clone().requires_grad_()
        out = loss_fn(lp, old, adv, action_mask=mask, dp_size=1, batch_num_tokens=mask.sum().float(),
                      global_batch_size=torch.tensor(5.0))
        out[0].backward()
        outs[setting] = (out[0].detach(), out[1], out[2], lp.grad, loss_fn.last_metrics)
    (loss_on, clip_on, kl_on, grad_on, metrics_on), (loss_off, clip_off, kl_off, grad_off, metrics_off) = outs.values()
    assert torch.equal(loss_on, loss_off) and torch.equal(grad_on, grad_off)
    assert torch.equal(clip_on, clip_off) and torch.equal(kl_on, kl_off)
    assert metrics_off == {} and "ppo_kl" in metrics_on
