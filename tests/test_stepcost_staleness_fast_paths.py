"""Issue 42's loss-cost check: the fast paths of ``ppo``, the decoupled objective and M2PO keep every value.

* ``ppo``'s closed form (``rlhf_ext.algorithms.ppo_closed_form``) against the same loss through autograd:
  loss, gradient and metrics ``torch.equal`` (ties inside the clip range, the log-ratio clamp binding, dual
  clip, ``delta``, float32 / float64 / bfloat16, a weighted upstream gradient);
* the decoupled weights' product form against the ``where`` form (mask / clamp / no cap, a log-ratio that
  overflows ``exp``), and the objective's loss and gradient;
* M2PO's two-histogram selection against the sort of every candidate (``_m2po_mask_exact``) and AReaL's rule;
* OpenRLHF's patched loss with ``--rlhf_ext.step_metrics off`` computes none of the objectives' metrics and
  returns the same loss and gradient.
"""

import itertools
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import aggregate_loss, get_policy_loss, only_metrics, staleness
from rlhf_ext.algorithms.ppo_losses import _ppo_autograd
from rlhf_ext.algorithms.staleness import _behaviour_weights_exact, _m2po_mask_exact, behaviour_weights, m2po_mask

from test_algorithms_staleness import areal_m2po


def _ppo_inputs(seed, dtype, spread):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 50
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[:, 0] = True
    old = (-torch.rand(b, t, generator=g) * 3).to(dtype)
    new = (old.float() + spread * torch.randn(b, t, generator=g)).to(dtype)
    adv = torch.randn(b, t, generator=g).to(dtype)
    adv[:, 5] = 0.0
    new[0, :10] = old[0, :10]  # ratio exactly 1
    new[1, 3] = old[1, 3] + 30  # the +-20 log-ratio clamp binds
    return new, old, adv, mask, torch.rand(b, t, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_ppo_closed_form_equals_autograd_bit_for_bit(dtype):
    cases = itertools.product(range(3), [None, 3.0], [None, 1.1, 2.0], [0.05, 0.5])
    for seed, dual, delta, spread in cases:
        new, old, adv, mask, upstream = _ppo_inputs(seed, dtype, spread)
        a, b = new.clone().requires_grad_(), new.clone().requires_grad_()
        fast, fast_metrics = get_policy_loss("ppo")(a, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28,
                                                    dual_clip=dual, delta=delta)
        ref, ref_metrics = _ppo_autograd(b, old, adv, mask, 0.2, 0.28, dual, 20.0, delta)
        assert fast.grad_fn is not None and type(fast.grad_fn).__name__ != type(ref.grad_fn).__name__
        assert torch.equal(fast, ref)
        assert set(fast_metrics) == set(ref_metrics)
        for key, value in fast_metrics.items():
            assert torch.equal(value, ref_metrics[key]) and value.dtype == ref_metrics[key].dtype, key
        (fast * upstream).sum().backward()
        (ref * upstream).sum().backward()
        assert torch.equal(a.grad, b.grad), (seed, dual, delta, spread)
        assert a.grad.abs().sum() > 0 and not a.grad[~mask].any()


def test_ppo_closed_form_asks_only_for_the_requested_metrics():
    new, old, adv, mask, _ = _ppo_inputs(0, torch.float32, 0.3)
    with only_metrics(("clip_frac_low", "clip_frac_high", "ppo_kl")):
        _, metrics = get_policy_loss("ppo")(new, old, adv, mask)
    assert set(metrics) == {"clip_frac_low", "clip_frac_high", "ppo_kl"}


def _weights_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 60
    mask = torch.rand(b, t, generator=g) > 0.25
    mask[:, 0] = True
    behav = -torch.rand(b, t, generator=g) * 3
    prox = behav + torch.randn(b, t, generator=g)
    prox[2, 4] = behav[2, 4] + 95.0  # exp overflows float32 on a response token
    prox[3, ~mask[3]] = behav[3, ~mask[3]] + 120.0  # and on the padding
    return prox, behav, mask


@pytest.mark.parametrize("cap, action", [(5.0, "mask"), (2.0, "clamp"), (None, "mask"), (1.5, "mask")])
def test_decoupled_weights_fast_path_equals_the_where_form(cap, action):
    for seed in range(4):
        prox, behav, mask = _weights_inputs(seed)
        if cap is None:  # an uncapped inf weight stays inf on both paths; keep this case finite
            prox[2, 4] = behav[2, 4]
        weight, keep, metrics = behaviour_weights(prox, behav, mask, cap=cap, action=action)
        ref_weight, ref_keep, ref_metrics = _behaviour_weights_exact(prox, behav, mask, cap, action)
        assert torch.equal(weight, ref_weight) and torch.equal(keep, ref_keep)
        assert set(metrics) == set(ref_metrics)
        for key, value in metrics.items():
            assert torch.equal(value, ref_metrics[key]), key
        if cap is not None and action == "mask":
            assert not keep[2, 4] and float(metrics["behave_capped_fraction"]) > 0


def test_decoupled_objective_loss_and_gradient_unchanged():
    prox, behav, mask = _weights_inputs(1)
    g = torch.Generator().manual_seed(9)
    new = prox + 0.1 * torch.randn(prox.shape, generator=g)
    adv = torch.randn(prox.shape, generator=g)
    for name in ("ppo", "cispo", "gspo"):
        a, b = new.clone().requires_grad_(), new.clone().requires_grad_()
        per_token, _ = staleness.decoupled_objective(get_policy_loss(name), a, prox, behav, adv, mask, cap=3.0)
        loss_ref, _ = get_policy_loss(name)(b, prox, adv, mask)
        weight, keep, _ = _behaviour_weights_exact(prox, behav, mask, 3.0, "mask")
        ref = torch.where(keep, loss_ref * weight, torch.zeros_like(loss_ref))
        assert torch.equal(per_token, ref), name
        aggregate_loss(per_token, mask).backward()
        aggregate_loss(ref, mask).backward()
        assert torch.equal(a.grad, b.grad), name
    with only_metrics(()):
        _, metrics = staleness.decoupled_objective(get_policy_loss("ppo"), new, prox, behav, adv, mask)
    assert metrics == {}


def _m2po_inputs(seed, kind):
    g = torch.Generator().manual_seed(seed)
    b, t = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(2, 600, (1,), generator=g))
    mask = torch.rand(b, t, generator=g) > 0.6 * float(torch.rand(1, generator=g))
    mask[:, 0] = True
    prox = -torch.rand(b, t, generator=g) * 3
    if kind == "noise":
        behav = prox + 0.1 * torch.randn(b, t, generator=g)
    elif kind == "outliers":
        behav = prox + 0.01 * torch.randn(b, t, generator=g)
        behav[torch.rand(b, t, generator=g) < 0.01] -= 3.0
    else:  # many equal squared log-ratios
        behav = prox + torch.round(torch.randn(b, t, generator=g) * 4) / 8
    return behav, prox, mask


