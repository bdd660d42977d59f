"""AReaL's decoupled PPO objective, its proximal log-prob approximation and M2PO (rlhf_ext.algorithms.staleness).

Hand-computed cases, invariants, and parity with a reference re-implemented here from AReaL's formulas
(``areal/utils/functional/functional.py: ppo_actor_loss_fn`` with ``rejection_sampling`` metric=ratio,
level=token; ``areal/trainer/ppo/actor.py: compute_prox_logp_approximations, _apply_m2po_masking``),
values and gradients on random inputs.
"""

import math

import pytest
import torch

from rlhf_ext.algorithms import aggregate_loss, get_advantage, get_policy_loss
from rlhf_ext.algorithms.staleness import (behaviour_weights, decoupled_objective, interpolation_weight, m2po_mask,
                                           proximal_log_probs)


# --- references re-implemented from AReaL's formulas ------------------------------------------------------


def areal_prox(old_logp, logprobs, versions, current_version, method):
    v_prox = current_version - 1
    v_b = versions.float()
    diff = current_version - v_b
    alpha = torch.where(diff > 0, (v_prox - v_b) / diff, torch.zeros_like(v_b)).clamp(0.0, 1.0)
    if method == "loglinear":
        return old_logp + alpha * (logprobs - old_logp)
    return torch.log((1 - alpha) * old_logp.exp() + alpha * logprobs.exp())


def areal_decoupled_ppo(logprobs, prox, behav, adv, mask, eps, eps_high, cap, action):
    count = mask.count_nonzero()
    w = torch.exp(prox.detach() - behav.detach())
    if action == "mask":
        mask = mask & (w <= cap)
    else:
        w = w.clamp(max=cap)
    w = torch.where(mask, w, 0.0)
    ratio = torch.where(mask, torch.exp(logprobs - prox), 0)
    clipped = ratio.clamp(1 - eps, 1 + eps_high)
    pg = torch.max(-adv * ratio, -adv * clipped) * w
    return torch.where(mask, pg, 0).sum() / count


def areal_m2po(old_logp, prox, mask, threshold):
    m2 = (old_logp - prox) ** 2
    flat = mask.view(-1)
    sel = m2.view(-1)[flat]
    s, idx = torch.sort(sel, descending=True, stable=True)
    n = s.numel()
    avg = s.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=s.dtype)
    below = torch.where(avg < threshold)[0]
    k = below[0].item() if len(below) else n - 1
    keep_sorted = torch.ones(n, dtype=torch.bool)
    keep_sorted[:k] = False
    out = torch.zeros_like(flat)
    out[flat] = keep_sorted[torch.argsort(idx)]
    return out.view_as(mask)


def _random(seed, b=6, t=9, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(b, t, generator=g) * 3 - 0.05
    prox = behav + torch.randn(b, t, generator=g) * spread
    lp = prox + torch.randn(b, t, generator=g) * 0.15
    adv = torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) > 0.25
    mask[:, 0] = True
    return behav, prox.clamp(max=-1e-3), lp.clamp(max=-1e-3), adv, mask


# --- hand-computed --------------------------------------------------------------------------------------


def test_interpolation_weight_hand_computed():
    like = torch.zeros(3, 2)
    alpha = interpolation_weight(torch.tensor([3.0, 5.0, 6.0]), 6, like)
    # (5 - 3) / (6 - 3) = 2/3; (5 - 5) / 1 = 0; v_theta == v_behav: 0
    assert torch.allclose(alpha[:, 0], torch.tensor([2 / 3, 0.0, 0.0]))
    assert torch.equal(alpha[:, 0], alpha[:, 1])
    with pytest.raises(ValueError, match="newer than the current version"):
        interpolation_weight(torch.tensor([7.0, 1.0, 1.0]), 6, like)
    with pytest.raises(ValueError, match="3 sequences"):
        interpolation_weight(torch.tensor([1.0, 2.0]), 6, like)


