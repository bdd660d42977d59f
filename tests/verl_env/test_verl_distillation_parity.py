"""Parity of rlhf_ext's on-policy distillation with verl 0.9.1's own (runs in .venv-verl).

verl's functions are called as its engine calls them (``verl/trainer/distillation/losses.py``): a
``TensorDict`` micro-batch with padded prompts/responses and the teacher's values as jagged nested
tensors over whole sequences, the student's outputs flat over the batch's tokens (no padding, shifted
by one as verl's ``no_padding_2_padding`` expects). On random inputs, float64:

* each reverse-KL estimator name: per-token values (verl's ``compute_distillation_loss_reverse_kl_estimator``
  with the ``loss_max_clamp`` its ``distillation_loss`` applies), clamps binding, metrics;
* ``forward_kl_topk`` with verl's top-k processing (``fsdp/losses.py::compute_forward_kl_topk``): per-token
  values, top-k masses, overlap ratio and overlap token advantage, with and without the clamps;
* ``distillation_ppo_loss`` for the combinations (as a loss / as a reward, alone / with task rewards and a
  coefficient) in every aggregation mode: the loss and its gradient with respect to the student's
  log-probs (and logits for top-k), and ``distillation/loss``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.distillation import distillation_ppo_loss
from verl.trainer.distillation import losses as verl_losses
from verl.trainer.distillation.fsdp import losses as verl_fsdp_losses
from verl.utils import tensordict_utils as tu
from verl.workers.config import DistillationConfig as VerlDistillationConfig
from verl.workers.config import DistillationLossConfig
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from rlhf_ext.algorithms import (
    VERL_PG_OPTIONS,
    DistillationConfig,
    distillation_policy_loss,
    forward_kl_topk,
    get_distillation_loss,
)

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
B, T, P, V, K = 5, 6, 3, 40, 8
LENGTHS = torch.tensor([6, 2, 5, 1, 4])
MASK = torch.arange(T)[None, :] < LENGTHS[:, None]


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, T, ...] response values -> [total_nnz, ...] over whole sequences (prompt P + response), the value
    of response token i at sequence position P - 1 + i (verl's shift by one); differentiable."""
    parts = []
    for i in range(B):
        parts += [x.new_zeros((P - 1,) + x.shape[2:]), x[i, : LENGTHS[i]], x.new_zeros((1,) + x.shape[2:])]
    return torch.cat(parts)


def _nested(x: torch.Tensor) -> torch.Tensor:
    flat, out, offset = _flat(x), [], 0
    for n in (LENGTHS + P).tolist():
        out.append(flat[offset : offset + n])
        offset += n
    return torch.nested.nested_tensor(out, layout=torch.jagged)


def _data(old, adv, **teacher) -> TensorDict:
    attention = torch.cat([torch.ones(B, P, dtype=torch.long), MASK.long()], dim=1)
    data = TensorDict({"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
                       "attention_mask": attention, "response_mask": MASK.to(torch.float64), "old_log_probs": old,
                       "advantages": adv}, batch_size=[B])  # fmt: skip
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    for key, value in teacher.items():
        data[key] = _nested(value)
    return data


def _actor(mode) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_torch_compile=False,
                       policy_loss=PolicyLossConfig(loss_mode="vanilla"), clip_ratio=0.2,
                       loss_agg_mode=mode)  # fmt: skip


def _verl_config(**loss) -> VerlDistillationConfig:
    return VerlDistillationConfig(enabled=False, distillation_loss=DistillationLossConfig(**loss))


def _ours(**loss) -> DistillationConfig:
    return DistillationConfig(**loss)


