"""Issue 22's knobs, k3_bias_corrected and token-sum inside OpenRLHF's real actor code paths.

The real ``ActorPPOTrainer.training_step`` (patched) runs on a tiny actor whose log-probs are a
parameter; the gradient it leaves is compared with the rlhf_ext functions' own (ppo equals
OpenRLHF's ppo, tested in test_openrlhf_losses.py).
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from test_openrlhf_losses import stub_runtime  # tests/ is on sys.path (pytest's rootdir insertion)

from rlhf_ext.algorithms import (
    aggregate_loss,
    get_policy_loss,
    k3_bias_corrected,
    off_policy_sequence_mask,
    top_entropy_mask,
)


@pytest.fixture(scope="module")
def actor_module():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ray import ppo_actor

    yield ppo_actor
    deactivate()


class TinyActor(nn.Module):
    """log pi = old + theta; the output carries a fixed entropy per token (OpenRLHF's ``output.entropy``)."""

    def __init__(self, old, entropy=None, theta=None):
        super().__init__()
        self.old, self.entropy = old, entropy
        self.theta = nn.Parameter(torch.zeros_like(old) if theta is None else theta.clone())

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **kwargs):
        return self.old + self.theta, SimpleNamespace(aux_loss=None, entropy=self.entropy)


B, T = 6, 7


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 2, 6, 4])[:, None]
    old = -torch.rand(B, T, generator=g) * 2
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()  # one advantage per sequence (GRPO)
    entropy = torch.rand(B, T, generator=g) * 3
    rollout = old + torch.randn(B, T, generator=g) * 0.05
    base = old + torch.randn(B, T, generator=g) * 0.3
    theta = torch.randn(B, T, generator=g) * 0.1
    return mask, old, adv, entropy, rollout, base, theta


def trainer_for(actor_module, loss_type, *, mode="token-mean", entropy_coef=None, quantile=None, truncated=False,
                threshold=None, kl=None, entropy=None, old=None, theta=None):
    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

    args = SimpleNamespace(
        actor=SimpleNamespace(entropy_coef=entropy_coef, aux_loss_coef=0.0, loss_agg_mode=mode,
                              policy_loss_type=loss_type, loss_agg_max_len=None),
        algo=SimpleNamespace(kl=kl or SimpleNamespace(use_loss=False)),
        train=SimpleNamespace(dynamic_batch_enable=False),
        rlhf_ext=SimpleNamespace(top_entropy_quantile=quantile, mask_truncated_completions=truncated,
                                 off_policy_mask_threshold=threshold, step_metrics="all", guard="off"),
    )  # fmt: skip
    trainer = actor_module.ActorPPOTrainer.__new__(actor_module.ActorPPOTrainer)
    trainer.args = args
    trainer.actor = TinyActor(old, entropy, theta)
    eps = (3e-4, 4e-4) if loss_type == "gspo" else (0.2, 0.28)
    trainer.actor_loss_fn = actor_module.PolicyLoss(clip_eps_low=eps[0], clip_eps_high=eps[1],
                                                    policy_loss_type=loss_type)
    configure_from_args(trainer.actor_loss_fn, args)
    return stub_runtime(trainer)


def step(actor_module, loss_type, mask, old, adv, *, rollout=None, truncated_flags=None, base=None, kl_ctl=0.0,
         **kw):
    from openrlhf.trainer.ppo_utils.experience import Experience

    trainer = trainer_for(actor_module, loss_type, old=old, **kw)
    experience = Experience(
        sequences=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T), action_mask=mask,
        action_log_probs=old, base_action_log_probs=old if base is None else base, advantages=adv,
        rollout_log_probs=rollout, truncated=truncated_flags, info={},
    )  # fmt: skip
    info = {"dp_size": 1, "batch_num_tokens": mask.sum().float(), "global_batch_size": torch.tensor(float(B))}
    status = trainer.training_step(experience, kl_ctl, 0, info)
    return trainer.actor.theta.grad.clone(), status


