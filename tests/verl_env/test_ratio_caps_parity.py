"""The ratio caps (rlhf_ext.algorithms.ratio_caps) against their references (runs in .venv-verl):

* ``dual_clip`` on ``ppo`` = verl 0.9.1's ``compute_policy_loss_vanilla`` with ``clip_ratio_c``, through
  verl's dispatch (``rlhf_ext_ppo``) in every aggregation mode and as the framework function;
* ``delta`` on ``ppo`` / ``gspo`` / ``luspo`` = TRL 1.16's ``GRPOTrainer._compute_loss`` with
  ``args.delta`` (token level for grpo / bnpo, ``importance_sampling_level="sequence"`` for GSPO and LUSPO),
  above and below ``1 + epsilon_high``;
* ``dual_clip`` on ``gspo`` / ``luspo`` = TRL with ``delta = c`` (one function of the ratio for
  ``c >= 1 + epsilon_high``; verl's own gspo has no dual clip);
* verl's ``clip_ratio_c`` (always set, default 3) reaches only ``rlhf_ext_ppo`` / ``rlhf_ext_bypass_mode``:
  ``rlhf_ext_gspo`` stays verl's ``gspo`` where a dual clip would bind.

Values and gradients, on random inputs where each cap binds on some tokens and not on others."""

from __future__ import annotations

import pytest
import torch

import verl  # noqa: F401  (loads the verl.plugins entry points, rlhf_ext's included)

from rlhf_ext.algorithms import aggregate_loss, get_policy_loss

from test_verl_losses_parity import B, LENGTHS, MODES, T, _actor, _close, _run, _trl_loss  # noqa: E402


