"""Issue 22's knobs and k3_bias_corrected in MindSpeed-RL's real GRPO / DAPO actor losses and RLConfig.

As in test_ms_losses.py, ``BaseLossFunc.compute_log_probs`` is replaced by the tensors under test
(Megatron's vocab-parallel log-softmax needs Ascend); everything after it is MindSpeed-RL's code
with the plugin's patches.
"""

from unittest.mock import patch

import pytest
import torch

from rlhf_ext.patches.mindspeed_rl import ConfigError, ConfiguredName

B, T = 4, 5
MASK = torch.arange(T)[None, :] < torch.tensor([5, 3, 4, 2])[:, None]


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 2
    lp = old + torch.randn(B, T, generator=g) * 0.1
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    entropy = torch.rand(B, T, generator=g) * 3
    ref = old + torch.randn(B, T, generator=g) * 0.3
    return old, lp, adv, entropy, ref


def run(stage, settings, old, lp, adv, entropy, ref, kl_penalty="low_var_kl", kl_coef=0.0, entropy_coeff=0.0):
    from mindspeed_rl.models.loss.base_loss_func import BaseLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    info = {"clip_ratio": 0.2, "kl_ctrl": FixedKLController(kl_coef), "entropy_coeff": entropy_coeff,
            "kl_penalty": ConfiguredName(kl_penalty, settings) if settings else kl_penalty,
            "token_level_loss": True, "clip_higher_enable": False, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    loss = LossFuncFactory.get_instance(stage, "actor")
    loss.add_loss_meta_info(info)
    b = {"responses": torch.full((B, T), 5), "response_length": MASK.sum(-1, keepdim=True), "old_log_prob": old,
         "advantages": adv, "ref_log_prob": ref}
    seen = {}

    def fake(self, output, batch, skip_entropy=False, **kwargs):
        seen["skip_entropy"] = skip_entropy
        return lp, (None if skip_entropy else entropy)

    with patch.object(BaseLossFunc, "compute_log_probs", fake):
        out = loss.compute_loss(torch.zeros(1), b, forward_only=False)
    return out, seen


def expected(lp, old, adv, keep, loss_type="ppo"):
    from rlhf_ext.algorithms import aggregate_loss, get_policy_loss

    extra = {"eps_low": 0.2, "eps_high": 0.2, "log_ratio_clip": None} if loss_type == "ppo" else \
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    per_token, _ = get_policy_loss(loss_type)(lp, old, adv, MASK, **extra)
    return aggregate_loss(per_token * keep, MASK, "token-mean")


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
@pytest.mark.parametrize("loss_type", ["ppo", "cispo"])
def test_top_entropy_quantile_in_the_actor_loss(stage, loss_type):
    from rlhf_ext.algorithms import top_entropy_mask

    old, lp, adv, entropy, ref = data(1)
    lp = lp.requires_grad_()
    settings = {"top_entropy_quantile": 0.4, "policy_loss_type": loss_type}
    (loss, _), seen = run(stage, settings, old, lp, adv, entropy, ref)
    assert seen["skip_entropy"] is False  # computed for the mask although entropy_coeff is 0
    keep = top_entropy_mask(entropy, MASK, 0.4)
    assert 0 < int(keep.sum()) < int(MASK.sum())
    want_lp = lp.detach().clone().requires_grad_()
    want = expected(want_lp, old, adv, keep, loss_type)
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, lp)
    (want_grad,) = torch.autograd.grad(want, want_lp)
    torch.testing.assert_close(grad, want_grad)
    assert torch.count_nonzero(grad[MASK & ~keep]) == 0


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
def test_off_policy_mask_in_the_actor_loss(stage):
    from rlhf_ext.algorithms import off_policy_sequence_mask

    old, lp, adv, entropy, ref = data(2)
    adv[1] = -1.0
    lp[1] = old[1] - 2.0  # far from the sampling policy, negative advantage: dropped
    lp = lp.requires_grad_()
    (loss, _), _ = run(stage, {"off_policy_mask_threshold": 0.5}, old, lp, adv, entropy, ref)
    seq_keep = off_policy_sequence_mask(adv[:, 0], lp.detach(), old, MASK, 0.5)
    assert seq_keep.tolist() == [True, False, True, True]
    want_lp = lp.detach().clone().requires_grad_()
    want = expected(want_lp, old, adv, MASK & seq_keep[:, None])
    torch.testing.assert_close(loss, want)
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.count_nonzero(grad[1]) == 0
    torch.testing.assert_close(grad, torch.autograd.grad(want, want_lp)[0])


def test_k3_bias_corrected_kl_loss_in_the_grpo_actor_loss():
    from rlhf_ext.algorithms import aggregate_loss, k3, k3_bias_corrected

    old, lp, _, entropy, ref = data(3)
    zero_adv = torch.zeros(B, T)
    lp = lp.requires_grad_()
    (loss, stats), _ = run("ray_grpo", None, old, lp, zero_adv, entropy, ref, kl_penalty="k3_bias_corrected",
                           kl_coef=0.5)
    want_lp = lp.detach().clone().requires_grad_()
    kl = aggregate_loss(k3_bias_corrected(want_lp, ref, old), MASK, "token-mean")
    assert stats["actor/kl_loss"] == pytest.approx(kl.item(), rel=1e-6)
    assert kl.item() != pytest.approx(aggregate_loss(k3(want_lp, ref), MASK, "token-mean").item(), rel=1e-4)
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], torch.autograd.grad(0.5 * kl, want_lp)[0])


def test_config_keys_travel_and_bad_values_are_refused():
    from mindspeed_rl.config_cls.rl_config import RLConfig

    cfg = RLConfig({"top_entropy_quantile": 0.2, "off_policy_mask_threshold": 1.0, "kl_penalty": "k3_bias_corrected"})
    assert cfg.kl_penalty == "k3_bias_corrected"
    assert cfg.kl_penalty.settings == {"top_entropy_quantile": 0.2, "off_policy_mask_threshold": 1.0}
    for values, message in [
        ({"top_entropy_quantile": 0}, r"top_entropy_quantile must be in \(0, 1\]"),
        ({"off_policy_mask_threshold": -1}, "off_policy_mask_threshold must be a finite number >= 0"),
        ({"mask_truncated_completions": True}, "carries no truncation flag"),
        ({"adv_estimator": "optimal_token_baseline"}, "needs, per response token, sum_pi_squared"),
        ({"kl_penalty": "k3_bias_corrected", "use_kl_in_reward": True}, "cannot be used with use_kl_in_reward"),
    ]:
        with pytest.raises(ConfigError, match=message):
            RLConfig(values)