def expected_grad(loss_type, mask, old, adv, theta, keep, mode="token-mean"):
    """rlhf_ext's loss with the per-token loss times ``keep``, counts from the full mask (TRL's rule).
    OpenRLHF's gspo always reduces per sequence (its PolicyLoss forces it)."""
    if loss_type == "gspo" and mode == "token-mean":
        mode = "seq-mean-token-mean"
    from rlhf_ext.patches.openrlhf.policy_loss import flag_options

    lp = (old + theta).requires_grad_()
    eps = (3e-4, 4e-4) if loss_type == "gspo" else (0.2, 0.28)
    if loss_type == "gspo":
        # OpenRLHF's GSPO (arXiv 2507.18071) by hand: every token's ratio is the sequence's
        # exp(mean log-ratio), with its gradient through all the sequence's tokens
        m = mask.float()
        s = (((lp - old) * m).sum(-1) / m.sum(-1)).exp()[:, None]
        per_token = -torch.min(s * adv, s.clamp(1 - eps[0], 1 + eps[1]) * adv)
    else:
        fn = get_policy_loss(loss_type)
        per_token, _ = fn(lp, old, adv, mask, **flag_options(fn, eps[0], eps[1], None))
    aggregate_loss(per_token * keep, mask, mode, num_tokens=mask.sum().float(),
                   num_seqs=torch.tensor(float(B))).backward()
    return lp.grad


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo"])
def test_truncated_and_off_policy_masks_drop_whole_sequences(actor_module, loss_type):
    mask, old, adv, _, rollout, _, theta = data(1)
    adv[0] = -1.0  # negative and far off-policy: dropped by the off-policy mask
    adv[1] = 1.0   # far off-policy but positive: kept
    rollout[0] = old[0] + 2.0
    rollout[1] = old[1] + 2.0
    truncated = torch.tensor([False, False, True, False, False, False])
    base_grad, _ = step(actor_module, loss_type, mask, old, adv, rollout=rollout, theta=theta)
    grad, _ = step(actor_module, loss_type, mask, old, adv, rollout=rollout, theta=theta, truncated=True,
                   truncated_flags=truncated, threshold=0.5)
    lp = old + theta
    seq_keep = off_policy_sequence_mask(adv[:, 0], lp, rollout, mask, 0.5)
    assert seq_keep.tolist() == [False, True, True, True, True, True]
    dropped = (~seq_keep) | truncated
    assert dropped.tolist() == [True, False, True, False, False, False]
    assert torch.count_nonzero(grad[dropped]) == 0
    torch.testing.assert_close(grad[~dropped], base_grad[~dropped])  # counts unchanged: the others as before
    keep = mask & ~dropped[:, None]
    torch.testing.assert_close(grad, expected_grad(loss_type, mask, old, adv, theta, keep))


def test_off_policy_mask_falls_back_to_the_old_log_probs(actor_module):
    mask, old, adv, _, _, _, theta = data(2)
    adv[3] = -0.5
    theta[3] = -3.0  # the current policy moved far from the sampling (old) policy on sequence 3
    grad, _ = step(actor_module, "ppo", mask, old, adv, theta=theta, threshold=1.0)
    seq_keep = off_policy_sequence_mask(adv[:, 0], old + theta, old, mask, 1.0)
    assert not seq_keep[3] and int(seq_keep.sum()) == B - 1
    torch.testing.assert_close(grad, expected_grad("ppo", mask, old, adv, theta, mask & seq_keep[:, None]))


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo", "sapo"])
def test_top_entropy_quantile_keeps_the_high_entropy_tokens(actor_module, loss_type):
    mask, old, adv, entropy, _, _, theta = data(3)
    grad, status = step(actor_module, loss_type, mask, old, adv, theta=theta, entropy=entropy, entropy_coef=0.0,
                        quantile=0.3)
    keep = top_entropy_mask(entropy, mask, 0.3)
    assert 0 < int(keep.sum()) < int(mask.sum())
    torch.testing.assert_close(grad, expected_grad(loss_type, mask, old, adv, theta, keep))
    if loss_type != "gspo":  # token-local losses: no gradient at all on the low-entropy tokens
        assert torch.count_nonzero(grad[mask & ~keep]) == 0
    assert "entropy_loss" in status["metrics"]  # OpenRLHF's entropy term ran (coefficient 0)


