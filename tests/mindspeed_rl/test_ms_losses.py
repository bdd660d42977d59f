"""The real GRPO and DAPO actor losses (through LossFuncFactory) with rlhf_ext's settings, and the KL seam.

``BaseLossFunc.compute_log_probs`` (Megatron's vocab-parallel log-softmax) is replaced by the
log-probs under test, as MindSpeed-RL's own loss tests do; everything after it is the real code.
"""

import inspect
import math
import pickle
from unittest.mock import patch

import pytest
import torch

from rlhf_ext.patches.mindspeed_rl import ConfiguredName, compat

MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])
LENGTHS = torch.tensor([[3], [1]])
# Token (0,0): ratio 1.5 with A = 1 (the upper clip binds at eps 0.2); token (1,0): ratio 0.5 with
# A = -2 (the lower clip binds); the rest ratio 1. Padding holds values that must not count.
LOG_PROBS = torch.tensor([[math.log(1.5), 0.0, 0.0], [math.log(0.5), 7.0, 7.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 9.0, 9.0]])


def batch(ref=None):
    return {
        "responses": torch.full((2, 3), 5),
        "response_length": LENGTHS,
        "old_log_prob": torch.zeros(2, 3),
        "advantages": ADVANTAGES,
        "ref_log_prob": torch.zeros(2, 3) if ref is None else ref,
    }


def meta(settings=None, kl_penalty="low_var_kl", kl_coef=0.0, **extra):
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    info = {"clip_ratio": 0.2, "kl_ctrl": FixedKLController(kl_coef), "entropy_coeff": 0.0,
            "kl_penalty": ConfiguredName(kl_penalty, settings) if settings else kl_penalty,
            "token_level_loss": True, "clip_higher_enable": False, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    info.update(extra)
    return info


def run(stage, info, b=None, log_probs=LOG_PROBS, entropy=torch.zeros(2, 3)):
    from mindspeed_rl.models.loss.base_loss_func import BaseLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory

    loss = LossFuncFactory.get_instance(stage, "actor")
    loss.add_loss_meta_info(info)
    with patch.object(BaseLossFunc, "compute_log_probs", return_value=(log_probs, entropy)):
        return loss.compute_loss(torch.zeros(1), b or batch(), forward_only=False)


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
def test_no_new_key_is_bit_identical_to_the_builtin_loss(stage):
    from mindspeed_rl.models.loss.base_loss_func import BaseLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory

    cls = LossFuncFactory.get_class(stage, "actor")
    builtin = compat.original(cls, "compute_loss")
    assert builtin is not cls.compute_loss
    lp = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    got_loss, got_stats = run(stage, meta(), log_probs=lp, entropy=torch.rand(2, 3))
    plain = cls()
    compat.original(cls, "add_loss_meta_info")(plain, meta())
    with patch.object(BaseLossFunc, "compute_log_probs", return_value=(lp, torch.rand(2, 3))):
        want_loss, want_stats = builtin(plain, torch.zeros(1), batch(), False)
    assert torch.equal(got_loss, want_loss)
    assert got_stats == {k: v for k, v in want_stats.items() if k != "actor/entropy"} | {"actor/entropy": got_stats["actor/entropy"]}


# Per-token PPO losses for the case above: [[-1.2, -1, -1], [1.6]] (ratio clipped at both tokens 0).
PPO_CASES = {
    "token-mean": (-1.2 - 1 - 1 + 1.6) / 4,
    "seq-mean-token-mean": ((-1.2 - 1 - 1) / 3 + 1.6) / 2,
    "seq-mean-token-sum": ((-1.2 - 1 - 1) + 1.6) / 2,
    "seq-mean-token-sum-norm": ((-1.2 - 1 - 1) + 1.6) / (10 * 2),
}


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
@pytest.mark.parametrize("mode", list(PPO_CASES))
def test_aggregation_modes_hand_computed(stage, mode):
    settings = {"loss_agg_mode": mode}
    if mode == "seq-mean-token-sum-norm":
        settings["loss_agg_max_len"] = 10
    loss, stats = run(stage, meta(settings))
    assert loss.item() == pytest.approx(PPO_CASES[mode], rel=1e-6)
    assert stats["actor/clip_frac_low"] == pytest.approx(0.25)
    assert stats["actor/clip_frac_high"] == pytest.approx(0.25)
    assert stats["actor/pg_clipfrac"] == pytest.approx(0.5)


@pytest.mark.parametrize("stage, token_level, mode", [
    ("ray_grpo", True, "token-mean"), ("ray_dapo", True, "token-mean"), ("ray_dapo", False, "seq-mean-token-mean")])
def test_ppo_with_the_builtin_mode_matches_the_builtin_loss(stage, token_level, mode):
    info = meta({"policy_loss_type": "ppo"}, token_level_loss=token_level)
    ours, ours_stats = run(stage, info)
    theirs, their_stats = run(stage, meta(token_level_loss=token_level))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6) == pytest.approx(PPO_CASES[mode], rel=1e-6)
    assert ours_stats["actor/pg_clipfrac"] == pytest.approx(0.5)
    if token_level:
        assert their_stats["actor/pg_clipfrac"] == pytest.approx(0.5)
    else:
        # MindSpeed-RL 2.1.0's DAPO loss overwrites pg_losses with the max before comparing, so
        # its seq-mean clip fraction is always 0; rlhf_ext reports the real one.
        assert their_stats["actor/pg_clipfrac"] == 0.0
    assert ours_stats["actor/ppo_kl"] == pytest.approx(their_stats["actor/ppo_kl"], rel=1e-6)


