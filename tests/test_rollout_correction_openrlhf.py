"""Rollout correction inside OpenRLHF 0.11.2's actor (rlhf_ext.patches.openrlhf.rollout_correction):
OpenRLHF's is_correction_* flags for rlhf_ext's losses, rlhf_ext's --rlhf_ext.rollout_* flags for every loss."""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import (
    RolloutCorrection,
    aggregate_loss,
    apply_rollout_correction,
    get_policy_loss,
    openrlhf_correction,
    rollout_correction,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def actor_module(plugin_driver):
    from openrlhf.trainer.ray import ppo_actor

    return ppo_actor


def batch(seed=0, B=6, T=8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=g) * 2 - 0.05
    spread = torch.linspace(0.01, 0.6, B)[:, None]
    rollout = (old + torch.randn(B, T, generator=g) * spread).clamp(max=-1e-3)
    new = (old + torch.randn(B, T, generator=g) * 0.1)
    adv = torch.randn(B, T, generator=g)
    return new, old, adv, mask, rollout


def _args(**flags):
    return SimpleNamespace(rlhf_ext=SimpleNamespace(**flags))


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "pg"])
@pytest.mark.parametrize("level,mode,gating,threshold", [("token", "mask", "ratio", (0.5, 2.0)),
                                                          ("seq", "mask", "tv", (0.0, 0.05)),
                                                          ("token", "clip", "ratio", (0.8, 1.5))])
def test_openrlhf_flags_apply_to_registered_losses(actor_module, loss_type, level, mode, gating, threshold):
    loss_fn = actor_module.PolicyLoss(policy_loss_type=loss_type, is_correction_level=level, is_correction_mode=mode,
                                      is_correction_gating=gating, is_correction_threshold=list(threshold))
    loss_fn.configure("token-mean")
    new, old, adv, mask, rollout = batch(1)
    new.requires_grad_(True)
    loss, _, _, vllm_kl, filt = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)
    res = rollout_correction(old, rollout, mask, openrlhf_correction(level, mode, gating, threshold))
    per_token, _ = get_policy_loss(loss_type)(new, old, adv, mask, **loss_fn._call_kwargs)
    expected = aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean")
    torch.testing.assert_close(loss, expected)
    assert vllm_kl is not None and 0 < float(filt) < 1
    assert "rollout_corr/k3_kl" in loss_fn.last_metrics
    uncorrected = aggregate_loss(per_token, mask, "token-mean")
    assert not torch.allclose(loss, uncorrected)


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo"])
def test_rlhf_ext_flags_for_every_loss_and_bit_identity(actor_module, loss_type):
    from rlhf_ext.patches.openrlhf.policy_loss import registered_call_kwargs
    from rlhf_ext.patches.openrlhf.rollout_correction import configure

    new, old, adv, mask, rollout = batch(2)
    if loss_type == "gspo":
        adv = adv[:, :1].expand_as(adv).contiguous()
    args = _args(rollout_is="sequence", rollout_is_threshold="3.0", rollout_rs="seq_max_k3,token_k1",
                 rollout_rs_threshold="0.05,2.0")
    plain = actor_module.PolicyLoss(policy_loss_type=loss_type)
    plain.configure("token-mean")
    base = plain(new, old, adv, action_mask=mask)[0]

    corrected = actor_module.PolicyLoss(policy_loss_type=loss_type)
    corrected.configure("token-mean")
    configure(corrected, args, registered_call_kwargs)
    assert corrected._registered_fn is not None
    # identical rollout and training log-probs: the loss is the uncorrected one, bit for bit
    same = corrected(new, old, adv, action_mask=mask, rollout_log_probs=old.clone())
    per_token, _ = get_policy_loss(loss_type)(new, old, adv, mask, **corrected._call_kwargs)
    assert torch.equal(same[0], aggregate_loss(per_token, mask, "token-mean"))
    if loss_type == "ppo":
        torch.testing.assert_close(same[0], base)  # OpenRLHF's ppo and rlhf_ext's ppo: the same formula
    m = corrected.last_metrics
    assert float(m["rollout_corr/weight_mean"]) == 1.0 and float(m["rollout_corr/rejected_fraction"]) == 0.0
    # a real mismatch: weights move, some sequences are rejected
    out = corrected(new, old, adv, action_mask=mask, rollout_log_probs=rollout)
    m = corrected.last_metrics
    assert 0 < float(m["rollout_corr/seq_rejected_fraction"]) < 1 and float(out[4]) == float(m["rollout_corr/seq_rejected_fraction"])