def test_top_entropy_quantile_without_entropy_is_a_clear_error(actor_module):
    mask, old, adv, _, _, _, _ = data(4)
    with pytest.raises(ValueError, match="returned no entropy"):
        step(actor_module, "ppo", mask, old, adv, entropy=None, entropy_coef=0.0, quantile=0.5)


def test_truncation_flag_missing_is_a_clear_error(actor_module):
    mask, old, adv, _, _, _, _ = data(4)
    with pytest.raises(ValueError, match="no 'truncated' flags"):
        step(actor_module, "ppo", mask, old, adv, truncated=True, truncated_flags=None)


def test_k3_bias_corrected_kl_loss(actor_module):
    mask, old, _, _, _, base, theta = data(5)
    zero_adv = torch.zeros(B, T)  # no policy-gradient term: the gradient is the KL loss's alone
    kl = SimpleNamespace(use_loss=True, init_coef=0.1, estimator="k3_bias_corrected", unbiased_gradient=False,
                         clip=None)
    grad, status = step(actor_module, "ppo", mask, old, zero_adv, theta=theta, base=base, kl=kl, kl_ctl=0.1)
    lp = (old + theta).requires_grad_()
    ref = aggregate_loss(k3_bias_corrected(lp, base, old), mask, "token-mean")
    (ref * 0.1).backward()
    torch.testing.assert_close(status["metrics"]["kl"], ref.detach())
    torch.testing.assert_close(grad, lp.grad)
    # off-policy (theta != 0): differs from plain k3 in value
    from rlhf_ext.algorithms import k3
    assert not torch.allclose(ref, aggregate_loss(k3(old + theta, base), mask, "token-mean"))


def test_k3_bias_corrected_in_the_kl_reward_is_refused(actor_module):
    from openrlhf.trainer.ppo_utils import experience_maker

    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="--algo.kl.use_loss"):
        experience_maker.compute_approx_kl(x, x, kl_estimator="k3_bias_corrected")


@pytest.mark.parametrize("loss_type", ["ppo", "gspo"])
@pytest.mark.parametrize("global_counts", [True, False])
def test_token_sum_with_openrlhfs_own_losses(actor_module, loss_type, global_counts):
    eps = (0.2, 0.28) if loss_type == "ppo" else (3e-4, 4e-4)
    loss_fn = actor_module.PolicyLoss(clip_eps_low=eps[0], clip_eps_high=eps[1], policy_loss_type=loss_type)
    loss_fn.configure("token-sum")
    mask, old, adv, _, _, _, theta = data(6)
    dp = 2
    info = {"dp_size": dp, "batch_num_tokens": mask.sum().float() * dp, "global_batch_size": torch.tensor(B * dp * 1.)}
    new = (old + theta).requires_grad_()
    loss = loss_fn(new, old, adv, action_mask=mask, **(info if global_counts else {}))[0]
    loss.backward()
    ref_new = (old + theta).requires_grad_()
    per_token, _ = get_policy_loss(loss_type)(ref_new, old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    ref = (per_token * mask).sum() * (dp if global_counts else 1)  # verl's token-sum: times the DP size
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(new.grad, ref_new.grad)
    # the same as rlhf_ext's token-sum, which equals verl's agg_loss (tests/verl_env)
    torch.testing.assert_close(loss.detach(), aggregate_loss(per_token.detach(), mask, "token-sum")
                               * (dp if global_counts else 1))