def test_proximal_log_probs_hand_computed():
    behav = torch.tensor([[-1.0], [math.log(0.2)]])
    cur = torch.tensor([[-0.4], [math.log(0.6)]])
    # loglinear, versions 3 and 4 at current 6: alpha 2/3 and 1/2
    out = proximal_log_probs(behav, cur, torch.tensor([3, 4]), 6, "loglinear")
    assert out[0, 0].item() == pytest.approx(-1.0 + 2 / 3 * 0.6)
    assert out[1, 0].item() == pytest.approx(0.5 * math.log(0.2) + 0.5 * math.log(0.6))
    lin = proximal_log_probs(behav, cur, torch.tensor([3, 4]), 6, "linear")
    assert lin[1, 0].item() == pytest.approx(math.log(0.4))  # (0.2 + 0.6) / 2
    # lag 0 (sync): the proximal policy is the behaviour policy; alpha 1 is the current one
    assert torch.equal(proximal_log_probs(behav, cur, 6, 6, "linear"), behav)
    assert torch.allclose(proximal_log_probs(behav, cur, 5, 6, "loglinear"), behav)
    with pytest.raises(ValueError, match="recompute"):
        proximal_log_probs(behav, cur, 5, 6, "recompute")


def test_proximal_log_probs_has_no_gradient():
    cur = torch.tensor([[-0.5]], requires_grad=True)
    out = proximal_log_probs(torch.tensor([[-1.0]]), cur, 2, 4, "loglinear")
    assert not out.requires_grad


def test_behaviour_weights_hand_computed():
    prox = torch.tensor([[math.log(2.0), math.log(8.0), 0.0]])
    behav = torch.zeros(1, 3)
    mask = torch.tensor([[True, True, False]])
    w, keep, m = behaviour_weights(prox, behav, mask, cap=5.0, action="mask")
    assert torch.allclose(w, torch.tensor([[2.0, 0.0, 0.0]]))
    assert keep.tolist() == [[True, False, False]]
    assert m["behave_imp_weight"].item() == pytest.approx(2.0)
    assert m["behave_approx_kl"].item() == pytest.approx(math.log(2.0))
    assert m["behave_capped_fraction"].item() == pytest.approx(0.5)
    w, keep, m = behaviour_weights(prox, behav, mask, cap=5.0, action="clamp")
    assert torch.allclose(w, torch.tensor([[2.0, 5.0, 0.0]]))
    assert keep.tolist() == [[True, True, False]]
    w, _, _ = behaviour_weights(prox, behav, mask, cap=None)
    assert torch.allclose(w, torch.tensor([[2.0, 8.0, 0.0]]))
    with pytest.raises(ValueError, match="> 1"):
        behaviour_weights(prox, behav, mask, cap=0.5)
    with pytest.raises(ValueError, match="unknown behaviour-weight action"):
        behaviour_weights(prox, behav, mask, action="drop")