@pytest.mark.parametrize("kind", ["noise", "outliers", "ties"])
def test_m2po_selection_equals_sorting_every_candidate_and_areal(kind, monkeypatch):
    selected = []
    original = staleness._m2po_candidates
    monkeypatch.setattr(staleness, "_m2po_candidates", lambda *a: selected.append(original(*a)) or selected[-1])
    for seed in range(40):
        behav, prox, mask = _m2po_inputs(seed, kind)
        for threshold in (1e-3, 0.005, 0.02, 0.1):
            keep, metrics = m2po_mask(behav, prox, mask, threshold)
            ref_keep, ref_metrics = _m2po_mask_exact(behav, prox, mask, threshold)
            m2 = (behav.double() - prox.double()) ** 2
            # the same masked values; with equal values at the cut, the first in row-major order are masked
            assert torch.equal(m2[mask & ~keep].sort()[0], m2[mask & ~ref_keep].sort()[0]), (seed, threshold)
            if kind != "ties":
                assert torch.equal(keep, ref_keep), (seed, threshold)
            elif not keep[mask].all():
                cut = m2[mask & ~keep].min()
                tied = (m2 == cut) & mask
                masked_tied = (tied & ~keep).view(-1).nonzero().view(-1)
                assert torch.equal(masked_tied, tied.view(-1).nonzero().view(-1)[:masked_tied.numel()])
            assert torch.equal(metrics["m2po/m2"], ref_metrics["m2po/m2"])
            assert torch.equal(metrics["m2po/masked_fraction"], ref_metrics["m2po/masked_fraction"])
            # the kept moment: the same up to float64 rounding (a sum in another order), then cast to float32
            torch.testing.assert_close(metrics["m2po/m2_kept"], ref_metrics["m2po/m2_kept"], rtol=1e-6, atol=1e-12)
            if kind != "ties":  # AReaL's unstable sort leaves equal values at the cut open
                assert torch.equal(keep, areal_m2po(behav, prox, mask, threshold))
    assert sum(found is not None for found in selected) >= 40  # the histogram path ran, not only its fallback


