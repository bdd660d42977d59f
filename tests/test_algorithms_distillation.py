"""On-policy distillation losses and their combination (rlhf_ext.algorithms.distillation*): hand-computed cases.

Parity with verl 0.9.1 (every estimator, forward_kl_topk, distillation_ppo_loss in every aggregation mode, values
and gradients) is in tests/verl_env/test_verl_distillation_parity.py (run by tests/test_verl_env.py).
"""

import dataclasses
import math

import pytest
import torch

from rlhf_ext.algorithms import (
    VERL_PG_OPTIONS,
    DistillationConfig,
    UnknownNameError,
    available_distillation_losses,
    combine_with_task_loss,
    deferred_finite_checks,
    distillation_policy_loss,
    distillation_term,
    distillation_token_loss,
    forward_kl_topk,
    get_distillation_loss,
    register_distillation_loss,
)
from rlhf_ext.algorithms.distillation_losses import DISTILLATION_LOSSES

S = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=torch.float64)
TEA = torch.tensor([[-1.5, -1.0, -0.5, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)  # the last token is padding
D = [0.5, -1.0, 0.0]


def _close(a, b, tol=1e-12):
    assert torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          atol=tol), (a, b)  # fmt: skip


@pytest.mark.parametrize("names,expected", [
    (("kl", "k1"), D),
    (("abs",), [0.5, 1.0, 0.0]),
    (("mse", "k2"), [0.125, 0.5, 0.0]),
    (("low_var_kl", "k3"), [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]),
])  # fmt: skip
def test_estimators_hand_computed_and_aliases(names, expected):
    fns = {get_distillation_loss(n) for n in names}
    assert len(fns) == 1, "aliases are one function"
    loss, metrics = fns.pop()(S, TEA, MASK, loss_max_clamp=None)
    _close(loss[0, :3], expected)
    assert loss[0, 3] == 0  # padding
    _close(metrics["distill/reverse_kl_k1"], sum(D) / 3)
    _close(metrics["distill/reverse_kl_k3"], (math.exp(-0.5) - 0.5 + math.e - 2.0) / 3)
    _close(metrics["distill/loss_min"], min(expected))
    _close(metrics["distill/loss_max"], max(expected))


def test_estimator_gradients_wrt_student_log_probs():
    for name, grad in (("k2", D), ("k3", [1 - math.exp(-d) for d in D]), ("abs", [1.0, -1.0, 0.0]), ("k1", [1, 1, 1])):
        s = S.clone().requires_grad_(True)
        loss, _ = get_distillation_loss(name)(s, TEA, MASK)
        (g,) = torch.autograd.grad(loss.sum(), s)
        _close(g[0, :3], grad)
        assert g[0, 3] == 0


def test_loss_max_clamp_bounds_both_sides_and_stops_the_gradient():
    s = S.clone().requires_grad_(True)
    loss, metrics = get_distillation_loss("k1")(s, TEA, MASK, loss_max_clamp=0.6)
    _close(loss[0, :3], [0.5, -0.6, 0.0])
    _close(metrics["distill/loss_min"], -1.0)  # the range is reported before the clamp (verl)
    (g,) = torch.autograd.grad(loss.sum(), s)
    _close(g[0, :3], [1.0, 0.0, 1.0])


def test_k3_inner_clamps_as_verl():
    s = torch.tensor([[-30.0, -0.1]])
    t = torch.tensor([[-0.1, -30.0]])
    loss, _ = get_distillation_loss("k3")(s, t, torch.ones(1, 2), loss_max_clamp=None)
    # d = -29.9: exp(20) - 20 - 1 (log-ratio clamp) -> value clamp 10; d = 29.9 -> exp(-20) + 19 -> 10
    _close(loss, [[10.0, 10.0]], 1e-6)


def test_registry_lists_names_and_unknown_name_names_them():
    names = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "forward_kl_topk"}
    assert names <= set(available_distillation_losses())
    with pytest.raises(UnknownNameError, match="unknown distillation loss 'k9'.*forward_kl_topk.*low_var_kl"):
        get_distillation_loss("k9")
    assert get_distillation_loss("forward_kl_topk").uses_topk and not get_distillation_loss("k3").uses_topk


