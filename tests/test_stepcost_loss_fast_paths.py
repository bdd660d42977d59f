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

LOSSES = ("cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "luspo", "vespo", "gspo", "ppo",
          "bypass_mode")
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
    with only_metrics(HOST):  # noclip does not read the request: all, still right
        assert {"ratio_mean", "ratio_max", "ppo_kl"} <= set(run("noclip", new, old, adv, mask)[2])


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


# ---- the closed-form derivatives, the 0/1 float flags, the one-pass aggregation (issue 22's loss cost) ----

from rlhf_ext.algorithms import aggregate_loss  # noqa: E402
from rlhf_ext.algorithms.float_flags import flag, float_mask, rows_all_nonempty  # noqa: E402
from rlhf_ext.algorithms.linearised import with_derivative  # noqa: E402


def wide_batch(seed, b=6, t=30):
    """float64, log-ratios wide enough that every clip binds somewhere (and the +-20 clamp on a few
    tokens), advantages of both signs per token, some exactly 0."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    new = (old + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.5).clamp(max=-1e-3)
    new[0, :3] = old[0, :3] + torch.tensor([25.0, -25.0, 20.0], dtype=torch.float64)  # beyond / at the clamp
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    adv[2, ::4] = 0.0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return new, old, adv, mask


def _autograd_reference(name, lp, old, adv, mask):
    """The loss written as plain autograd formulas (the form before the closed-form derivatives)."""
    m = mask.to(lp.dtype)
    lp, old, adv = lp * m, old * m, adv * m
    if name == "sapo":
        ratio = torch.exp((lp - old).clamp(-20, 20))
        tau = torch.where(adv > 0, adv.new_tensor(1.0), adv.new_tensor(1.05))
        return -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    if name == "gmpo":
        d = (lp - old).clamp(-20, 20)
        sgn = torch.sign(adv)
        l_tok = sgn * torch.min(sgn * d, sgn * d.clamp(-0.4, 0.4))
        n = m.sum(dim=1, keepdim=True)
        seq = l_tok.sum(dim=1, keepdim=True) / n
        return -(adv.sum(dim=1, keepdim=True) / n) * torch.exp(seq.detach() + l_tok - l_tok.detach()) * m
    if name == "luspo":
        n = m.sum(dim=1, keepdim=True)
        seq = ((lp - old).sum(dim=1, keepdim=True) / n).clamp(-10, 10)
        s = torch.exp(lp - lp.detach() + seq.detach())
        return -torch.min(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv) * n
    if name == "kl_cov":  # with kl_cov_ratio so small that one token is penalised: checked apart
        return -adv * torch.exp((lp - old).clamp(-20, 20))
    raise KeyError(name)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["sapo", "gmpo", "luspo"])
def test_closed_form_derivative_equals_autograd_through_the_formula(name, seed):
    new, old, adv, mask = wide_batch(seed)
    if name == "luspo":
        adv = adv[:, :1].expand_as(adv).clone() * mask
    lp = new.clone().requires_grad_()
    per_token, _ = get_policy_loss(name)(lp, old, adv, mask)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    ref_lp = new.clone().requires_grad_()
    ref = _autograd_reference(name, ref_lp, old, adv, mask)
    (ref_grad,) = torch.autograd.grad(ref.sum(), ref_lp)
    torch.testing.assert_close(per_token.detach(), ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert (grad[~mask] == 0).all() and (grad[mask] != 0).any()


def test_clip_cov_and_kl_cov_derivatives_equal_autograd():
    new, old, adv, mask = wide_batch(3)
    lp = new.clone().requires_grad_()
    per_token, _ = get_policy_loss("kl_cov")(lp, old, adv, mask, kl_cov_ratio=1e-6, ppo_kl_coef=0.5)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    ref_lp = new.clone().requires_grad_()
    ref = _autograd_reference("kl_cov", ref_lp, old, adv, mask)
    penalised = per_token.detach() != ref.detach()
    assert penalised.sum() == 1  # max(1, int(ratio * tokens)) = 1
    log_ratio = ((ref_lp - old) * mask).clamp(-20, 20)
    ref = ref + torch.where(penalised, 0.5 * log_ratio.abs(), torch.zeros_like(ref))
    (ref_grad,) = torch.autograd.grad(ref.sum(), ref_lp)
    torch.testing.assert_close(per_token.detach(), ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    # clip_cov with no candidate is PPO's clipped surrogate, value and derivative (the +-20 clamp binds on row 0)
    lp = new.clone().requires_grad_()
    per_token, metrics = get_policy_loss("clip_cov")(lp, old, adv, mask, clip_cov_lb=1e6, clip_cov_ub=2e6, seed=0)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    ref_lp = new.clone().requires_grad_()
    m = mask.to(new.dtype)
    ratio = torch.exp(((ref_lp - old) * m).clamp(-20, 20))
    a = adv * m
    ref = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    (ref_grad,) = torch.autograd.grad(ref.sum(), ref_lp)
    torch.testing.assert_close(per_token.detach(), ref.detach(), rtol=0, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0)
    assert metrics["cov_clip_frac"] == 0
    bound = (-a * ratio.clamp(0.8, 1.2) > -a * ratio).detach()
    assert 0 < bound.sum() < mask.sum()
    n = mask.sum().item()
    assert metrics["clip_frac_high"].item() == (bound & (adv > 0)).sum().item() / n
    assert metrics["clip_frac_low"].item() == (bound & (adv < 0)).sum().item() / n


def test_with_derivative_keeps_the_value_and_gives_the_derivative():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 5, generator=g).requires_grad_()
    value, d = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    out = with_derivative(value, lp, d)
    assert torch.equal(out.detach(), value)
    (grad,) = torch.autograd.grad((out * 2).sum(), lp)
    assert torch.equal(grad, 2 * d)


def test_float_flags_equal_the_boolean_forms():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    y[0, :3] = x[0, :3]  # ties
    for op in (torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne):
        assert torch.equal(flag(op, x, y), op(x, y).float())
        assert torch.equal(flag(op, x, 0.25), op(x, 0.25).float())
    mask = torch.rand(4, 9, generator=g) < 0.5
    mask[:, 0] = True
    assert torch.equal(float_mask(mask, torch.float64), mask.double())
    assert torch.equal(float_mask(mask[:, ::2], torch.float32), mask[:, ::2].float())  # a strided view
    assert torch.equal(float_mask(mask.long(), torch.float32), mask.float())
    assert int(rows_all_nonempty(mask)) == 1 and int(rows_all_nonempty(mask.long())) == 1
    mask[2] = False
    assert int(rows_all_nonempty(mask)) == 0


def test_one_pass_aggregation_decides_as_the_checks():
    new, old, adv, mask = batch(5)
    per_token = new * old
    total_tokens = mask.sum().float()
    ref = torch.where(mask, per_token, 0.0)
    # finite loss: the product with the mask, counts as tensors or numbers, every mode
    assert torch.equal(aggregate_loss(per_token, mask, "token-mean", num_tokens=total_tokens),
                       ref.sum() / total_tokens)
    assert torch.equal(aggregate_loss(per_token, mask, "seq-mean-token-sum", num_seqs=torch.tensor(5.0)),
                       ref.sum() / 5.0)
    assert torch.equal(aggregate_loss(per_token, mask, "seq-mean-token-mean"),
                       (ref.sum(dim=1) / mask.sum(dim=1)).sum() / 5.0)
    # NaN/Inf on the padding only: torch.where's value, a finite gradient
    dirty = per_token.detach().clone().requires_grad_()
    with torch.no_grad():
        dirty[~mask] = float("nan")
    loss = aggregate_loss(dirty, mask, "token-sum")
    assert torch.equal(loss.detach(), ref.sum())
    (grad,) = torch.autograd.grad(loss, dirty)
    assert torch.equal(grad, mask.float())
    # a NaN on a response token, an empty row, a count that is not > 0: the errors named as before
    bad = per_token.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="per_token_loss contains 1 NaN"):
        aggregate_loss(bad, mask)
    empty = mask.clone()
    empty[3] = False
    with pytest.raises(ValueError, match="no tokens"):
        aggregate_loss(per_token, empty)
    for bad_count in (torch.tensor(0.0), torch.tensor(float("nan")), -2.0):
        with pytest.raises(ValueError, match="num_tokens must be > 0"):
            aggregate_loss(per_token, mask, "token-mean", num_tokens=bad_count)
    with pytest.raises(ValueError, match="max_len must be > 0"):
        aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", max_len=torch.tensor(0))


def test_16_bit_inputs_count_tokens_exactly():
    # counts above 256 are not bfloat16 numbers: token counts, the clip_cov / kl_cov k and the fractions
    # are kept in float32
    g = torch.Generator().manual_seed(0)
    b, t = 4, 1500
    mask = torch.arange(t)[None, :] < torch.tensor([1500, 1201, 999, 1433])[:, None]
    old = (-torch.rand(b, t, generator=g) * 3).bfloat16()
    new = (old.float() + 0.3 * torch.randn(b, t, generator=g)).bfloat16()
    adv = torch.randn(b, 1, generator=g).expand(b, t).bfloat16()
    n = int(mask.sum())
    _, metrics = get_policy_loss("cispo")(new, old, adv, mask, clip_ratio_high=0.2)
    m = mask.bfloat16()
    ratio = torch.exp(((new * m) - (old * m)).clamp(-20, 20))
    # float32 quotients of the exact counts (a bfloat16 count would be off by up to 1/256)
    assert metrics["clip_frac_high"].item() == pytest.approx(((ratio > 1.2) & mask).sum().item() / n, rel=1e-6)
    _, metrics = get_policy_loss("kl_cov")(new, old, adv, mask, kl_cov_ratio=0.01)
    assert metrics["kl_cov_frac"].item() == pytest.approx(int(0.01 * n) / n, rel=1e-6)  # 51 of 5133 tokens