def test_m2po_non_finite_padding_and_empty_rows_take_the_exact_path():
    behav, prox, mask = _m2po_inputs(3, "noise")
    behav = behav.clone()
    behav[~mask] = float("nan")
    keep, _ = m2po_mask(behav, prox, mask, 0.005)
    assert torch.equal(keep, _m2po_mask_exact(behav, prox, mask, 0.005)[0])
    behav[mask.nonzero()[0].tolist()] = float("inf")
    with pytest.raises(ValueError, match="behaviour_log_probs contains"):
        m2po_mask(behav, prox, mask, 0.005)
    mask = mask.clone()
    mask[0] = False
    with pytest.raises(ValueError, match="no tokens"):
        m2po_mask(prox, prox, mask, 0.005)


@pytest.fixture(scope="module")
def patched():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ray import ppo_actor

    yield ppo_actor
    deactivate()


@pytest.mark.parametrize("row", ["ppo+decoupled", "ppo+m2po", "cispo+m2po", "bypass_mode"])
def test_step_metrics_off_computes_no_objective_metric(patched, row):
    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args
    from rlhf_ext.patches.openrlhf.staleness import take_metrics

    name, _, objective = row.partition("+")
    behav, prox, mask = _m2po_inputs(5, "noise")
    g = torch.Generator().manual_seed(2)
    new = prox + 0.05 * torch.randn(prox.shape, generator=g)
    adv = torch.randn(prox.shape[0], 1, generator=g).expand_as(prox).contiguous()
    outs = {}
    for setting in ("all", "off"):
        loss_fn = patched.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=name)
        flags = {"decoupled": dict(decoupled_loss=True), "m2po": dict(m2po_threshold=0.005)}.get(objective, {})
        configure_from_args(loss_fn, SimpleNamespace(
            actor=SimpleNamespace(loss_agg_mode="token-mean", policy_loss_type=name, loss_agg_max_len=None,
                                  policy_loss_option=None),
            rlhf_ext=SimpleNamespace(step_metrics=setting, **flags)))
        lp = new.clone().requires_grad_()
        out = loss_fn(lp, prox, adv, action_mask=mask, rollout_log_probs=behav, dp_size=1,
                      batch_num_tokens=mask.sum().float(), global_batch_size=torch.tensor(float(mask.shape[0])))
        out[0].backward()
        metrics = {**getattr(loss_fn, "last_metrics", {}), **take_metrics(loss_fn)}
        outs[setting] = (out[0].detach(), out[1], out[2], lp.grad, metrics)
    (loss_on, clip_on, kl_on, grad_on, on), (loss_off, clip_off, kl_off, grad_off, off) = outs.values()
    assert torch.equal(loss_on, loss_off) and torch.equal(grad_on, grad_off)
    assert torch.equal(clip_on, clip_off) and torch.equal(kl_on, kl_off)
    assert off == {}
    if objective:
        assert any(key.startswith(objective) for key in on), sorted(on)
