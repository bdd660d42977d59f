"""Distillation losses: per-token divergences from the student to a teacher on the student's own samples.

Two kinds, selected by name like the policy losses (names as verl 0.9.1's ``DistillationLossConfig.loss_mode``):

* **Estimators** of the reverse KL ``KL(pi_s || pi_t)`` from the sampled token's log-probabilities only
  (J. Schulman, "Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html; verl
  ``trainer/distillation/losses.py::compute_distillation_loss_reverse_kl_estimator`` over
  ``trainer/ppo/core_algos.py::kl_penalty_forward``), with ``d = log pi_s(y_t) - log pi_t(y_t)``:

  ===================  ======================================================  =====================
  name (aliases)       per-token loss                                           gradient wrt log pi_s
  ===================  ======================================================  =====================
  ``kl`` / ``k1``      ``d``                                                    1 (teacher-free: use
                                                                                only as a reward)
  ``abs``              ``|d|``                                                  sign(d)
  ``mse`` / ``k2``     ``d^2 / 2``                                              d
  ``low_var_kl``       ``exp(-d') - 1 + d'``, ``d' = clamp(d, -20, 20)``,       1 - exp(-d)
  / ``k3``             the value clamped to [-10, 10] (verl's inner clamps)
  ===================  ======================================================  =====================

  Each is ``fn(student_log_probs, teacher_log_probs, mask, *, log_prob_min_clamp=-10.0,
  loss_max_clamp=10.0) -> (per_token_loss [B, T], metrics)``. ``loss_max_clamp`` (``None``: off) bounds
  the per-token loss to ``[-c, c]`` as verl's ``distillation_loss`` does before aggregation (the lower
  bound matters for ``k1``, which can be negative). ``log_prob_min_clamp`` is accepted so that every
  loss takes the same options, and is NOT applied by the estimators: verl 0.9.1 applies it only in
  ``forward_kl_topk``, and these losses equal verl's.

* ``forward_kl_topk``: the forward KL ``sum_{v in topk_t} p_t(v) (log p_t(v) - log p_s(v))`` over the
  teacher's top-k tokens at each position, from the student's logits (verl
  ``trainer/distillation/fsdp/losses.py::compute_forward_kl_topk``; the top-k form of Agarwal et al.
  2023, arXiv 2306.13649). Called as ``forward_kl_topk(student_logits, teacher_topk_ids,
  teacher_topk_log_probs, mask, *, topk=128, log_prob_min_clamp=-10.0, loss_max_clamp=10.0)``.

Metrics (detached 0-dim tensors, means over the tokens in ``mask``):

* ``distill/reverse_kl_k1``: mean ``log pi_s - log pi_t`` of the sampled tokens, the k1 estimate of
  ``KL(pi_s || pi_t)`` (unbiased, may be negative on one batch);
* ``distill/reverse_kl_k3``: mean k3 estimate (>= 0, lower variance), with verl's inner clamps;
* ``distill/abs_loss``, ``distill/loss_min``, ``distill/loss_max``: mean ``|loss|`` and the range of the
  per-token loss before ``loss_max_clamp`` (verl's ``distillation/abs_loss``, ``loss_min``, ``loss_max``);
* top-k only: ``distill/student_topk_mass`` and ``distill/teacher_topk_mass`` (probability mass each
  puts on the teacher's top-k tokens), ``distill/topk_overlap`` (fraction of the teacher's top-k ids
  that are also among the student's top-k; verl's ``distillation/overlap_ratio``, after "Rethinking
  On-Policy Distillation of Large Language Models", arXiv 2604.13016) and
  ``distill/topk_overlap_token_advantage`` (mean ``-p_t (log p_t - log p_s)`` over the overlapping ids,
  at positions with any overlap; verl's ``distillation/overlap_token_advantage``).

Non-finite teacher values: a NaN/Inf teacher log-probability on a response token (for top-k: NaN or
``+inf``, or ``-inf`` when ``log_prob_min_clamp`` is ``None``; a ``-inf`` that the clamp lifts is a
zero-probability token, as in verl) is a bad loss input like any other: outside a guarded run the loss
raises ``ValueError`` naming ``teacher_log_probs`` with the counts and first index
(:func:`rlhf_ext.algorithms.checks.check_finite`); inside the non-finite guard
(:func:`rlhf_ext.algorithms.deferred_finite_checks`) the finding is recorded for the guard's incident
and the per-token loss at those positions is NaN, so no clamp turns it into a plausible number.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from rlhf_ext.ground.registry import Registry

from .checks import check_finite, check_token_inputs, check_token_shapes
from .registry import ENTRY_POINTS

Metrics = Dict[str, torch.Tensor]

DISTILLATION_LOSSES = Registry("distillation loss", ENTRY_POINTS)

# verl's kl_penalty_forward clamps for low_var_kl / k3 (numerical stability)
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0

TOPK_LOSS_MODES = ("forward_kl_topk",)


def register_distillation_loss(*names: str, uses_topk: bool = False, override: bool = False):
    """Register a distillation loss under each of ``names`` (verl registers aliases the same way).

    Estimators (``uses_topk=False``) are ``fn(student_log_probs, teacher_log_probs, mask, *,
    log_prob_min_clamp, loss_max_clamp) -> (per_token_loss, metrics)``; top-k losses
    (``uses_topk=True``) are ``fn(student_logits, teacher_topk_ids, teacher_topk_log_probs, mask, *, topk,
    log_prob_min_clamp, loss_max_clamp)``. ``fn.uses_topk`` tells a host which inputs to prepare."""
    if not names:
        raise ValueError("register_distillation_loss needs at least one name")

    def decorator(fn: Callable) -> Callable:
        fn.uses_topk = uses_topk
        for name in names:
            DISTILLATION_LOSSES.register(name, override=override)(fn)
        return fn

    return decorator


def get_distillation_loss(name: str) -> Callable:
    """The loss registered as ``name``; an unknown name raises naming the registered ones."""
    return DISTILLATION_LOSSES.get(name)


def available_distillation_losses() -> List[str]:
    return DISTILLATION_LOSSES.available()


def _masked_mean(x: torch.Tensor, maskb: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (torch.where(maskb, x, x.new_zeros(())).sum() / count).detach()


def _check_clamps(log_prob_min_clamp, loss_max_clamp, where: str) -> None:
    if loss_max_clamp is not None and not float(loss_max_clamp) > 0:
        raise ValueError(f"{where}: loss_max_clamp must be > 0 or None, got {loss_max_clamp!r}")
    if log_prob_min_clamp is not None and not float(log_prob_min_clamp) <= 0:
        raise ValueError(f"{where}: log_prob_min_clamp must be <= 0 (a log-probability) or None, "
                         f"got {log_prob_min_clamp!r}")


def _k1(d: torch.Tensor) -> torch.Tensor:
    return d


def _k3(d: torch.Tensor) -> torch.Tensor:
    kl = (-d).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(kl) - kl - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def _estimator_loss(formula, name, student_log_probs, teacher_log_probs, mask, log_prob_min_clamp, loss_max_clamp):
    _check_clamps(log_prob_min_clamp, loss_max_clamp, name)
    maskb = check_token_shapes(mask, student_log_probs=student_log_probs, teacher_log_probs=teacher_log_probs)
    check_token_inputs(mask, student_log_probs=student_log_probs)
    teacher_bad = ~torch.isfinite(teacher_log_probs) & maskb
    check_finite(teacher_log_probs.detach(), f"{name}: teacher_log_probs", maskb)
    d = student_log_probs - teacher_log_probs
    raw = formula(d)
    count = maskb.sum()
    with torch.no_grad():
        metrics: Metrics = {
            "distill/reverse_kl_k1": _masked_mean(d, maskb, count),
            "distill/reverse_kl_k3": _masked_mean(_k3(d), maskb, count),
            "distill/abs_loss": _masked_mean(raw.abs(), maskb, count),
            "distill/loss_min": torch.where(maskb, raw, raw.new_full((), float("inf"))).min().detach(),
            "distill/loss_max": torch.where(maskb, raw, raw.new_full((), float("-inf"))).max().detach(),
        }
    loss = raw if loss_max_clamp is None else raw.clamp(-float(loss_max_clamp), float(loss_max_clamp))
    # a bad teacher value stays visible (NaN) after the clamps, for the guard and the caller
    loss = torch.where(teacher_bad, loss.new_full((), float("nan")), loss)
    return torch.where(maskb, loss, loss.new_zeros(())), metrics


@register_distillation_loss("kl", "k1")
def reverse_kl_k1(student_log_probs, teacher_log_probs, mask, *, log_prob_min_clamp=-10.0, loss_max_clamp=10.0):
    """``d = log pi_s - log pi_t`` (k1; verl ``kl``/``k1``). Its gradient does not depend on the teacher,
    so it is a reward (``use_policy_gradient=True``), never a backpropagated loss."""
    return _estimator_loss(_k1, "k1", student_log_probs, teacher_log_probs, mask, log_prob_min_clamp, loss_max_clamp)


@register_distillation_loss("abs")
def reverse_kl_abs(student_log_probs, teacher_log_probs, mask, *, log_prob_min_clamp=-10.0, loss_max_clamp=10.0):
    """``|log pi_s - log pi_t|`` (verl ``abs``)."""
    return _estimator_loss(torch.abs, "abs", student_log_probs, teacher_log_probs, mask, log_prob_min_clamp,
                           loss_max_clamp)  # fmt: skip


@register_distillation_loss("mse", "k2")
def reverse_kl_k2(student_log_probs, teacher_log_probs, mask, *, log_prob_min_clamp=-10.0, loss_max_clamp=10.0):
    """``(log pi_s - log pi_t)^2 / 2`` (k2; verl ``mse``/``k2``): its expected gradient is the reverse KL's."""
    return _estimator_loss(lambda d: 0.5 * d.square(), "k2", student_log_probs, teacher_log_probs, mask,
                           log_prob_min_clamp, loss_max_clamp)  # fmt: skip