def _inputs(seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    student = (old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    teacher = (student + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-4)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    return old, student, teacher, adv


def _value(metric):
    """A verl ``Metric`` holds the values appended to it (one here); plain numbers pass through."""
    values = getattr(metric, "values", None)
    if values is not None:
        assert len(values) == 1, values
        metric = values[0]
    return torch.as_tensor(metric, dtype=torch.float64)


TOPK_TOL = 2e-6  # verl's kl_divergence casts to float32 (ours keeps float64 inputs in float64)


def _close(a, b, tol=1e-9):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert torch.allclose(a, b, atol=tol, rtol=1e-7), (a, b)


# ---- per-token estimators ------------------------------------------------------------------------------------


@pytest.mark.parametrize("clamp", [None, 10.0, 0.7])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_per_token_values_and_metrics_equal_verl(name, clamp):
    old, student, teacher, adv = _inputs(seed=len(name), spread=8.0)  # wide: verl's k3 inner clamps bind too
    data = _data(old, adv, teacher_logprobs=teacher.unsqueeze(-1))
    cfg = _verl_config(loss_mode=name, use_policy_gradient=True, loss_max_clamp=clamp)
    ref, ref_metrics = verl_losses.compute_distillation_loss_reverse_kl_estimator(
        config=_actor("token-mean"), distillation_config=cfg, model_output={"log_probs": _flat(student)}, data=data)
    ref_range = verl_losses.compute_distillation_loss_range(ref, data["response_mask"])
    if clamp is not None:
        ref = ref.clamp(-clamp, clamp)  # verl's distillation_loss, before aggregation
    mine, metrics = get_distillation_loss(name)(student, teacher, MASK, loss_max_clamp=clamp)
    _close(mine[MASK], ref[MASK])
    assert (mine[~MASK] == 0).all()
    if clamp == 0.7:
        assert bool((ref[MASK].abs() == 0.7).any()), "the clamp must bind in this case"
    _close(metrics["distill/abs_loss"], _value(ref_metrics["distillation/abs_loss"]))
    _close(metrics["distill/loss_min"], _value(ref_range["distillation/loss_min"]))
    _close(metrics["distill/loss_max"], _value(ref_range["distillation/loss_max"]))
    _close(metrics["distill/reverse_kl_k1"], (student - teacher)[MASK].mean())


# ---- top-k -------------------------------------------------------------------------------------------------


def _topk_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    teacher_logits = logits + 2.0 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    top = torch.topk(torch.log_softmax(teacher_logits, -1), K, dim=-1)
    return logits, top.indices, top.values


def _verl_topk(logits, ids, log_probs, cfg):
    out = verl_fsdp_losses.compute_forward_kl_topk(
        student_logits=_flat(logits).unsqueeze(0), teacher_topk_log_probs=_nested(log_probs),
        teacher_topk_ids=_nested(ids), config=cfg, data_format="thd")  # fmt: skip
    return {k: v.squeeze(0) for k, v in out.items()}


@pytest.mark.parametrize("clamps", [(-10.0, 10.0), (None, None), (-3.0, 0.4)])
def test_forward_kl_topk_values_masses_overlap_and_grad_equal_verl(clamps):
    log_prob_min_clamp, loss_max_clamp = clamps
    logits, ids, teacher_lp = _topk_inputs(seed=3)
    cfg = _verl_config(loss_mode="forward_kl_topk", topk=K, use_policy_gradient=False,
                       log_prob_min_clamp=log_prob_min_clamp, loss_max_clamp=loss_max_clamp)  # fmt: skip
    leaf_ref = logits.clone().requires_grad_(True)
    out = _verl_topk(leaf_ref, ids, teacher_lp, cfg)
    data = _data(torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, T, dtype=torch.float64))
    ref_losses, ref_metrics = verl_losses.compute_forward_kl_topk(
        config=_actor("token-mean"), distillation_config=cfg, model_output=out, data=data)
    if loss_max_clamp is not None:
        ref_losses = ref_losses.clamp(-loss_max_clamp, loss_max_clamp)
    leaf = logits.clone().requires_grad_(True)
    mine, metrics = forward_kl_topk(leaf, ids, teacher_lp, MASK, topk=K, log_prob_min_clamp=log_prob_min_clamp,
                                    loss_max_clamp=loss_max_clamp)  # fmt: skip
    _close(mine[MASK], ref_losses[MASK], TOPK_TOL)
    if loss_max_clamp == 0.4:
        assert bool((ref_losses[MASK] == 0.4).any())
    _close(metrics["distill/student_topk_mass"], ref_metrics["distillation/student_mass"])
    _close(metrics["distill/teacher_topk_mass"], ref_metrics["distillation/teacher_mass"])
    _close(metrics["distill/topk_overlap"], ref_metrics["distillation/overlap_ratio"])
    assert 0.0 < float(metrics["distill/topk_overlap"]) < 1.0
    _close(metrics["distill/topk_overlap_token_advantage"], ref_metrics["distillation/overlap_token_advantage"],
           TOPK_TOL)
    weights = torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (g_ref,) = torch.autograd.grad((ref_losses * weights * MASK).sum(), leaf_ref)
    (g_mine,) = torch.autograd.grad((mine * weights * MASK).sum(), leaf)
    _close(g_mine, g_ref, TOPK_TOL)
    assert g_mine.abs().sum() > 0


# ---- combinations: distillation_ppo_loss --------------------------------------------------------------------

COMBOS = [
    # (loss_mode, use_policy_gradient, use_task_rewards, coef)
    ("k1", True, False, 1.0),  # Thinking Machines' OPD alone
    ("k1", True, True, 0.3),  # OPD reward beside the task reward
    ("kl", True, True, 1.0),
    ("k3", False, False, 1.0),  # GKD-style supervised reverse KL alone
    ("low_var_kl", False, True, 0.5),
    ("k2", False, True, 2.0),
    ("abs", True, False, 1.0),
    ("mse", True, True, 0.7),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(map(str, c)))
def test_distillation_ppo_loss_equals_verl(combo, mode):
    name, use_pg, use_task, coef = combo
    old, student, teacher, adv = _inputs(seed=11, spread=1.5)
    loss_kw = dict(loss_mode=name, use_policy_gradient=use_pg, use_task_rewards=use_task,
                   distillation_loss_coef=coef, loss_max_clamp=1.0, log_prob_min_clamp=-10.0)  # fmt: skip
    leaf_ref = student.clone().requires_grad_(True)
    data = _data(old, adv, teacher_logprobs=teacher.unsqueeze(-1))
    ref, ref_metrics = distillation_ppo_loss(_actor(mode), _verl_config(**loss_kw), {"log_probs": _flat(leaf_ref)},
                                             data)  # fmt: skip
    leaf = student.clone().requires_grad_(True)
    mine, metrics = distillation_policy_loss(leaf, old, adv if use_task else None, MASK, config=_ours(**loss_kw),
                                             teacher_log_probs=teacher, policy_loss="ppo",
                                             policy_loss_options=VERL_PG_OPTIONS, loss_agg_mode=mode)  # fmt: skip
    _close(mine, ref)
    _close(metrics["distill/loss"], _value(ref_metrics["distillation/loss"]))
    (g_ref,) = torch.autograd.grad(ref, leaf_ref)
    (g_mine,) = torch.autograd.grad(mine, leaf)
    _close(g_mine, g_ref)
    assert g_mine[MASK].abs().sum() > 0 and (g_mine[~MASK] == 0).all()
    if use_pg:
        _close(metrics["distill/pg/ppo_kl"], ref_metrics["distillation/ppo_kl"])


@pytest.mark.parametrize("mode", ("token-mean", "seq-mean-token-mean"))
@pytest.mark.parametrize("use_pg,use_task", [(False, False), (False, True), (True, True)])
def test_topk_distillation_ppo_loss_and_logit_gradient_equal_verl(use_pg, use_task, mode):
    logits, ids, teacher_lp = _topk_inputs(seed=5)
    g = torch.Generator().manual_seed(6)
    sampled = torch.randint(0, V, (B, T), generator=g)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    old = torch.log_softmax(logits, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1).detach()
    old = old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    loss_kw = dict(loss_mode="forward_kl_topk", topk=K, use_policy_gradient=use_pg, use_task_rewards=use_task,
                   distillation_loss_coef=0.4, loss_max_clamp=10.0, log_prob_min_clamp=-10.0)  # fmt: skip
    cfg = _verl_config(**loss_kw)

    leaf_ref = logits.clone().requires_grad_(True)
    model_output = _verl_topk(leaf_ref, ids, teacher_lp, cfg)
    log_probs_ref = torch.log_softmax(leaf_ref, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    model_output["log_probs"] = _flat(log_probs_ref)
    ref, ref_metrics = distillation_ppo_loss(_actor(mode), cfg, model_output, _data(old, adv))

    leaf = logits.clone().requires_grad_(True)
    log_probs = torch.log_softmax(leaf, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    with pytest.warns(UserWarning, match="forward_kl_topk") if use_pg else _no_warning():
        config = _ours(**loss_kw)
    mine, metrics = distillation_policy_loss(log_probs, old, adv if use_task else None, MASK, config=config,
                                             student_logits=leaf, teacher_topk_ids=ids,
                                             teacher_topk_log_probs=teacher_lp, policy_loss_options=VERL_PG_OPTIONS,
                                             loss_agg_mode=mode)  # fmt: skip
    _close(mine, ref, TOPK_TOL)
    _close(metrics["distill/loss"], _value(ref_metrics["distillation/loss"]), TOPK_TOL)
    (g_ref,) = torch.autograd.grad(ref, leaf_ref)
    (g_mine,) = torch.autograd.grad(mine, leaf)
    _close(g_mine, g_ref, TOPK_TOL)
    assert g_mine.abs().sum() > 0


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_k1_as_a_backpropagated_loss_is_refused_as_verl_refuses_it():
    with pytest.raises(ValueError, match="k1"):
        DistillationLossConfig(loss_mode="k1", use_policy_gradient=False)
    for name in ("k1", "kl"):
        with pytest.raises(ValueError, match="does not depend on the teacher"):
            DistillationConfig(loss_mode=name, use_policy_gradient=False)


def test_defaults_equal_verls_dataclass():
    ref = DistillationLossConfig()
    ours = DistillationConfig()
    for field in ("loss_mode", "topk", "use_policy_gradient", "use_task_rewards", "distillation_loss_coef",
                  "log_prob_min_clamp", "loss_max_clamp"):  # fmt: skip
        assert getattr(ours, field) == getattr(ref, field), field
    assert ours.teacher_key == VerlDistillationConfig().teacher_key
    assert dict(VERL_PG_OPTIONS) == {"clip_ratio_low": ref.clip_ratio_low, "clip_ratio_high": ref.clip_ratio_high,
                                     "dual_clip": 3.0}  # fmt: skip
