"""Parity of issue 42's policy losses with verl 0.9.1 (runs in .venv-verl): ``dro``, ``gpg`` (the loss)
and ``bypass_mode``, and the rollout-correction metric ``k3_kl``.

``rlhf_ext_dro`` / ``rlhf_ext_gpg`` go through verl's own dispatch (``get_policy_loss_fn``) next to verl's
loss of the same name, on random inputs, in every aggregation mode: value and gradient. ``bypass_mode``
is rlhf_ext's framework function against verl's ``compute_policy_loss_bypass_mode`` (verl selects its
own loss in bypass mode, so ``rlhf_ext_bypass_mode`` is refused at start-up: checked here too).
"""

from __future__ import annotations

import pytest
import torch

import verl  # noqa: F401  (loads the verl.plugins entry points, rlhf_ext's included)
from omegaconf import OmegaConf
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos, rollout_corr_helper
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from rlhf_ext.algorithms import RolloutCorrection, get_policy_loss, rollout_correction
from rlhf_ext.algorithms.rollout_correction import rejection_thresholds

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
B, T = 6, 7
LENGTHS = torch.tensor([7, 3, 5, 1, 6, 4])


def _inputs(seed=0, spread=0.3, token_adv=True):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENGTHS[:, None]).to(torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    new = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, T if token_adv else 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    return old, new, adv, mask


def _actor(loss_mode, policy_loss=None, **kw) -> ActorConfig:
    kw.setdefault("clip_ratio", 0.2)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_torch_compile=False,
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy_loss or {})), **kw)


def _run(fn, inputs, mode, cfg):
    old, new, adv, mask = inputs
    lp = new.clone().requires_grad_(True)
    loss, metrics = fn(old, lp, adv, mask, mode, cfg)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def _close(a, b, tol=1e-10):
    assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=tol, rtol=1e-8), (a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("name, policy_loss", [("dro", {"dro_beta": 0.7}), ("dro", {"dro_beta": 0.05}),
                                               ("gpg", {})])
def test_dispatched_loss_equals_verls(name, policy_loss, mode, token_adv):
    inputs = _inputs(seed=3, spread=0.5, token_adv=token_adv)
    ref = _run(core_algos.get_policy_loss_fn(name), inputs, mode, _actor(name, policy_loss))
    ours = _run(core_algos.get_policy_loss_fn("rlhf_ext_" + name), inputs, mode, _actor("rlhf_ext_" + name, policy_loss))
    _close(ours[0], ref[0])
    _close(ours[1], ref[1])
    assert ours[1].abs().sum() > 0
    if name == "dro":
        _close(ours[2]["actor/ppo_kl"], ref[2]["actor/ppo_kl"])


def test_dro_penalty_pulls_back_and_vanishes_on_policy():
    old, new, adv, mask = _inputs(seed=4, spread=0.5)
    loss = get_policy_loss("dro")
    lp = new.clone().requires_grad_(True)
    per_token, metrics = loss(lp, old, adv, mask, dro_beta=2.0)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    _close(grad, (-adv + 2.0 * (new - old)) * mask)  # hand: d/dlog pi of -(A lp - beta/2 d^2)
    on = old.clone().requires_grad_(True)
    per_on, metrics_on = loss(on, old, adv, mask, dro_beta=2.0)
    (grad_on,) = torch.autograd.grad(per_on.sum(), on)
    _close(grad_on, -adv * mask)  # pg's gradient on-policy
    assert float(metrics_on["dro_penalty"]) == 0.0 < float(metrics["dro_penalty"])
    with pytest.raises(ValueError, match="dro_beta"):
        loss(new, old, adv, mask, dro_beta=0.0)


# ---- bypass_mode -------------------------------------------------------------------------------

BYPASS_CASES = [
    dict(loss_type="ppo_clip"),
    dict(loss_type="ppo_clip", rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4"),
    dict(loss_type="ppo_clip", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.02),
    dict(loss_type="reinforce"),  # verl's defaults: sequence IS truncated at 2
    dict(loss_type="reinforce", rollout_is=None),
    dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.3),
    dict(loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True),
    dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.5, rollout_rs="token_k2,seq_max_k2",
         rollout_rs_threshold="0.05,0.3"),
]


def _verl_bypass(inputs, mode, case, tokens):
    corr = RolloutCorrectionConfig(bypass_mode=True, **case)
    cfg = _actor("bypass_mode", {"rollout_correction": corr}, clip_ratio_low=0.15, clip_ratio_high=0.25,
                 clip_ratio_c=2.5, global_batch_info={"batch_num_tokens": tokens, "global_batch_size": B})
    return _run(core_algos.compute_policy_loss_bypass_mode, inputs, mode, cfg)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(BYPASS_CASES)))