@register_distillation_loss("low_var_kl", "k3")
def reverse_kl_k3(student_log_probs, teacher_log_probs, mask, *, log_prob_min_clamp=-10.0, loss_max_clamp=10.0):
    """``exp(-d) - 1 + d`` with ``d = clamp(log pi_s - log pi_t, -20, 20)``, value clamped to [-10, 10]
    (k3; verl ``low_var_kl``/``k3``): >= 0, unbiased for the reverse KL, low variance."""
    return _estimator_loss(_k3, "k3", student_log_probs, teacher_log_probs, mask, log_prob_min_clamp, loss_max_clamp)


# positions per chunk of the [positions, k, k] id comparison: at k = 128, 16 MiB of booleans per chunk
OVERLAP_CHUNK_ELEMENTS = 1 << 24


def _topk_overlap(teacher_ids: torch.Tensor, student_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T, k]`` bool: is each teacher top-k id among the student's top-k at that position. Compared in
    chunks of positions, so the ``k x k`` comparison never needs more than :data:`OVERLAP_CHUNK_ELEMENTS`."""
    k = teacher_ids.shape[-1]
    flat_t, flat_s = teacher_ids.reshape(-1, k), student_ids.reshape(-1, k)
    step = max(1, OVERLAP_CHUNK_ELEMENTS // (k * k))
    parts = [(flat_t[i : i + step, :, None] == flat_s[i : i + step, None, :]).any(-1)
             for i in range(0, flat_t.shape[0], step)]  # fmt: skip
    if not parts:
        return torch.zeros(teacher_ids.shape, dtype=torch.bool, device=teacher_ids.device)
    return torch.cat(parts).reshape(teacher_ids.shape)


@register_distillation_loss("forward_kl_topk", uses_topk=True)
def forward_kl_topk(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    topk: int = 128,
    log_prob_min_clamp: Optional[float] = -10.0,
    loss_max_clamp: Optional[float] = 10.0,
) -> Tuple[torch.Tensor, Metrics]:
    """Forward KL over the teacher's top-k tokens (verl ``trainer/distillation/fsdp/losses.py``).

    ``student_logits`` ``[B, T, V]`` at the response positions; ``teacher_topk_ids`` (int) and
    ``teacher_topk_log_probs`` ``[B, T, k]`` with ``k == topk``; ``mask`` ``[B, T]``. Per position:
    ``log q = log_softmax(student_logits)[ids]``, ``log p = teacher_topk_log_probs``, both clamped below
    at ``log_prob_min_clamp``; ``L = sum_k exp(log p) (log p - log q)`` in float32 (float64 inputs:
    float64), then ``clamp_min(0)``
    (the top-k masses do not sum to 1, so the sum can be negative) and ``clamp(max=loss_max_clamp)``.
    Gradient flows to ``student_logits`` only. Memory: one float32 ``[B, T, V]`` softmax is materialised
    (as verl's default path); the overlap metric compares ids in chunks of positions (:func:`_topk_overlap`),
    where verl materialises ``[B, T, k, k]``. The student's top-k (for ``distill/topk_overlap``) is taken on its
    log-probs, as verl.
    """
    where = "forward_kl_topk"
    _check_clamps(log_prob_min_clamp, loss_max_clamp, where)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"{where}: topk must be a positive int, got {topk!r}")
    for name, t in (("student_logits", student_logits), ("teacher_topk_ids", teacher_topk_ids),
                    ("teacher_topk_log_probs", teacher_topk_log_probs)):  # fmt: skip
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{where}: {name} must be a 3-d tensor [batch, tokens, *], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")  # fmt: skip
    maskb = check_token_inputs(mask)  # shape, and a response token in every row (as the estimators)
    if student_logits.shape[:2] != maskb.shape:
        raise ValueError(f"{where}: student_logits has shape {tuple(student_logits.shape)}, its first two dims "
                         f"must equal mask's {tuple(maskb.shape)}")  # fmt: skip
    want = (*maskb.shape, topk)
    for name, t in (("teacher_topk_ids", teacher_topk_ids), ("teacher_topk_log_probs", teacher_topk_log_probs)):
        if tuple(t.shape) != want:
            raise ValueError(f"{where}: {name} must have shape [batch, tokens, topk] = {want}, got {tuple(t.shape)}")
    if teacher_topk_ids.is_floating_point() or teacher_topk_ids.is_complex():
        raise ValueError(f"{where}: teacher_topk_ids must be an integer tensor, got {teacher_topk_ids.dtype}")
    vocab = student_logits.shape[-1]
    if topk > vocab:
        raise ValueError(f"{where}: topk={topk} exceeds the student's vocabulary size {vocab}")
    ids = teacher_topk_ids.long()
    on_mask = maskb.unsqueeze(-1).expand(want)
    out_of_range = ((ids < 0) | (ids >= vocab)) & on_mask
    if bool(out_of_range.any()):
        raise ValueError(f"{where}: teacher_topk_ids has {int(out_of_range.sum())} id(s) outside the student's "
                         f"vocabulary [0, {vocab}) (a teacher with another tokenizer?)")  # fmt: skip
    ids = torch.where(on_mask, ids, ids.new_zeros(()))  # padding may hold anything
    logits_ok = torch.isfinite(student_logits.detach()).all(-1)
    if not bool((logits_ok | ~maskb).all()):
        check_finite(torch.where(logits_ok, 0.0, float("nan")),
                     f"{where}: student_logits (positions with a NaN/Inf logit)", maskb)
    # float32 at least (verl: float32); float64 inputs keep their precision
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    teacher = teacher_topk_log_probs.detach().to(dtype)
    clamped_teacher = teacher if log_prob_min_clamp is None else teacher.clamp_min(float(log_prob_min_clamp))
    teacher_bad = (~torch.isfinite(clamped_teacher)).any(-1) & maskb
    check_finite(clamped_teacher, f"{where}: teacher_topk_log_probs", on_mask)

    student_log_probs = torch.log_softmax(student_logits.to(dtype), dim=-1)
    student_topk_ids = torch.topk(student_log_probs.detach(), k=topk, dim=-1).indices
    gathered = torch.gather(student_log_probs, dim=-1, index=ids)
    log_q = gathered if log_prob_min_clamp is None else gathered.clamp_min(float(log_prob_min_clamp))
    log_p = clamped_teacher
    p = log_p.exp()
    raw = (p * (log_p - log_q)).sum(-1).clamp_min(0.0)

    count = maskb.sum()
    with torch.no_grad():
        overlap = _topk_overlap(ids, student_topk_ids) & on_mask
        n_overlap = overlap.sum(-1)
        token_adv = (-(p * (log_p - log_q.detach())) * overlap).sum(-1) / n_overlap.clamp_min(1)
        has_overlap = maskb & (n_overlap > 0)
        metrics: Metrics = {
            "distill/student_topk_mass": _masked_mean(gathered.detach().exp().sum(-1), maskb, count),
            "distill/teacher_topk_mass": _masked_mean(teacher.exp().sum(-1), maskb, count),
            "distill/topk_overlap": _masked_mean(n_overlap.float() / topk, maskb, count),
            "distill/topk_overlap_token_advantage": (
                _masked_mean(token_adv, has_overlap, has_overlap.sum()) if bool(has_overlap.any())
                else token_adv.new_zeros(())),  # fmt: skip
            "distill/loss_min": torch.where(maskb, raw, raw.new_full((), float("inf"))).min().detach(),
            "distill/loss_max": torch.where(maskb, raw, raw.new_full((), float("-inf"))).max().detach(),
        }
    loss = raw if loss_max_clamp is None else raw.clamp(-float(loss_max_clamp), float(loss_max_clamp))
    loss = torch.where(teacher_bad, loss.new_full((), float("nan")), loss)
    return torch.where(maskb, loss, loss.new_zeros(())), metrics


__all__ = [
    "DISTILLATION_LOSSES",
    "TOPK_LOSS_MODES",
    "register_distillation_loss",
    "get_distillation_loss",
    "available_distillation_losses",
    "reverse_kl_k1",
    "reverse_kl_abs",
    "reverse_kl_k2",
    "reverse_kl_k3",
    "forward_kl_topk",
]
