"""On-policy distillation in MindSpeed-RL 2.1.0: ``rl_config.distillation`` on the real (patched) RLConfig, and the
real GRPO actor loss (through LossFuncFactory) with the teacher's log-probs in the batch's ``ref_log_prob`` column.

The teacher and the student are small bigram language models run on CPU: the teacher's log-probs of the sampled
tokens come from its forward pass, as the reference worker's would; the student's log-probs (with gradient) replace
``BaseLossFunc.compute_log_probs`` (Megatron's vocab-parallel log-softmax), as MindSpeed-RL's own loss tests do.
Everything after it is the real loss code. The reference worker's Megatron forward itself is not run (no NPU).
"""

import pickle
from unittest.mock import patch

import pytest
import torch

from rlhf_ext.algorithms import DistillationConfig, distillation_policy_loss
from rlhf_ext.patches.mindspeed_rl import ConfigError, ConfiguredName
from rlhf_ext.patches.mindspeed_rl.config import settings_of

VOCAB, B, T = 12, 3, 5
LENGTHS = torch.tensor([5, 3, 2])
MASK = torch.arange(T)[None, :] < LENGTHS[:, None]


class Bigram(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.logits = torch.nn.Embedding(VOCAB, VOCAB)

    def log_probs(self, prompt_last, responses):
        """Log-probs of each response token given the previous token (the prompt's last for the first)."""
        prev = torch.cat([prompt_last[:, None], responses[:, :-1]], dim=1)
        return torch.log_softmax(self.logits(prev), -1).gather(-1, responses[:, :, None]).squeeze(-1)


def rollout(seed=0):
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(0, VOCAB, (B, T), generator=g)
    prompt_last = torch.randint(0, VOCAB, (B,), generator=g)
    advantages = torch.randn(B, 1, generator=g).expand(B, T).clone()
    return prompt_last, responses, advantages


TEACHER = {"ref_model_load_path": "/ckpt/teacher"}


def rl(**values):
    from mindspeed_rl.config_cls.rl_config import RLConfig

    if "distillation" in values:
        values.setdefault("integrated_mode_config", TEACHER)
    return RLConfig(values)


def meta(kl_penalty, kl_coef=0.0):
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    return {"clip_ratio": 0.2, "kl_ctrl": FixedKLController(kl_coef), "entropy_coeff": 0.0, "kl_penalty": kl_penalty,
            "token_level_loss": True, "clip_higher_enable": False, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}


def run_loss(stage, kl_penalty, student_log_probs, batch):
    from mindspeed_rl.models.loss.base_loss_func import BaseLossFunc
    from mindspeed_rl.models.loss.loss_func_factory import LossFuncFactory

    loss = LossFuncFactory.get_instance(stage, "actor")
    loss.add_loss_meta_info(meta(kl_penalty))
    with patch.object(BaseLossFunc, "compute_log_probs", return_value=(student_log_probs, torch.zeros(B, T))):
        return loss.compute_loss(torch.zeros(1), batch, forward_only=False)


def actor_batch(responses, advantages, teacher_log_probs, old_log_prob):
    return {"responses": responses, "response_length": LENGTHS[:, None], "old_log_prob": old_log_prob,
            "advantages": advantages, "ref_log_prob": teacher_log_probs}


def test_config_is_validated_on_the_real_rlconfig():
    cfg = rl(init_kl_coef=0.0, distillation={"loss_mode": "k1", "use_task_rewards": False})
    assert isinstance(cfg.kl_penalty, ConfiguredName) and cfg.kl_penalty == "low_var_kl"
    want = {"loss_mode": "k1", "topk": 128, "use_policy_gradient": True, "use_task_rewards": False,
            "distillation_loss_coef": 1.0, "log_prob_min_clamp": -10.0, "loss_max_clamp": 10.0,
            "teacher_key": "data_source"}
    assert cfg.kl_penalty.settings["distillation"] == want
    assert cfg.distillation == want
    assert pickle.loads(pickle.dumps(cfg.kl_penalty)).settings["distillation"] == want  # how it reaches the workers
    # separate reference worker: the teacher is ref_config.load, outside rl_config
    defaults = rl(init_kl_coef=0.0, use_integrated_worker=False, integrated_mode_config=None, distillation={})
    assert defaults.kl_penalty.settings["distillation"]["loss_mode"] == "k3"  # {} is verl's defaults, switched on
    assert "distillation" not in settings_of(rl(init_kl_coef=0.0, distillation={"enabled": False}).kl_penalty)
    bad = [
        (dict(distillation={"loss_mode": "k1"}), "init_kl_coef=0.01 must be 0: the reference slot holds the teacher"),
        (dict(init_kl_coef=0.0, use_kl_in_reward=True, distillation={}), "use_kl_in_reward"),
        (dict(init_kl_coef=0.0, distillation={"loss_mode": "forward_kl_topk"}), "no top-k"),
        (dict(init_kl_coef=0.0, distillation={"topk": 32}), "distillation.topk is not supported"),
        (dict(init_kl_coef=0.0, distillation={"teacher_key": "data_source"}), "one teacher"),
        (dict(init_kl_coef=0.0, distillation={"loss_mod": "k3"}), "no key 'loss_mod'; valid: loss_mode"),
        (dict(init_kl_coef=0.0, distillation={"loss_mode": "k1", "use_policy_gradient": False}),
         "does not depend on the teacher"),
        (dict(init_kl_coef=0.0, distillation={"loss_mode": "k7"}), "unknown; registered: abs"),
        (dict(init_kl_coef=0.0, distillation="k1"), "must be a mapping"),
        (dict(init_kl_coef=0.0, top_entropy_quantile=0.2, distillation={}), "top_entropy_quantile"),
        (dict(init_kl_coef=0.0, integrated_mode_config=None, distillation={}), "needs the teacher's checkpoint in "
         "rl_config.integrated_mode_config.ref_model_load_path"),
        (dict(init_kl_coef=0.0, share_backbone=True, distillation={}), "share_backbone"),
    ]
    for values, message in bad:
        with pytest.raises(ConfigError, match=message):
            rl(**values)


CASES = [
    # the Thinking Machines recipe (reward -k1, alone); GKD-style k3 loss with task rewards; both aggregations
    ({"loss_mode": "k1", "use_task_rewards": False}, "token-mean"),
    ({"loss_mode": "k3", "use_policy_gradient": False, "distillation_loss_coef": 0.5}, "token-mean"),
    ({"loss_mode": "k2", "use_policy_gradient": True, "distillation_loss_coef": 2.0}, "seq-mean-token-mean"),
    ({}, "token-mean"),  # verl's defaults: k3 as a reward, with task rewards
]


@pytest.mark.parametrize("fields,mode", CASES)
def test_real_grpo_loss_path_with_teacher_log_probs_on_cpu(fields, mode):
    teacher, student = Bigram(seed=1), Bigram(seed=2)
    prompt_last, responses, advantages = rollout()
    with torch.no_grad():
        teacher_lp = teacher.log_probs(prompt_last, responses)  # the reference worker's job, on CPU
        old = student.log_probs(prompt_last, responses) + 0.05 * torch.randn(B, T)
    cfg = rl(init_kl_coef=0.0, loss_agg_mode=mode, distillation=fields)
    batch = actor_batch(responses, advantages, teacher_lp, old)

    student_lp = student.log_probs(prompt_last, responses)
    loss, stats = run_loss("ray_grpo", cfg.kl_penalty, student_lp, batch)
    (grad,) = torch.autograd.grad(loss, student.logits.weight)

    # the framework-free composition on the same tensors (MindSpeed-RL's ppo: no log-ratio clamp)
    student_lp2 = student.log_probs(prompt_last, responses)
    want, metrics = distillation_policy_loss(student_lp2, old, advantages, MASK, config=DistillationConfig(**fields),
                                             teacher_log_probs=teacher_lp, loss_agg_mode=mode,
                                             policy_loss_options={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2,
                                                                  "log_ratio_clip": None})  # fmt: skip
    (want_grad,) = torch.autograd.grad(want, student.logits.weight)
    assert loss.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(grad, want_grad, atol=1e-7)
    assert grad.abs().sum() > 0
    d = (student_lp2 - teacher_lp).detach()[MASK]
    assert stats["distill/reverse_kl_k1"] == pytest.approx(d.mean().item(), rel=1e-5)
    k3 = (torch.exp(-d) - 1 + d).clamp(max=10.0)  # verl's value clamp (|d| < 20 here)
    assert stats["distill/reverse_kl_k3"] == pytest.approx(k3.mean().item(), rel=1e-5)
    assert stats["distill/loss"] == pytest.approx(float(metrics["distill/loss"]), rel=1e-6)
    assert stats["actor/kl_loss"] == 0.0  # the KL-to-reference term is dropped: the reference is the teacher


def test_training_steps_move_the_student_toward_the_teacher():
    """k3 as a loss, alone: a few SGD steps through the real loss lower the student's reverse KL to the teacher."""
    teacher, student = Bigram(seed=1), Bigram(seed=2)
    prompt_last, responses, advantages = rollout(seed=3)
    with torch.no_grad():
        teacher_lp = teacher.log_probs(prompt_last, responses)
    cfg = rl(init_kl_coef=0.0, distillation={"loss_mode": "k3", "use_policy_gradient": False,
                                             "use_task_rewards": False})  # fmt: skip
    opt = torch.optim.SGD(student.parameters(), lr=2.0)
    kls = []
    for _ in range(4):
        lp = student.log_probs(prompt_last, responses)
        batch = actor_batch(responses, advantages, teacher_lp, lp.detach())
        loss, stats = run_loss("ray_grpo", cfg.kl_penalty, lp, batch)
        kls.append(stats["distill/reverse_kl_k3"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert kls[-1] < 0.7 * kls[0], kls
    assert all(b < a for a, b in zip(kls, kls[1:])), kls


def test_bad_teacher_values_and_a_missing_teacher_are_named():
    cfg = rl(init_kl_coef=0.0, distillation={"loss_mode": "k1", "use_task_rewards": False})
    _, responses, advantages = rollout()
    student_lp = -torch.rand(B, T)
    teacher = -torch.rand(B, T)
    teacher[1, 0] = float("nan")
    with pytest.raises(ValueError, match="k1: teacher_log_probs contains 1 NaN"):
        run_loss("ray_grpo", cfg.kl_penalty, student_lp, actor_batch(responses, advantages, teacher, student_lp))
    batch = actor_batch(responses, advantages, None, student_lp)
    del batch["ref_log_prob"]
    with pytest.raises(ValueError, match="DAPO trainer runs no reference worker"):
        run_loss("ray_dapo", cfg.kl_penalty, student_lp, batch)