def test_bypass_uses_rollout_as_behaviour_policy(actor_module):
    from rlhf_ext.patches.openrlhf.policy_loss import registered_call_kwargs
    from rlhf_ext.patches.openrlhf.rollout_correction import configure

    new, old, adv, mask, rollout = batch(3)
    loss_fn = actor_module.PolicyLoss(policy_loss_type="ppo")
    loss_fn.configure("token-mean")
    configure(loss_fn, _args(rollout_is="token", rollout_correction_bypass=True), registered_call_kwargs)
    loss = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    res = rollout_correction(new, rollout, mask, RolloutCorrection(is_level="token", is_threshold=2.0))
    per_token, _ = get_policy_loss("ppo")(new, rollout, adv, mask, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss, aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean"))


def test_missing_rollout_log_probs_is_named(actor_module):
    from rlhf_ext.patches.openrlhf.policy_loss import registered_call_kwargs
    from rlhf_ext.patches.openrlhf.rollout_correction import configure

    new, old, adv, mask, _ = batch(4)
    loss_fn = actor_module.PolicyLoss(policy_loss_type="pg")
    loss_fn.configure("token-mean")
    configure(loss_fn, _args(rollout_is="token"), registered_call_kwargs)
    with pytest.raises(ValueError, match="needs vLLM's log-probs"):
        loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=None)


def test_flags_parse_and_request_vllm_log_probs(parse):
    args = parse("--rlhf_ext.rollout_is", "geometric", "--rlhf_ext.rollout_is_threshold", "0.5_2",
                 "--rlhf_ext.rollout_rs", "seq_mean_k3", "--rlhf_ext.rollout_rs_threshold", "0.001")
    assert args.rlhf_ext.rollout_is == "geometric"
    assert args.rlhf_ext.mismatch_metrics is True  # its seams ask vLLM for the sampled tokens' log-probs


@pytest.mark.parametrize("argv, message", [
    (["--rlhf_ext.rollout_rs", "seq_mean_k3"], "needs --rlhf_ext.rollout_rs_threshold"),
    (["--rlhf_ext.rollout_rs", "seq_mean_k9", "--rlhf_ext.rollout_rs_threshold", "1"], "unknown rejection option"),
    (["--rlhf_ext.rollout_correction_bypass"], "need --rlhf_ext.rollout_is"),
    (["--rlhf_ext.rollout_is", "token", "--algo.advantage.is_correction_level", "token"], "choose one"),
    (["--rlhf_ext.rollout_is", "token", "--rollout.top_p", "0.9"], "top-p-truncated"),
    (["--algo.advantage.is_correction_level", "token", "--actor.policy_loss_type", "cispo", "--rollout.top_p", "0.9"],
     "top-p-truncated"),
    (["--rlhf_ext.rollout_is", "token", "--rlhf_ext.rollout_is_threshold", "2_1"], "lower 2.0 > upper 1.0"),
])  # fmt: skip
def test_bad_flags_are_argparse_errors(parse, capfd, argv, message):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capfd.readouterr().err


def test_openrlhf_own_correction_with_top_p_is_only_warned(parse, capfd):
    args = parse("--algo.advantage.is_correction_level", "token", "--rollout.top_p", "0.9")
    assert args.rollout.top_p == 0.9
    assert "rlhf_ext: warning: rollout correction with --rollout.top_p 0.9" in capfd.readouterr().err


@pytest.mark.parametrize("certainty", ["sure", "unsure"])
def test_the_injected_test_mismatch_rejects_the_same_share_whatever_the_models_confidence(certainty):
    """The e2e test's hook (RLHF_EXT_TEST_ROLLOUT_LOGPROB_NOISE=SIGMA@BATCH) lowers each response token's rollout
    log-prob by |N(0, SIGMA^2)|: a token's ratio leaves [0.5, 2] with P(|e| > ln 2) = 0.488 for SIGMA 1, for a
    model sure of its tokens (log-prob 0) as for an unsure one. The old symmetric noise clamped at 0 gave the sure
    model 0.244 and CI's e2e run 0.174 against its bound 0.2."""
    from rlhf_ext.patches.openrlhf.rollout_correction import TEST_NOISE_ENV, inject_test_mismatch

    B, T = 64, 64
    lengths = torch.arange(B) % T + 1
    mask = torch.arange(T)[None, :] < lengths[:, None]
    lp = torch.zeros(B, T) if certainty == "sure" else torch.full((B, T), -3.0)
    experiences = [SimpleNamespace(rollout_log_probs=lp.clone(), action_mask=mask.long())]

    assert not inject_test_mismatch(experiences, 2, environ={})
    assert not inject_test_mismatch(experiences, 1, environ={TEST_NOISE_ENV: "1.0@2"})
    assert torch.equal(experiences[0].rollout_log_probs, lp)
    with pytest.raises(ValueError, match=TEST_NOISE_ENV):
        inject_test_mismatch(experiences, 2, environ={TEST_NOISE_ENV: "1.0"})

    assert inject_test_mismatch(experiences, 2, environ={TEST_NOISE_ENV: "1.5@2"})
    rollout = experiences[0].rollout_log_probs
    drop = torch.randn(B, T, generator=torch.Generator().manual_seed(1002)).abs() * 1.5  # the hook's seed: 1000 + batch
    assert torch.equal(rollout[mask], (lp - drop)[mask])
    assert torch.equal(rollout[~mask], lp[~mask])  # padding untouched

    experiences[0].rollout_log_probs = lp.clone()
    inject_test_mismatch(experiences, 3, environ={TEST_NOISE_ENV: "1.0@2"})
    res = rollout_correction(lp, experiences[0].rollout_log_probs, mask,
                             RolloutCorrection(rejection={"token_k1": "0.5_2.0"}))
    n = int(mask.sum())
    assert abs(float(res.metrics["rejected_fraction"]) - 0.4882) < 4 * (0.4882 * 0.5118 / n) ** 0.5


