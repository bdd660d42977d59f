"""PolicyLoss inside OpenRLHF's actor with the plugin: every loss type x every aggregation mode.

OpenRLHF's own losses with OpenRLHF's own modes must be bit-identical to the unpatched class;
the new modes and the registered losses are checked against rlhf_ext.algorithms.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from rlhf_ext.algorithms import LOSS_AGG_MODES, aggregate_loss, get_policy_loss, ppo, register_policy_loss
from rlhf_ext.algorithms.registry import POLICY_LOSSES


@pytest.fixture(scope="module")
def actor_module():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ray import ppo_actor

    yield ppo_actor
    deactivate()


@pytest.fixture(scope="module")
def OriginalPolicyLoss(actor_module):
    from openrlhf.models.loss import PolicyLoss  # the name in openrlhf.models is left alone

    assert actor_module.PolicyLoss is not PolicyLoss and issubclass(actor_module.PolicyLoss, PolicyLoss)
    return PolicyLoss


@pytest.fixture()
def test_loss_registered():
    register_policy_loss("test_plugin_ppo")(ppo)
    try:
        yield "test_plugin_ppo"
    finally:
        POLICY_LOSSES.unregister("test_plugin_ppo")


def batch(seed=0, B=5, T=7, empty_row=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lengths[2] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(B, T, generator=g) * 3
    new = (old + torch.randn(B, T, generator=g) * 0.4).requires_grad_()
    adv = torch.randn(B, T, generator=g)
    rollout = old + torch.randn(B, T, generator=g) * 0.05
    return new, old, adv, mask, rollout


def global_info(mask, dp_size=2, gas=2):
    # what OpenRLHF's iter_grad_accum_global_norm hands the loss: global counts / gas
    return {
        "dp_size": dp_size,
        "batch_num_tokens": mask.sum().float() * dp_size / gas,
        "global_batch_size": (mask.sum(-1) > 0).sum().float() * dp_size / gas,
    }


def run(loss_fn, new, old, adv, mask, rollout=None, info=None):
    new = new.detach().clone().requires_grad_()
    out = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout, **(info or {}))
    out[0].backward()
    return out, new.grad


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("extra", [{}, {"dual_clip": 3.0}, {"is_correction_level": "token"}])
@pytest.mark.parametrize("global_counts", [True, False])
def test_openrlhf_losses_and_modes_are_bit_identical(actor_module, OriginalPolicyLoss, loss_type, mode, extra, global_counts):
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, token_level_loss=mode == "token-mean", policy_loss_type=loss_type)
    kwargs.update(extra)
    ours = actor_module.PolicyLoss(**kwargs)
    ours.configure(mode)
    theirs = OriginalPolicyLoss(**kwargs)
    new, old, adv, mask, rollout = batch(seed=1)
    info = global_info(mask) if global_counts else None
    (o_out, o_grad), (t_out, t_grad) = run(ours, new, old, adv, mask, rollout, info), run(theirs, new, old, adv, mask, rollout, info)
    for a, b in zip(o_out, t_out):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(o_grad, t_grad)
    assert set(ours.last_metrics) >= {"clip_frac_low", "clip_frac_high"}


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("global_counts", [True, False])
def test_openrlhf_losses_with_new_modes_match_aggregate_loss(actor_module, loss_type, mode, global_counts):
    eps = (0.2, 0.28) if loss_type == "ppo" else (3e-4, 4e-4)
    loss_fn = actor_module.PolicyLoss(clip_eps_low=eps[0], clip_eps_high=eps[1], policy_loss_type=loss_type)
    loss_fn.configure(mode, max_len=16)
    new, old, adv, mask, _ = batch(seed=2)
    if loss_type == "gspo":
        adv = adv[:, :1].expand_as(adv).contiguous()  # GSPO's advantages are per sequence
    info = global_info(mask) if global_counts else {}
    (loss, *_), _ = run(loss_fn, new, old, adv, mask, info=info)
    per_token, _ = get_policy_loss(loss_type)(new.detach(), old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    num_seqs = info["global_batch_size"] if global_counts else None
    expected = aggregate_loss(per_token, mask, mode, num_seqs=num_seqs, max_len=16) * (info.get("dp_size", 1))
    torch.testing.assert_close(loss, expected)


def test_dr_grpo_normaliser_hand_computed(actor_module):
    # ratio 1 everywhere: the PPO loss per token is -A
    loss_fn = actor_module.PolicyLoss(policy_loss_type="ppo").configure("seq-mean-token-sum-norm", max_len=4)
    lp = torch.zeros(2, 4, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    loss, *_ = loss_fn(lp, lp.detach(), adv, action_mask=mask)
    # sum(mask * -A) / (max_len * num_seqs) = (-2 + 6) / (4 * 2)
    assert float(loss.detach()) == pytest.approx(0.5)
    loss.backward()
    # the gradient of a token does not depend on its sequence's length
    assert torch.equal(lp.grad, -adv * mask / 8)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("global_counts", [True, False])
def test_registered_loss_every_mode(actor_module, test_loss_registered, mode, global_counts):
    loss_fn = actor_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, policy_loss_type=test_loss_registered)
    loss_fn.configure(mode, max_len=9)
    new, old, adv, mask, _ = batch(seed=3, empty_row=True)
    info = global_info(mask) if global_counts else {}
    (loss, clip_ratio, ppo_kl, vllm_kl, is_ratio), grad = run(loss_fn, new, old, adv, mask, info=info)
    keep = mask.any(-1)
    ref_new = new.detach().clone().requires_grad_()
    per_token, metrics = ppo(ref_new[keep], old[keep], adv[keep], mask[keep], eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    expected = aggregate_loss(
        per_token,
        mask[keep],
        mode,
        num_tokens=info.get("batch_num_tokens"),
        num_seqs=info.get("global_batch_size", float(keep.sum())),
        max_len=9,
    ) * info.get("dp_size", 1)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, ref_new.grad)
    assert torch.count_nonzero(grad[2]) == 0  # the empty sequence contributes nothing
    torch.testing.assert_close(clip_ratio, metrics["clip_frac_low"] + metrics["clip_frac_high"])
    torch.testing.assert_close(ppo_kl, metrics["ppo_kl"])
    assert vllm_kl is None and is_ratio is None
    assert set(loss_fn.last_metrics) >= {"clip_frac_low", "clip_frac_high", "dual_clip_frac"}


def test_clip_fractions_are_reported_for_openrlhf_losses(actor_module):
    loss_fn = actor_module.PolicyLoss(clip_eps_low=0.1, clip_eps_high=0.1, policy_loss_type="ppo").configure("token-mean")
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[0.5, 1.5, 0.5, 1.5]]))  # ratios below / above the 0.9..1.1 band
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])
    loss_fn(new, old, adv, action_mask=torch.ones(1, 4, dtype=torch.bool))
    # low bound binds where ratio < 0.9 and A < 0; high bound where ratio > 1.1 and A > 0
    assert float(loss_fn.last_metrics["clip_frac_low"]) == 0.25
    assert float(loss_fn.last_metrics["clip_frac_high"]) == 0.25


def test_configuration_errors_are_clear(actor_module, test_loss_registered):
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        actor_module.PolicyLoss().configure("sum")
    with pytest.raises(ValueError, match="policy_loss_option"):
        actor_module.PolicyLoss(policy_loss_type="ppo").configure("token-mean", options={"x": 1})
    # OpenRLHF's is_correction_* now apply to registered losses too (rlhf_ext.algorithms.openrlhf_correction)
    corrected = actor_module.PolicyLoss(policy_loss_type=test_loss_registered, is_correction_level="token")
    assert corrected.configure("token-mean").rollout_correction[0].active
    with pytest.raises(KeyError, match="unknown policy loss"):
        actor_module.PolicyLoss(policy_loss_type="nope").configure("token-mean")


def test_unconfigured_instance_is_plain_openrlhf(actor_module, OriginalPolicyLoss):
    new, old, adv, mask, _ = batch(seed=4)
    ours, theirs = actor_module.PolicyLoss(), OriginalPolicyLoss()
    assert torch.equal(ours(new, old, adv, action_mask=mask)[0], theirs(new, old, adv, action_mask=mask)[0])


class TinyActor(nn.Module):
    """log pi = old log-probs + theta: a real parameter for the real training_step to update."""

    def __init__(self, old):
        super().__init__()
        self.old = old
        self.theta = nn.Parameter(torch.zeros_like(old))

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **kwargs):
        return self.old + self.theta, SimpleNamespace(aux_loss=None, entropy=None)


def stub_runtime(trainer):
    """What ``training_step`` needs besides the actor and its loss: DeepSpeed's strategy (plain
    backward, no optimizer step), the scheduler, no EMA model, no aux loss."""
    trainer.actor_optim = torch.optim.SGD(trainer.actor.parameters(), lr=0.0)
    trainer.strategy = SimpleNamespace(
        ring_attn_group=None,
        backward=lambda loss, model, opt: loss.backward(),
        optimizer_step=lambda opt, model, sched, name=None: None,
        get_grad_norm=lambda model: 0.0,
    )
    trainer.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [1e-6])
    trainer.ema_model = None
    trainer.aux_loss = False
    return trainer


def test_real_training_step_logs_clip_fractions_and_clipped_kl_loss(actor_module):
    from openrlhf.trainer.ppo_utils.experience import Experience

    from rlhf_ext.algorithms import kl_estimate

    torch.manual_seed(5)
    B, T = 4, 6
    mask = torch.arange(T)[None, :] < torch.tensor([6, 3, 5, 2])[:, None]
    old = -torch.rand(B, T)
    base = old + torch.randn(B, T) * 0.3  # the reference model
    args = SimpleNamespace(
        actor=SimpleNamespace(entropy_coef=None, aux_loss_coef=0.0, loss_agg_mode="seq-mean-token-sum-norm",
                              policy_loss_type="ppo", loss_agg_max_len=8),
        algo=SimpleNamespace(kl=SimpleNamespace(use_loss=True, init_coef=0.01, estimator="k3", unbiased_gradient=False,
                                                clip=[-0.01, 0.01])),
        train=SimpleNamespace(dynamic_batch_enable=False),
    )  # fmt: skip
    trainer = actor_module.ActorPPOTrainer.__new__(actor_module.ActorPPOTrainer)
    trainer.args = args
    trainer.actor = TinyActor(old)
    trainer.actor_loss_fn = actor_module.PolicyLoss(policy_loss_type="ppo")
    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

    configure_from_args(trainer.actor_loss_fn, args)
    stub_runtime(trainer)
    experience = Experience(
        sequences=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        action_mask=mask,
        action_log_probs=old,
        base_action_log_probs=base,
        advantages=torch.randn(B, T),
        info={},
    )
    info = {"dp_size": 1, "batch_num_tokens": mask.sum().float(), "global_batch_size": torch.tensor(float(B))}
    status = trainer.training_step(experience, 0.01, 0, info)
    metrics, weights = status["metrics"], status["weights"]
    assert weights["clip_frac_low"] == weights["clip_frac_high"] == weights["kl_clip_frac"] == "token"
    raw, _ = kl_estimate(old, base, "k3", clip=None)
    expected_frac = ((raw.abs() > 0.01) & mask).sum() / mask.sum()
    assert float(metrics["kl_clip_frac"]) == pytest.approx(float(expected_frac))
    assert 0 < float(expected_frac) < 1
    clamped, _ = kl_estimate(old, base, "k3", clip=(-0.01, 0.01))
    torch.testing.assert_close(metrics["kl"], aggregate_loss(clamped, mask, "token-mean"))
    assert trainer.actor.theta.grad is not None


# ---- the losses named with verl's keys (rlhf_ext.algorithms.ratio_losses) --------------

RATIO_LOSSES = {
    # name: (options from --actor.policy_loss_option, the options the flags give)
    "cispo": ({}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15)),
    "sapo": ({"tau_pos": 1.3, "tau_neg": 2.0}, {}),
    "gmpo": ({}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15)),
    "geo_mean": ({}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15)),
    "clip_cov": ({"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "seed": 3}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15)),
    "kl_cov": ({"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}, {}),
    "dppo_tv": ({}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0)),
    "dppo_kl": ({}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0)),
    # --actor.dual_clip is luspo's dual clip, TRL's delta an option (issue 42: rlhf_ext.algorithms.ratio_caps)
    "luspo": ({"delta": 1.5}, dict(clip_ratio_low=0.1, clip_ratio_high=0.15, dual_clip=3.0)),
    "vespo": ({"vespo_k_pos": 1.0, "vespo_lambda_neg": 1.5}, {}),
    "dro": ({"dro_beta": 0.3}, {}),  # issue 42
    "gpg": ({}, {}),
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", sorted(RATIO_LOSSES))
def test_ratio_losses_in_openrlhfs_actor_every_mode(actor_module, name, mode):
    options, from_flags = RATIO_LOSSES[name]
    loss_fn = actor_module.PolicyLoss(clip_eps_low=0.1, clip_eps_high=0.15, dual_clip=3.0, policy_loss_type=name)
    loss_fn.configure(mode, max_len=9, options=options)
    new, old, adv, mask, _ = batch(seed=4, empty_row=True)
    info = global_info(mask)
    (loss, clip_ratio, ppo_kl, _, _), grad = run(loss_fn, new, old, adv, mask, info=info)
    keep = mask.any(-1)
    ref_new = new.detach().clone().requires_grad_()
    per_token, metrics = get_policy_loss(name)(ref_new[keep], old[keep], adv[keep], mask[keep], **from_flags, **options)
    expected = aggregate_loss(per_token, mask[keep], mode, num_tokens=info["batch_num_tokens"],
                              num_seqs=info["global_batch_size"], max_len=9) * info["dp_size"]
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, ref_new.grad)
    assert grad.abs().sum() > 0 and torch.isfinite(grad).all()
    assert set(loss_fn.last_metrics) == set(metrics)
    torch.testing.assert_close(ppo_kl, metrics["ppo_kl"])
    clip = sum((metrics[k] for k in ("clip_frac_low", "clip_frac_high") if k in metrics), torch.zeros(()))
    torch.testing.assert_close(clip_ratio, clip)


def test_flags_reach_the_ratio_losses_under_verls_names(actor_module):
    from rlhf_ext.algorithms import get_policy_loss
    from rlhf_ext.patches.openrlhf.policy_loss import flag_options

    assert flag_options(get_policy_loss("ppo"), 0.1, 0.3, None) == dict(clip_ratio_low=0.1, clip_ratio_high=0.3)
    assert flag_options(get_policy_loss("dppo_tv"), 0.1, 0.3, 4.0)["clip_ratio_c"] == 4.0
    loss_fn = actor_module.PolicyLoss(clip_eps_low=0.1, clip_eps_high=0.3, policy_loss_type="dppo_tv").configure("token-mean")
    assert loss_fn._call_kwargs == dict(clip_ratio_low=0.1, clip_ratio_high=0.3)
    loss_fn = actor_module.PolicyLoss(policy_loss_type="sapo").configure("token-mean", options={"tau_neg": 3.0})
    assert loss_fn._call_kwargs == {"tau_neg": 3.0}


def test_a_loss_taking_kwargs_gets_what_ppo_takes_and_the_others_only_when_it_names_them():
    """A third-party loss written as ``f(..., **kwargs)`` that forwards to ``ppo`` keeps working: it gets
    ppo's options (the clip range under its one name, dual clip), not DPPO's ``clip_ratio_c``."""
    from rlhf_ext.patches.openrlhf.policy_loss import flag_options

    def forwarding(log_probs, old_log_probs, advantages, mask, **kwargs):
        return kwargs

    def verl_named(log_probs, old_log_probs, advantages, mask, *, clip_ratio_low=0.2, clip_ratio_c=3.0, **kwargs):
        return kwargs

    assert flag_options(forwarding, 0.2, 0.28, 3.0) == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                                         "dual_clip": 3.0}
    assert flag_options(verl_named, 0.2, 0.28, 3.0) == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                                         "dual_clip": 3.0, "clip_ratio_c": 3.0}