def test_decoupled_ppo_hand_computed_value_and_gradient():
    # token 0: r = 1.1 inside the clip, w = 2 -> loss -2 * 1.1 * A, d/dlogp = -2 * 1.1
    # token 1: r = 1.5 > 1.2 with A = 1 -> clipped: loss -1.2 * w, no gradient
    prox = torch.tensor([[-1.0, -1.0]])
    behav = prox - torch.tensor([[math.log(2.0), math.log(3.0)]])
    lp = (prox + torch.tensor([[math.log(1.1), math.log(1.5)]])).requires_grad_()
    adv = torch.ones(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    per_token, metrics = decoupled_objective(get_policy_loss("ppo"), lp, prox, behav, adv, mask, cap=5.0,
                                             clip_ratio_low=0.2)
    assert per_token.tolist()[0] == pytest.approx([-2.2, -3.6])
    per_token.sum().backward()
    assert lp.grad.tolist()[0] == pytest.approx([-2.2, 0.0])
    assert metrics["decoupled/behave_imp_weight"].item() == pytest.approx(2.5)
    assert "clip_frac_high" in metrics


def test_m2po_mask_hand_computed():
    prox = torch.zeros(1, 5)
    behav = torch.tensor([[3.0, 2.0, 1.0, 0.0, 7.0]])  # squared: 9, 4, 1, 0 (and 49 on padding)
    mask = torch.tensor([[True, True, True, True, False]])
    # tau 2: all four 14/4 = 3.5 >= 2; without the 9: 5/3 < 2 -> mask one token
    keep, m = m2po_mask(behav, prox, mask, 2.0)
    assert keep.tolist() == [[False, True, True, True, False]]
    assert m["m2po/m2"].item() == pytest.approx(3.5)
    assert m["m2po/m2_kept"].item() == pytest.approx(5 / 3)
    assert m["m2po/masked_fraction"].item() == pytest.approx(0.25)
    # tau 1: 5/3 >= 1, 1/2 < 1 -> mask two
    assert m2po_mask(behav, prox, mask, 1.0)[0].tolist() == [[False, False, True, True, False]]
    # tau above the moment: nothing masked
    keep, m = m2po_mask(behav, prox, mask, 4.0)
    assert keep.tolist() == [[True, True, True, True, False]] and m["m2po/masked_fraction"].item() == 0
    # no suffix under tau: every token but the smallest is masked
    keep, _ = m2po_mask(torch.full((1, 3), 2.0), torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), 1.0)
    assert keep.sum().item() == 1
    with pytest.raises(ValueError, match="> 0"):
        m2po_mask(behav, prox, mask, 0.0)


# --- parity with AReaL's formulas on random inputs -----------------------------------------------------


@pytest.mark.parametrize("action", ["mask", "clamp"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoupled_ppo_equals_areal(seed, action):
    behav, prox, lp, adv, mask = _random(seed)
    lp1 = lp.clone().requires_grad_()
    lp2 = lp.clone().requires_grad_()
    per_token, _ = decoupled_objective(get_policy_loss("ppo"), lp1, prox, behav, adv, mask, cap=2.0, action=action,
                                       clip_ratio_low=0.2, clip_ratio_high=0.28)
    ours = aggregate_loss(per_token, mask, "token-mean")
    ref = areal_decoupled_ppo(lp2, prox, behav, adv, mask, 0.2, 0.28, 2.0, action)
    ours.backward()
    ref.backward()
    assert torch.allclose(ours, ref, atol=1e-6)
    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-6)
    assert lp1.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["loglinear", "linear"])
def test_proximal_approximation_equals_areal(method):
    behav, _, lp, _, _ = _random(3)
    versions = torch.tensor([0, 1, 2, 3, 4, 5])
    ours = proximal_log_probs(behav, lp, versions, 5, method)
    ref = areal_prox(behav, lp, versions[:, None].expand_as(behav), 5, method)
    assert torch.allclose(ours, ref, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.05, 0.3, 1.0])
def test_m2po_equals_areal(seed, threshold):
    behav, prox, _, _, mask = _random(seed, spread=0.8)
    keep, _ = m2po_mask(behav, prox, mask, threshold)
    assert torch.equal(keep, areal_m2po(behav, prox, mask, threshold))
    kept = ((behav - prox) ** 2)[keep]
    assert kept.mean() < threshold or keep.sum() == 1  # the invariant M2PO promises
    assert not bool((keep & ~mask).any())


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "dr_grpo", "reinforce_pp"])
def test_decoupled_and_m2po_take_any_estimator(estimator):
    behav, prox, lp, _, mask = _random(5)
    scores = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    adv = get_advantage(estimator)(scores).reshape(-1, 1).expand_as(mask).contiguous()
    keep, _ = m2po_mask(behav, prox, mask, 0.3)
    lp = lp.requires_grad_()
    per_token, _ = decoupled_objective(get_policy_loss("ppo"), lp, prox, behav, adv, keep, cap=5.0)
    aggregate_loss(per_token, mask, "token-mean").backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[~keep].abs().sum() == 0