def _inputs(seed, token_spread=0.6, row_shift=True):
    """Token ratios spread around rows shifted far above / below 1 (rows 0 and 3 above every cap tested, A < 0
    there), so a token and a sequence cap both bind somewhere and not everywhere."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENGTHS[:, None]).to(torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    shift = torch.tensor([[0.9], [-0.3], [0.0], [1.1], [0.05], [0.4]], dtype=torch.float64) if row_shift else 0.0
    new = old + shift + token_spread * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([[-1.5], [1.0], [0.5], [-2.0], [-0.7], [1.3]], dtype=torch.float64)
    adv = (adv + 0.1 * torch.randn(B, 1, generator=g, dtype=torch.float64)).expand(B, T).clone()
    return old, new, adv, mask


def _trl(loss_type, inputs, *, delta, level="token", epsilon_low=0.2, epsilon_high=0.2):
    return _trl_loss(loss_type, inputs, level=level, epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta=delta)


def _ours(name, inputs, mode, **options):
    old, new, adv, mask = inputs
    lp = new.clone().requires_grad_(True)
    per_token, metrics = get_policy_loss(name)(lp, old, adv, mask.bool(), **options)
    loss = aggregate_loss(per_token, mask.bool(), mode)
    return loss.detach(), torch.autograd.grad(loss, lp)[0], metrics


# TRL's loss_type -> the aggregation it uses (grpo: per-sequence mean; bnpo: token mean over the batch)
TRL_TOKEN = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean"}


@pytest.mark.parametrize("delta", [1.5, 1.1])  # above and below 1 + epsilon_high
@pytest.mark.parametrize("loss_type", sorted(TRL_TOKEN))
def test_ppo_delta_equals_trls_two_sided_clip(loss_type, delta):
    inputs = _inputs(seed=1, row_shift=False)
    ref_loss, ref_grad = _trl(loss_type, inputs, delta=delta, epsilon_low=0.2, epsilon_high=0.2)
    loss, grad, metrics = _ours("ppo", inputs, TRL_TOKEN[loss_type], delta=delta, clip_ratio_low=0.2)
    _close(loss, ref_loss)
    _close(grad, ref_grad)
    plain_loss, plain_grad = _trl(loss_type, inputs, delta=None)
    assert not torch.allclose(plain_grad, ref_grad)  # delta binds on these inputs
    assert 0 < float(metrics["delta_clip_frac"]) < 1


@pytest.mark.parametrize("delta", [1.6, 1.02])
@pytest.mark.parametrize("name, loss_type, mode", [("gspo", "grpo", "seq-mean-token-mean"),
                                                   ("luspo", "luspo", "seq-mean-token-mean")])
def test_sequence_losses_delta_equal_trls_sequence_level(name, loss_type, mode, delta):
    inputs = _inputs(seed=2, token_spread=0.2)
    ref_loss, ref_grad = _trl(loss_type, inputs, delta=delta, level="sequence", epsilon_low=0.02, epsilon_high=0.03)
    loss, grad, _ = _ours(name, inputs, mode, delta=delta, clip_ratio_low=0.02, clip_ratio_high=0.03)
    _close(loss, ref_loss)
    _close(grad, ref_grad)
    _, plain_grad = _trl(loss_type, inputs, delta=None, level="sequence", epsilon_low=0.02, epsilon_high=0.03)
    assert not torch.allclose(plain_grad, ref_grad)


@pytest.mark.parametrize("name, loss_type", [("gspo", "grpo"), ("luspo", "luspo")])
def test_sequence_losses_dual_clip_equal_trls_delta_of_the_same_value(name, loss_type):
    inputs = _inputs(seed=3, token_spread=0.2)
    ref_loss, ref_grad = _trl(loss_type, inputs, delta=1.8, level="sequence", epsilon_low=0.02, epsilon_high=0.03)
    loss, grad, metrics = _ours(name, inputs, "seq-mean-token-mean", dual_clip=1.8, clip_ratio_low=0.02,
                                clip_ratio_high=0.03)
    _close(loss, ref_loss)
    _close(grad, ref_grad)
    assert 0 < float(metrics["dual_clip_frac"]) < 1


@pytest.mark.parametrize("mode", MODES)
def test_ppo_dual_clip_equals_verls_clip_ratio_c(mode):
    old, new, adv, mask = inputs = _inputs(seed=4, row_shift=False, token_spread=0.8)
    cfg = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1.7)
    ref = _run("vanilla", old, new, adv, mask, mode, _actor("vanilla", **cfg))
    mine = _run("rlhf_ext_ppo", old, new, adv, mask, mode, _actor("rlhf_ext_ppo", **cfg))
    _close(mine[0], ref[0])
    _close(mine[1], ref[1])
    assert ref[2]["actor/pg_clipfrac_lower"] > 0  # verl's dual clip binds on these inputs
    # the framework function with the options under their rlhf_ext names
    loss, grad, metrics = _ours("ppo", inputs, mode, clip_ratio_low=0.2, clip_ratio_high=0.28, dual_clip=1.7)
    if mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):  # no global counts needed
        _close(loss, ref[0])
        _close(grad, ref[1])
    _close(metrics["dual_clip_frac"], ref[2]["actor/pg_clipfrac_lower"])


def test_verls_clip_ratio_c_reaches_only_the_losses_whose_verl_counterpart_applies_it():
    from rlhf_ext.patches.verl.policy_loss import loss_options

    cfg = _actor("rlhf_ext_gspo", clip_ratio_low=0.02, clip_ratio_high=0.03, clip_ratio_c=1.2)
    for name in ("ppo", "bypass_mode"):
        assert loss_options(cfg, get_policy_loss(name))["dual_clip"] == 1.2
    for name in ("gspo", "luspo"):
        assert "dual_clip" not in loss_options(cfg, get_policy_loss(name))
    old, new, adv, mask = _inputs(seed=5, token_spread=0.2)
    ref = _run("gspo", old, new, adv, mask, "seq-mean-token-mean", _actor("gspo", **{
        "clip_ratio_low": 0.02, "clip_ratio_high": 0.03, "clip_ratio_c": 1.2}))
    mine = _run("rlhf_ext_gspo", old, new, adv, mask, "seq-mean-token-mean", cfg)
    _close(mine[0], ref[0])
    _close(mine[1], ref[1])
    capped = _ours("gspo", (old, new, adv, mask), "seq-mean-token-mean", clip_ratio_low=0.02, clip_ratio_high=0.03,
                   dual_clip=1.2)
    assert not torch.allclose(capped[1], ref[1])  # a dual clip would have changed it
