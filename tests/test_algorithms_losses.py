"""Policy losses and loss aggregation: hand-computed cases, the GSPO gradient identity,
the micro-batch denominator property, and bad input."""

import math

import pytest
import torch

from rlhf_ext.algorithms import LOSS_AGG_MODES, aggregate_loss, available_policy_losses, get_policy_loss, gspo, ppo

T = torch.tensor


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


def test_losses_registered():
    assert {"ppo", "gspo"} <= set(available_policy_losses())
    assert get_policy_loss("gspo") is gspo


# ---- ppo ----------------------------------------------------------------------------------

def test_ppo_hand_computed_clip_higher():
    ratios = T([[0.5, 0.9, 1.1, 1.5]])
    lp = torch.log(ratios)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    # positive advantage: clip at 1 + eps_high = 1.28 for ratio 1.5 -> loss = -1.28
    loss, m = ppo(lp, old, torch.ones_like(lp), mask, eps_low=0.2, eps_high=0.28)
    assert close(loss, [[-0.5, -0.9, -1.1, -1.28]])
    assert close(m["clip_frac_high"], 0.25) and close(m["clip_frac_low"], 0.0)
    # negative advantage: ratio 0.5 clipped at 0.8 -> loss = max(0.5, 0.8) = 0.8; 1.5 not clipped
    loss, m = ppo(lp, old, -torch.ones_like(lp), mask, eps_low=0.2, eps_high=0.28)
    assert close(loss, [[0.8, 0.9, 1.1, 1.5]])
    assert close(m["clip_frac_low"], 0.25) and close(m["clip_frac_high"], 0.0)
    assert close(m["ppo_kl"], -lp.mean())


def test_ppo_symmetric_by_default():
    lp = torch.log(T([[1.25]]))
    loss, _ = ppo(lp, torch.zeros_like(lp), T([[1.0]]), torch.ones(1, 1), eps_low=0.2)
    assert close(loss, [[-1.2]])


def test_ppo_dual_clip_bounds_negative_advantages():
    lp = torch.log(T([[10.0, 10.0, 2.0]]))
    adv = T([[-1.0, 1.0, -1.0]])
    loss, m = ppo(lp, torch.zeros_like(lp), adv, torch.ones_like(lp), eps_low=0.2, dual_clip=3.0)
    # A<0 ratio 10: plain loss 10 capped at 3; A>0 ratio 10 clipped at 1.2 -> -1.2; A<0 ratio 2: 2 < 3
    assert close(loss, [[3.0, -1.2, 2.0]])
    assert close(m["dual_clip_frac"], 1 / 3)
    with pytest.raises(ValueError, match="dual_clip must be a finite number > 1"):
        ppo(lp, torch.zeros_like(lp), adv, torch.ones_like(lp), dual_clip=1.0)


def test_ppo_log_ratio_clamp_prevents_overflow():
    lp = T([[200.0]])
    loss, _ = ppo(lp, T([[0.0]]), T([[-1.0]]), T([[1]]))
    assert torch.isfinite(loss).all() and close(loss, [[math.exp(20.0)]], tol=1e-3 * math.exp(20))