def test_bypass_mode_equals_verls(case, mode):
    case = BYPASS_CASES[case]
    inputs = _inputs(seed=5, spread=0.6)
    rollout, new, adv, mask = inputs
    tokens = int(mask.sum())
    ref_loss, ref_grad, ref_metrics = _verl_bypass(inputs, mode, case, tokens)
    lp = new.clone().requires_grad_(True)
    per_token, metrics = get_policy_loss("bypass_mode")(lp, rollout, adv, mask.bool(), clip_ratio_low=0.15,
                                                         clip_ratio_high=0.25, dual_clip=2.5, **case)
    # verl's agg_loss with the counts verl's actor passes (the full response mask's), as on every host; in
    # seq-mean-token-mean verl divides each sequence by its kept tokens (rlhf_ext: by all its tokens)
    kept = mask
    if "rollout_rs" in case and mode == "seq-mean-token-mean":
        config = RolloutCorrection(rejection=rejection_thresholds(case["rollout_rs"], case["rollout_rs_threshold"]))
        kept = rollout_correction(new, rollout, mask.bool(), config).mask.to(mask.dtype)
        assert not torch.equal(kept, mask)
    loss = core_algos.agg_loss(per_token, kept, mode, batch_num_tokens=tokens, global_batch_size=B)
    _close(loss, ref_loss)
    _close(torch.autograd.grad(loss, lp)[0], ref_grad)
    if "rollout_rs" in case:
        rejected = float(metrics["rollout_corr/rejected_fraction"])
        _close(rejected, ref_metrics["rollout_corr/rollout_rs_masked_fraction"])
        assert 0 < rejected < 1  # the rejection did something on these inputs
    if case.get("rollout_is"):
        _close(float(metrics["rollout_corr/is_mean"]), ref_metrics["rollout_corr/rollout_is_mean"])


def test_bypass_mode_refuses_an_unknown_loss_type():
    rollout, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match="loss_type must be one of ppo_clip, reinforce"):
        get_policy_loss("bypass_mode")(new, rollout, adv, mask.bool(), loss_type="ppo")


def test_rlhf_ext_bypass_mode_is_refused_at_verl_start_up():
    from rlhf_ext.patches.verl.startup import config_problems

    config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"},
                               "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "rlhf_ext_bypass_mode"}}}})
    (problem,) = config_problems(config)
    assert "bypass_mode=true" in problem and "apply_bypass_mode" in problem
    config.actor_rollout_ref.actor.policy_loss.loss_mode = "rlhf_ext_dro"
    assert config_problems(config) == []


# ---- k3_kl ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spread", [0.3, 12.0, 40.0])
def test_k3_kl_equals_verls_including_extreme_ratios(spread):
    rollout, train, _, mask = _inputs(seed=6, spread=spread)
    train = train.clone()
    train[0, 0] = rollout[0, 0] + 30.0  # a log-ratio beyond the +-20 the weights are clamped to
    ref = rollout_corr_helper.compute_offpolicy_metrics(train, rollout, mask)
    ours = rollout_correction(train, rollout, mask.bool(), RolloutCorrection()).metrics
    _close(float(ours["k3_kl"]), ref["k3_kl"], tol=0)
    _close(float(ours["k1_kl"]), ref["kl"])
    assert ref["k3_kl"] > 1e10  # exp(30) / 26 tokens: the metric is not clamped


def test_gmpo_on_verl_averages_every_row_as_verls_geo_mean_with_an_emptied_row():
    # verl's rollout-correction rejection can empty a row; verl's geo_mean still counts it (torch.mean)
    old, new, adv, mask = _inputs(seed=7, spread=0.5, token_adv=False)
    mask = mask.clone()
    mask[2] = 0
    for mode in MODES:
        ref = _run(core_algos.get_policy_loss_fn("geo_mean"), (old, new, adv, mask), mode, _actor("geo_mean"))
        ours = _run(core_algos.get_policy_loss_fn("rlhf_ext_gmpo"), (old, new, adv, mask), mode,
                    _actor("rlhf_ext_gmpo"))
        _close(ours[0], ref[0])
        _close(ours[1], ref[1])


# ---- tir_optimal_token_baseline -------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("zero_tail", [True, False])
def test_tir_optimal_token_baseline_equals_verls(seed, with_is, zero_tail):
    import numpy as np

    from rlhf_ext.algorithms import optimal_token_baseline, tir_optimal_token_baseline

    g = torch.Generator().manual_seed(seed)
    Bn, Tn = 12, 16
    lengths = torch.randint(4, Tn + 1, (Bn,), generator=g)
    lengths[0] = Tn  # one longest row: the zero tail binds
    mask = (torch.arange(Tn)[None, :] < lengths[:, None]) & (torch.rand(Bn, Tn, generator=g) > 0.3)  # tool holes
    mask[0, :] = True
    mask[5] = False  # a row without a response token
    mask = mask.to(torch.float64)
    rewards = torch.randn(Bn, Tn, generator=g, dtype=torch.float64) * (torch.rand(Bn, Tn, generator=g) > 0.8)
    old = -torch.rand(Bn, Tn, generator=g, dtype=torch.float64) * 2
    sum_sq = torch.rand(Bn, Tn, generator=g, dtype=torch.float64) * 0.5
    weights = torch.rand(Bn, Tn, generator=g, dtype=torch.float64) * 2 if with_is else None
    uids = np.array([f"p{i % 3}" for i in range(Bn)], dtype=object)
    ref_adv, ref_ret = core_algos.compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, uids, old, sum_sq, rollout_is_weights=weights, handle_zero_tail=zero_tail)
    adv, ret = tir_optimal_token_baseline(rewards, mask, uids, old, sum_sq, is_weights=weights,
                                          handle_zero_tail=zero_tail)
    _close(adv, ref_adv)
    _close(ret * mask, ref_ret * mask)
    assert adv.abs().sum() > 0
    # the holes matter: the plain (positional) baseline gives other numbers on the same batch
    rows = mask.bool().any(-1)
    plain, _ = optimal_token_baseline(rewards[rows], mask[rows], uids[rows.numpy()], old[rows], sum_sq[rows],
                                      is_weights=None if weights is None else weights[rows],
                                      handle_zero_tail=zero_tail)
    assert not torch.allclose(plain, adv[rows])