def test_grpo_honours_clip_higher_with_rlhf_ext_settings():
    info = meta({"policy_loss_type": "ppo"}, clip_higher_enable=True, clip_ratio_low=0.2, clip_ratio_high=0.6)
    loss, stats = run("ray_grpo", info)
    assert loss.item() == pytest.approx((-1.5 - 1 - 1 + 1.6) / 4, rel=1e-6)  # ratio 1.5 < 1.6: not clipped
    assert stats["actor/clip_frac_high"] == 0.0


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
def test_gspo_hand_computed(stage):
    info = meta({"policy_loss_type": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
                clip_higher_enable=True, clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    loss, stats = run(stage, info)
    # s_0 = 1.5 ** (1/3) > 1 + 4e-4 with A = 1: clipped to 1.0004; s_1 = 0.5 with A = -2: 1 - 3e-4 binds.
    want = (-(1 + 4e-4) + (1 - 3e-4) * 2) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert stats["actor/clip_frac_high"] == pytest.approx(0.75)
    assert stats["actor/clip_frac_low"] == pytest.approx(0.25)


def test_grpo_kl_term_with_rlhf_ext_estimator_and_clip():
    ref = torch.tensor([[-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    info = meta({"kl_clip": [-0.1, 0.1]}, kl_penalty="k1", kl_coef=0.5)
    loss, stats = run("ray_grpo", info, b=batch(ref=ref))
    # k1 = log pi - log ref: [[log 1.5 + 0.5 -> 0.1 (clipped), 0, 0], [log 0.5 -> -0.1 (clipped)]]
    assert stats["actor/kl_loss"] == pytest.approx((0.1 + 0 + 0 - 0.1) / 4, abs=1e-7)
    assert stats["actor/kl_clip_frac"] == pytest.approx(2 / 4)  # over the response tokens (padding clamps too)
    assert loss.item() == pytest.approx(PPO_CASES["token-mean"] + 0.5 * stats["actor/kl_loss"], rel=1e-6)


@pytest.mark.parametrize("name", ["kl", "abs", "mse", "low_var_kl"])
def test_builtin_kl_names_are_bit_identical(name):
    from mindspeed_rl.utils import compute

    g = torch.Generator().manual_seed(1)
    lp, ref = torch.randn(4, 6, generator=g) * 15, torch.randn(4, 6, generator=g) * 15
    original = compat.original(compute, "compute_kl_penalty")
    assert torch.equal(compute.compute_kl_penalty(lp, ref, name), original(lp, ref, name))


def test_k_estimators_hand_computed_and_clip_range():
    from mindspeed_rl.utils import compute

    lp, ref = torch.tensor([0.5, 30.0]), torch.tensor([0.0, 0.0])
    k1, k2, k3 = (compute.compute_kl_penalty(lp, ref, n) for n in ("k1", "k2", "k3"))
    assert k1.tolist() == pytest.approx([0.5, 10.0])  # default clamp [-10, 10]
    assert k2.tolist() == pytest.approx([0.125, 10.0])
    assert k3[0].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    wide = compute.compute_kl_penalty(lp, ref, ConfiguredName("k3", {"kl_clip": "none"}))
    assert wide[1].item() == pytest.approx(math.exp(-20) - 1 + 20)  # log ratio still clamped at 20
    low_var = compute.compute_kl_penalty(lp, ref, ConfiguredName("low_var_kl", {"kl_clip": [-5, 5]}))
    assert low_var[1].item() == 5.0 and low_var[0].item() == pytest.approx(k3[0].item())


def test_configured_name_pickles_with_its_settings():
    name = ConfiguredName("passk", {"adv_estimator_options": {"k": 4}})
    back = pickle.loads(pickle.dumps(name))
    assert back == "passk" and back.settings == {"adv_estimator_options": {"k": 4}} and hash(back) == hash("passk")


# ---- the losses named with verl's keys, through the real GRPO/DAPO losses ---------------------

RATIO_LOSSES = {
    "cispo": {}, "sapo": {"tau_pos": 1.3, "tau_neg": 2.0}, "gmpo": {}, "geo_mean": {},
    "clip_cov": {"clip_cov_ratio": 0.25, "clip_cov_lb": -1.0, "seed": 1}, "kl_cov": {"kl_cov_ratio": 0.3, "ppo_kl_coef": 0.5},
    "dppo_tv": {"clip_ratio_c": 1.2}, "dppo_kl": {}, "luspo": {}, "vespo": {"vespo_k_neg": 2.0},
    "dro": {"dro_beta": 0.3}, "gpg": {},  # issue 42
    # issue 42's ratio caps (rlhf_ext.algorithms.ratio_caps): ppo's delta binds on token (0,0) (ratio 1.5, A > 0);
    # luspo's travel (its row 0 ratio 1.145 stays under them, so the gradient is not all zero)
    "ppo": {"delta": 1.2}, "luspo+caps": {"delta": 1.2, "dual_clip": 1.5},
}


@pytest.mark.parametrize("stage", ["ray_grpo", "ray_dapo"])
@pytest.mark.parametrize("name", sorted(RATIO_LOSSES))
def test_ratio_losses_inside_mindspeed_rls_actor_loss(stage, name):
    from rlhf_ext.algorithms import aggregate_loss, get_policy_loss

    options = RATIO_LOSSES[name]
    name = name.split("+")[0]
    settings = {"policy_loss_type": name, "loss_agg_mode": "seq-mean-token-mean", "policy_loss_options": options}
    info = meta(settings, clip_higher_enable=True, clip_ratio_low=0.1, clip_ratio_high=0.3)
    lp = LOG_PROBS.clone().requires_grad_(True)
    loss, stats = run(stage, info, log_probs=lp)
    want_lp = LOG_PROBS.clone().requires_grad_(True)
    mask = MASK.bool()
    fn = get_policy_loss(name)
    clip = {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3} if "clip_ratio_low" in inspect.signature(fn).parameters else {}
    per_token, metrics = fn(want_lp, torch.zeros(2, 3), ADVANTAGES, mask, **clip, **options)
    want = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-7)
    (grad,) = torch.autograd.grad(loss, lp)
    (want_grad,) = torch.autograd.grad(want, want_lp)
    assert torch.allclose(grad, want_grad, atol=1e-6) and grad.abs().sum() > 0
    assert (grad[~mask] == 0).all()  # the padding's 7.0 / A = 9 count nowhere
    assert stats["actor/ppo_kl"] == pytest.approx(float(metrics["ppo_kl"]), abs=1e-6)
    assert stats["actor/pg_clipfrac"] == pytest.approx(
        float(metrics.get("clip_frac_low", 0.0)) + float(metrics.get("clip_frac_high", 0.0)), abs=1e-6)


def test_k3_plus_has_k3s_value_and_k2s_gradient():
    """kl_penalty: k3+ (verl's name): the unbiased KL-loss gradient; the [-10, 10] clamp bounds the value only."""
    from mindspeed_rl.utils import compute

    from rlhf_ext.patches.mindspeed_rl.config import check_kl

    assert check_kl("k3+", None) is None
    lp = torch.tensor([0.5, -1.0, -30.0], requires_grad=True)
    ref = torch.zeros(3)
    value = compute.compute_kl_penalty(lp, ref, "k3+")
    assert value[0].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert value[2].item() == 10.0  # clamped
    value.sum().backward()
    # lr, k2's gradient, also where the value is clamped (of the unclamped log ratio, as verl's k3+)
    assert lp.grad.tolist() == pytest.approx([0.5, -1.0, -30.0])