# --- OpenRLHF's flags as typed, through its real parser and post-parse code, into the actor's loss ---------

RECIPE_TIS = ["--algo.advantage.estimator", "passk", "--algo.advantage.passk_k", "2", "--rollout.n_samples_per_prompt",
              "4", "--actor.policy_loss_type", "noclip", "--algo.advantage.is_correction_level", "token",
              "--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_threshold", "2.0"]


def actor_loss(actor_module, args):
    """The loss the patched ActorPPOTrainer builds and configures from ``args`` (ppo_actor.py, policy_loss.py)."""
    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

    a = args.algo.advantage
    loss_fn = actor_module.PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0], clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip, token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type, is_correction_level=a.is_correction_level,
        is_correction_mode=a.is_correction_mode, is_correction_gating=a.is_correction_gating,
        is_correction_threshold=a.is_correction_threshold,
    )  # fmt: skip
    configure_from_args(loss_fn, args)
    return loss_fn


def test_recipe_tis_one_value_with_an_rlhf_ext_loss(parse, actor_module):
    """Issue 38: this recipe failed at start-up with 'is_clamp_low must be a positive number, got 0.0'."""
    args = parse(*RECIPE_TIS, full=True)
    assert args.algo.advantage.is_correction_threshold == [0.0, 2.0]  # OpenRLHF's own rewrite of HIGH alone
    loss_fn = actor_loss(actor_module, args)
    assert loss_fn._registered_fn is not None
    assert loss_fn.rollout_correction == (RolloutCorrection(is_level="token", is_threshold=2.0), False)
    new, old, adv, mask, rollout = batch(5)
    loss, _, _, vllm_kl, filt = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(is_level="token", is_threshold=2.0))
    per_token, _ = get_policy_loss("noclip")(new, old, adv, mask, **loss_fn._call_kwargs)
    torch.testing.assert_close(loss, aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean"))
    ratio = (old - rollout).exp()[mask]
    assert float(filt) == pytest.approx(float((ratio > 2.0).float().mean()))  # truncated share, hand-counted
    assert 0 < float(filt) < 1 and float(res.weights.max()) == 2.0


@pytest.mark.parametrize("loss_type", ["noclip", "cispo"])
@pytest.mark.parametrize("flags", [
    ["--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_threshold", "0.5", "2"],
    ["--algo.advantage.is_correction_threshold", "2"],
    ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "1.2"],
    ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_threshold", "0.8", "1.2"],
    ["--algo.advantage.is_correction_gating", "binary_kl", "--algo.advantage.is_correction_threshold", "0.01"],
    ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_gating", "tv",
     "--algo.advantage.is_correction_threshold", "0", "0.05"],
])  # fmt: skip
def test_every_threshold_form_parses_and_configures(parse, actor_module, loss_type, flags):
    argv = ["--algo.advantage.estimator", "maxrl", "--rollout.n_samples_per_prompt", "4", "--actor.policy_loss_type",
            loss_type, "--algo.advantage.is_correction_level", "token", *flags]
    args = parse(*argv, full=True)
    a = args.algo.advantage
    loss_fn = actor_loss(actor_module, args)
    expected = openrlhf_correction(a.is_correction_level, a.is_correction_mode, a.is_correction_gating,
                                   a.is_correction_threshold)
    assert loss_fn.rollout_correction == (expected, False) and expected.active
    new, old, adv, mask, rollout = batch(6)
    loss = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    assert torch.isfinite(loss)


@pytest.mark.parametrize("flags, message", [
    (["--algo.advantage.is_correction_threshold", "2", "0.5"], "lower bound 2.0 > upper bound 0.5"),
    (["--algo.advantage.is_correction_threshold", "0"], "upper bound must be > 0"),
    (["--algo.advantage.is_correction_mode", "clip", "--algo.advantage.is_correction_gating", "tv"], "clip requires"),
    (["--algo.advantage.is_correction_gating", "tv"], "upper bound only"),  # OpenRLHF's default band 0.5 5
])  # fmt: skip
def test_bad_correction_flags_with_an_rlhf_ext_loss_fail_in_the_driver(parse, capfd, flags, message):
    with pytest.raises(SystemExit) as exc:
        parse("--actor.policy_loss_type", "noclip", "--algo.advantage.is_correction_level", "token", *flags)
    assert exc.value.code == 2
    err = capfd.readouterr().err
    assert message in err and "--algo.advantage.is_correction_" in err and "--actor.policy_loss_type noclip" in err