def test_ppo_gradient_zero_when_clipped():
    lp = torch.log(T([[1.5, 1.0]])).requires_grad_()
    loss, _ = ppo(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    loss.sum().backward()
    assert lp.grad[0, 0] == 0 and close(lp.grad[0, 1], -1.0)


def test_ppo_masked_positions_are_zero_even_if_padding_is_nan():
    lp = T([[0.1, float("nan")]])
    loss, m = ppo(lp, torch.zeros(1, 2), torch.ones(1, 2), T([[1, 0]]))
    assert loss[0, 1] == 0 and torch.isfinite(loss).all() and torch.isfinite(m["ppo_kl"])


# ---- gspo ---------------------------------------------------------------------------------

def test_gspo_value_is_sequence_ratio():
    lp = T([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    old = T([[-1.1, -2.3, 9.0], [-0.5, -0.5, -0.5]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    adv = T([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, m = gspo(lp, old, adv, mask, eps_low=0.5, eps_high=0.5)
    s0 = math.exp((0.1 + 0.3) / 2)
    assert close(loss, [[-s0, -s0, 0.0], [1.0, 1.0, 1.0]], tol=1e-5)
    assert close(m["clip_frac_high"], 0.0)
    # tight clip range: s0 = 1.2214 > 1 + 4e-4 with A > 0 -> clipped (2 of 5 tokens)
    loss, m = gspo(lp, old, adv, mask)
    assert close(loss[0, :2], [-(1 + 4e-4)] * 2, tol=1e-6)
    assert close(m["clip_frac_high"], 2 / 5)


def test_gspo_token_form_gradient_equals_sequence_objective_gradient():
    torch.manual_seed(0)
    B, Tn = 3, 5
    lp0 = torch.randn(B, Tn, dtype=torch.float64) * 0.05 - 1.0
    old = lp0 + torch.randn(B, Tn, dtype=torch.float64) * 0.01
    mask = T([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    adv_seq = T([0.7, -1.3, 2.0], dtype=torch.float64)
    adv = adv_seq[:, None].expand(B, Tn).clone()

    # token form, aggregated as GSPO does (seq-mean-token-mean), wide clip so nothing clips
    lp = lp0.clone().requires_grad_()
    per_tok, _ = gspo(lp, old, adv, mask, eps_low=0.9, eps_high=10.0)
    aggregate_loss(per_tok, mask, "seq-mean-token-mean").backward()

    # the sequence-level objective written directly
    lp_ref = lp0.clone().requires_grad_()
    mf = mask.to(torch.float64)
    s = torch.exp(((lp_ref - old) * mf).sum(1) / mf.sum(1))
    (-(adv_seq * s)).mean().backward()
    assert torch.allclose(lp.grad, lp_ref.grad, atol=1e-12)
    assert (lp.grad[mask == 0] == 0).all()


# ---- aggregation --------------------------------------------------------------------------

LOSS = T([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = T([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregation_hand_computed():
    assert close(aggregate_loss(LOSS, MASK, "token-mean"), 10 / 4)
    assert close(aggregate_loss(LOSS, MASK, "seq-mean-token-mean"), (2.0 + 4.0) / 2)
    assert close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum"), (6.0 + 4.0) / 2)
    assert close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm"), 10 / (4 * 2))
    assert close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", max_len=100), 10 / (100 * 2))


def test_aggregation_modes_agree_on_equal_lengths():
    torch.manual_seed(1)
    loss = torch.randn(4, 6, dtype=torch.float64)
    mask = torch.ones(4, 6)
    tm = aggregate_loss(loss, mask, "token-mean")
    assert close(aggregate_loss(loss, mask, "seq-mean-token-mean"), tm, tol=1e-12)
    assert close(aggregate_loss(loss, mask, "seq-mean-token-sum-norm"), tm, tol=1e-12)
    assert close(aggregate_loss(loss, mask, "seq-mean-token-sum"), 6 * tm, tol=1e-12)


def test_aggregation_modes_differ_on_unequal_lengths():
    values = {mode: aggregate_loss(LOSS, MASK, mode).item() for mode in LOSS_AGG_MODES}
    assert len(set(values.values())) == len(LOSS_AGG_MODES)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_denominators_sum_to_global_loss(mode):
    torch.manual_seed(2)
    B, Tn, max_len = 8, 7, 16
    loss = torch.randn(B, Tn, dtype=torch.float64)
    lengths = torch.randint(1, Tn + 1, (B,))
    mask = (torch.arange(Tn)[None, :] < lengths[:, None]).to(torch.float64)
    full = aggregate_loss(loss, mask, mode, max_len=max_len)
    counts = dict(num_tokens=mask.sum(), num_seqs=B, max_len=max_len)
    parts = [aggregate_loss(loss[i : i + 3], mask[i : i + 3], mode, **counts) for i in range(0, B, 3)]
    assert close(sum(parts), full, tol=1e-12)
    # without global counts the token-level modes do not add up: the point of the option
    # (a plain token sum needs no count)
    if mode not in ("seq-mean-token-mean", "token-sum"):
        naive = [aggregate_loss(loss[i : i + 3], mask[i : i + 3], mode, max_len=max_len) for i in range(0, B, 3)]
        assert not close(sum(naive), full, tol=1e-6)


def test_aggregation_bad_input():
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'.*token-mean"):
        aggregate_loss(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="no tokens"):
        aggregate_loss(LOSS, T([[1, 1, 0, 0], [0, 0, 0, 0]]), "seq-mean-token-mean")
    with pytest.raises(ValueError, match="shape mismatch"):
        aggregate_loss(LOSS, MASK[:, :3], "token-mean")
    with pytest.raises(ValueError, match="num_tokens must be > 0"):
        aggregate_loss(LOSS, MASK, "token-mean", num_tokens=0)
    with pytest.raises(ValueError, match="NaN"):
        aggregate_loss(T([[float("nan")]]), T([[1]]), "token-mean")


@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_losses_bad_input(name):
    fn = get_policy_loss(name)
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="shape mismatch: advantages"):
        fn(x, x, torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="no tokens"):
        fn(x, x, x, T([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="Inf"):
        fn(x, T([[0.0, float("-inf"), 0.0], [0.0, 0.0, 0.0]]), x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="eps_low"):
        fn(x, x, x, torch.ones(2, 3), eps_low=1.5)


def test_finite_checks_raise_on_direct_calls_and_defer_inside_the_guard():
    """Direct calls raise the check's ValueError; under ``deferred_finite_checks`` (what the guarded training
    step uses) the NaN flows into the result and the finding is recorded; shape errors still raise."""
    from rlhf_ext.algorithms import deferred_finite_checks

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    per_token = torch.tensor([[0.5, float("nan"), float("inf"), float("nan")], [1.0, float("nan"), 2.0, 3.0]])
    message = r"per_token_loss contains 2 NaN and 1 Inf value\(s\) \(first at index \(0, 1\)\)"
    with pytest.raises(ValueError, match=message):
        aggregate_loss(per_token, mask, "token-mean")
    with deferred_finite_checks() as findings:
        loss = aggregate_loss(per_token, mask, "token-mean")
        with pytest.raises(ValueError, match="shape mismatch"):
            aggregate_loss(per_token[:, :3], mask)
        with deferred_finite_checks() as inner:  # a nested block collects its own
            adv = torch.ones(2, 4)
            adv[1, 0] = float("nan")
            lp = torch.zeros(2, 4)
            ppo(lp, lp, adv, mask)
        from rlhf_ext.algorithms import maxrl

        with pytest.raises(ValueError, match="needs binary"):  # a finite non-binary score is still an error
            maxrl(torch.tensor([[0.5, 1.0]]))
        assert maxrl(torch.tensor([[float("nan"), 1.0]])).shape == (1, 2)  # NaN: the finite check's finding
    assert math.isnan(float(loss))
    assert findings[0] == {"name": "per_token_loss", "nan_count": 2, "inf_count": 1, "first_index": [0, 1]}
    assert findings[1]["name"] == "maxrl: scores" and len(findings) == 2
    assert inner == [{"name": "advantages", "nan_count": 1, "inf_count": 0, "first_index": [1, 0]}]
    with pytest.raises(ValueError, match="per_token_loss contains"):  # and outside again it raises
        aggregate_loss(per_token, mask, "token-mean")