def test_register_a_custom_estimator():
    @register_distillation_loss("test_half_k1", "test_half_k1_alias")
    def half(s, t, mask, *, log_prob_min_clamp=-10.0, loss_max_clamp=10.0):
        return 0.5 * (s - t), {}

    try:
        assert get_distillation_loss("test_half_k1_alias") is half
        cfg = DistillationConfig(loss_mode="test_half_k1", use_task_rewards=False)
        loss, _ = distillation_token_loss(cfg, MASK, student_log_probs=S, teacher_log_probs=TEA)
        _close(loss[0, :3], [0.25, -0.5, 0.0])
    finally:
        DISTILLATION_LOSSES.unregister("test_half_k1")
        DISTILLATION_LOSSES.unregister("test_half_k1_alias")


# ---- top-k --------------------------------------------------------------------------------------------------


def test_forward_kl_topk_hand_computed():
    logits = torch.tensor([[[2.0, 1.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    q = torch.softmax(logits.detach(), -1)[0, 0]
    ids = torch.tensor([[[0, 2]]])
    p = torch.tensor([0.5, 0.25], dtype=torch.float64)
    loss, m = forward_kl_topk(logits, ids, p.log().view(1, 1, 2), torch.ones(1, 1), topk=2)
    expected = 0.5 * math.log(0.5 / q[0]) + 0.25 * math.log(0.25 / q[2])
    _close(loss, [[expected]])
    _close(m["distill/student_topk_mass"], q[0] + q[2])
    _close(m["distill/teacher_topk_mass"], 0.75)
    _close(m["distill/topk_overlap"], 0.5)  # the student's top-2 is {0, 1}: id 0 is shared
    _close(m["distill/topk_overlap_token_advantage"], -0.5 * math.log(0.5 / q[0]))
    # d/dz_j of -sum_k p_k log q_k = (sum p) q_j - p_j
    (g,) = torch.autograd.grad(loss.sum(), logits)
    _close(g[0, 0], [0.75 * q[0] - 0.5, 0.75 * q[1], 0.75 * q[2] - 0.25])


def test_forward_kl_topk_clamps_negative_sums_to_zero_and_min_log_prob():
    logits = torch.tensor([[[5.0, 0.0, 0.0]]])
    # teacher puts little mass on id 0, the student a lot: sum p (log p - log q) < 0 -> 0
    loss, _ = forward_kl_topk(logits, torch.tensor([[[0]]]), torch.tensor([[[math.log(0.1)]]]), torch.ones(1, 1),
                              topk=1)  # fmt: skip
    assert loss.item() == 0.0
    # log_prob_min_clamp lifts the student's -30 log-prob (logit gap) to -3: 1 * (0 - (-3)) = 3
    logits = torch.tensor([[[30.0, 0.0]]], dtype=torch.float64)
    loss, _ = forward_kl_topk(logits, torch.tensor([[[1]]]), torch.zeros(1, 1, 1), torch.ones(1, 1), topk=1,
                              log_prob_min_clamp=-3.0, loss_max_clamp=None)  # fmt: skip
    _close(loss, [[3.0]])


def test_forward_kl_topk_bad_inputs_are_named():
    logits, mask = torch.zeros(1, 2, 5), torch.ones(1, 2)
    ids, lp = torch.zeros(1, 2, 3, dtype=torch.long), torch.full((1, 2, 3), -1.0)
    with pytest.raises(ValueError, match=r"shape \[batch, tokens, topk\] = \(1, 2, 4\)"):
        forward_kl_topk(logits, ids, lp, mask, topk=4)
    with pytest.raises(ValueError, match="outside the student's vocabulary.*another tokenizer"):
        forward_kl_topk(logits, ids + 5, lp, mask, topk=3)
    with pytest.raises(ValueError, match="integer"):
        forward_kl_topk(logits, ids.float(), lp, mask, topk=3)
    nan = lp.clone()
    nan[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="teacher_topk_log_probs contains 1 NaN"):
        forward_kl_topk(logits, ids, nan, mask, topk=3)
    # -inf is a zero-probability token: lifted by the clamp as verl does, refused without it
    minus_inf = lp.clone()
    minus_inf[0, 0, 1] = float("-inf")
    assert torch.isfinite(forward_kl_topk(logits, ids, minus_inf, mask, topk=3)[0]).all()
    with pytest.raises(ValueError, match="teacher_topk_log_probs contains 0 NaN and 1 Inf"):
        forward_kl_topk(logits, ids, minus_inf, mask, topk=3, log_prob_min_clamp=None)


# ---- non-finite teacher values ------------------------------------------------------------------------------


def test_nan_or_inf_teacher_log_probs_raise_naming_the_teacher():
    for bad in (float("nan"), float("-inf")):
        t = TEA.clone()
        t[0, 1] = bad
        with pytest.raises(ValueError, match="k1: teacher_log_probs contains"):
            get_distillation_loss("k1")(S, t, MASK)
    t = TEA.clone()
    t[0, 3] = float("nan")  # on padding: not a finding
    assert torch.isfinite(get_distillation_loss("k1")(S, t, MASK)[0]).all()


def test_under_the_guard_a_bad_teacher_value_is_a_finding_and_stays_nan():
    t = TEA.clone()
    t[0, 1] = float("-inf")  # k1 would be +inf, which loss_max_clamp would turn into a plausible 10
    with deferred_finite_checks() as findings:
        loss, _ = get_distillation_loss("k1")(S, t, MASK)
        total, _ = distillation_policy_loss(S, S, None, MASK, config=DistillationConfig(loss_mode="k1",
                                            use_task_rewards=False), teacher_log_probs=t)  # fmt: skip
    assert findings[0]["name"] == "k1: teacher_log_probs" and findings[0]["inf_count"] == 1
    assert findings[0]["first_index"] == [0, 1]
    assert math.isnan(loss[0, 1]) and torch.isfinite(loss[0, [0, 2, 3]]).all()
    assert math.isnan(total)


# ---- config ---------------------------------------------------------------------------------------------------


def test_config_defaults_and_validation():
    cfg = DistillationConfig()
    assert (cfg.loss_mode, cfg.topk, cfg.use_policy_gradient, cfg.use_task_rewards) == ("k3", 128, True, True)
    assert (cfg.log_prob_min_clamp, cfg.loss_max_clamp, cfg.teacher_key) == (-10.0, 10.0, "data_source")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loss_mode = "k1"
    bad = [
        (dict(loss_mode="k9"), "unknown; registered: abs"),
        (dict(loss_mode="k1", use_policy_gradient=False), "does not depend on the teacher"),
        (dict(loss_mode="forward_kl_topk", topk=None, use_policy_gradient=False), "needs topk"),
        (dict(distillation_loss_coef=-1.0), "distillation_loss_coef"),
        (dict(distillation_loss_coef=float("nan")), "distillation_loss_coef"),
        (dict(loss_max_clamp=0.0), "loss_max_clamp must be > 0"),
        (dict(log_prob_min_clamp=1.0), "log_prob_min_clamp must be <= 0"),
        (dict(use_task_rewards="yes"), "use_task_rewards must be a bool"),
        (dict(teacher_key=""), "teacher_key"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            DistillationConfig(**kwargs)
    with pytest.warns(UserWarning, match="top-k signal is mostly unused"):
        DistillationConfig(loss_mode="forward_kl_topk")
    assert DistillationConfig(loss_mode="forward_kl_topk", use_policy_gradient=False).uses_topk


def test_missing_inputs_are_named():
    cfg = DistillationConfig(loss_mode="k3", use_policy_gradient=False)
    with pytest.raises(ValueError, match="needs teacher_log_probs"):
        distillation_token_loss(cfg, MASK, student_log_probs=S)
    topk = DistillationConfig(loss_mode="forward_kl_topk", use_policy_gradient=False)
    with pytest.raises(ValueError, match="needs student_logits, teacher_topk_ids"):
        distillation_token_loss(topk, MASK, teacher_topk_log_probs=torch.zeros(1, 4, 128))
    with pytest.raises(ValueError, match="needs the task advantages"):
        distillation_policy_loss(S, S, None, MASK, config=cfg, teacher_log_probs=TEA)
    with pytest.raises(ValueError, match="needs the task policy loss"):
        combine_with_task_loss(None, torch.tensor(1.0), cfg)
    pg = DistillationConfig(loss_mode="k1", use_task_rewards=False)
    with pytest.raises(ValueError, match="needs log_probs and old_log_probs"):
        distillation_term(torch.zeros(1, 4), MASK, config=pg)
    with pytest.raises(ValueError, match="shape mismatch: teacher_log_probs"):
        distillation_token_loss(cfg, MASK, student_log_probs=S, teacher_log_probs=TEA[:, :3])


# ---- the two uses, alone or with task rewards -----------------------------------------------------------------


def test_as_a_loss_alone_is_the_aggregated_estimator():
    cfg = DistillationConfig(loss_mode="k2", use_policy_gradient=False, use_task_rewards=False)
    s = S.clone().requires_grad_(True)
    loss, metrics = distillation_policy_loss(s, S, None, MASK, config=cfg, teacher_log_probs=TEA)
    _close(loss, (0.125 + 0.5) / 3)
    _close(metrics["distill/loss"], (0.125 + 0.5) / 3)
    (g,) = torch.autograd.grad(loss, s)
    _close(g[0], [d / 3 for d in D] + [0.0])
    loss, _ = distillation_policy_loss(S, S, None, MASK, config=cfg, teacher_log_probs=TEA,
                                       loss_agg_mode="token-sum")  # fmt: skip
    _close(loss, 0.625)


def test_as_a_reward_alone_advantage_is_minus_k1():
    cfg = DistillationConfig(loss_mode="k1", use_task_rewards=False)
    s = S.clone().requires_grad_(True)
    # on-policy (ratio 1): per-token loss -A = k1, gradient -A/N = k1/N: lowers log pi_s where it exceeds log pi_t
    loss, metrics = distillation_policy_loss(s, S, None, MASK, config=cfg, teacher_log_probs=TEA,
                                             policy_loss_options=VERL_PG_OPTIONS)  # fmt: skip
    _close(loss, sum(D) / 3)
    (g,) = torch.autograd.grad(loss, s)
    _close(g[0], [d / 3 for d in D] + [0.0])
    assert "distill/pg/clip_frac_low" in metrics and "clip_frac_low" not in metrics


def test_with_task_rewards_adds_coef_times_the_distillation_term():
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    for use_pg, term in ((True, sum(D) / 3), (False, (math.exp(-0.5) - 0.5 + math.e - 2.0) / 3)):
        cfg = DistillationConfig(loss_mode="k1" if use_pg else "k3", use_policy_gradient=use_pg,
                                 use_task_rewards=True, distillation_loss_coef=0.25)  # fmt: skip
        loss, metrics = distillation_policy_loss(S, S, adv, MASK, config=cfg, teacher_log_probs=TEA)
        _close(metrics["distill/task_loss"], -1.0)  # ppo at ratio 1: -A
        _close(metrics["distill/loss"], term)
        _close(loss, -1.0 + 0.25 * term)
        assert "clip_frac_low" in metrics  # the task policy loss's own metrics
    # without task rewards the coefficient is not applied (verl)
    cfg = DistillationConfig(loss_mode="k3", use_policy_gradient=False, use_task_rewards=False,
                             distillation_loss_coef=0.25)  # fmt: skip
    loss, _ = distillation_policy_loss(S, S, adv, MASK, config=cfg, teacher_log_probs=TEA)
    _close(loss, (math.exp(-0.5) - 0.5 + math.e - 2.0) / 3)


def test_any_rlhf_ext_policy_loss_and_token_weights():
    cfg = DistillationConfig(loss_mode="k1", use_task_rewards=False)
    loss, metrics = distillation_policy_loss(S, S, None, MASK, config=cfg, teacher_log_probs=TEA, policy_loss="cispo",
                                             policy_loss_options={"clip_ratio_high": 0.2},
                                             token_weights=torch.full((1, 4), 2.0, dtype=torch.float64))  # fmt: skip
    _close(loss, 2 * sum(D) / 3)
    assert any(k.startswith("distill/pg/") for k in metrics)


def test_topk_overlap_in_chunks_equals_one_comparison(monkeypatch):
    import rlhf_ext.algorithms.distillation_losses as losses

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 30, generator=g)
    top = torch.topk(torch.log_softmax(logits + torch.randn(3, 7, 30, generator=g), -1), 6, dim=-1)
    mask = torch.ones(3, 7)
    whole = forward_kl_topk(logits, top.indices, top.values, mask, topk=6)[1]["distill/topk_overlap"]
    direct = (top.indices[..., :, None] == torch.topk(logits, 6, dim=-1).indices[..., None, :]).any(-1).float().mean()
    monkeypatch.setattr(losses, "OVERLAP_CHUNK_ELEMENTS", 6 * 6 * 4)  # 4 positions per chunk, 21 positions
    chunked = forward_kl_topk(logits, top.indices, top.values, mask, topk=6)[1]["distill/topk_overlap"]
    _close(whole, direct, 1e-7)
    _close(chunked, direct, 1e-7)
    assert 0 < float(direct) < 1
