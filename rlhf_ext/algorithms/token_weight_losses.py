"""Policy losses where the token importance ratio enters as a reshaped weight instead of PPO's hard
clip of the surrogate: CISPO (clipped, stop-gradient IS weight: no token loses its gradient) and SAPO
(soft sigmoid gate: the update fades smoothly away from ``rho = 1``).

Convention, padding and cost: :mod:`.ratio_common`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .float_flags import flag
from .linearised import with_derivative
from .metric_requests import metric_wanted
from .ppo_losses import zero_padded_mean
from .ratio_common import (Metrics, check_bounds, check_positive, clamped_log_ratio, prepare_inputs, times_flag,
                           token_frac, token_mean)
from .registry import register_policy_loss


@register_policy_loss("cispo")
def cispo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: Optional[float] = None,
    clip_ratio_high: float = 4.0,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """CISPO: clipped IS-weight policy optimisation (MiniMax-M1, arXiv 2506.13585).

    ``L = -sg(clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)) A log pi``: the importance
    weight is clipped and detached, the gradient always flows through ``log pi``, so no token is
    dropped (PPO's clip zeroes the gradient of clipped tokens). Written ``-sg(clip(rho)) A exp(log pi -
    sg(log pi))`` (:mod:`.ratio_common`), the value is ``-sg(clip(rho)) A``, the gradient is verl's
    ``compute_policy_loss_cispo``'s.

    Options (verl keys): ``clip_ratio_low`` (None: no lower bound, as MiniMax-M1), ``clip_ratio_high``
    (default 4: weights capped at 5, ScaleRL's / TRL's ``epsilon_high=5.0`` for cispo, which TRL
    uses as the cap itself). ``log_ratio_clip`` bounds ``log rho`` before ``exp`` (verl: 20).

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` (weight clipped at either bound, whatever the
    sign of A), ``ppo_kl``, ``ratio_mean``.
    """
    check_bounds("cispo", clip_ratio_low, clip_ratio_high, low_optional=True)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    lower = None if clip_ratio_low is None else 1.0 - clip_ratio_low
    with torch.no_grad():  # the weight is detached: value and derivative are -w A
        log_ratio, _ = clamped_log_ratio(lp, old, log_ratio_clip, in_range=False)
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(min=lower, max=1.0 + clip_ratio_high)
        coef = -weight * adv
    loss = with_derivative(coef, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = (token_frac(flag(torch.lt, ratio, lower) * m, count) if lower is not None
                                    else count.new_zeros(()))
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = token_frac(flag(torch.gt, ratio, 1.0 + clip_ratio_high) * m, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = token_mean(ratio * m, count)
    return loss, metrics  # 0 on the padding already (see prepare_inputs)



@register_policy_loss("sapo")
def sapo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """SAPO: soft adaptive policy optimisation (Gao et al. 2025, arXiv 2511.20347).

    The hard clip is replaced by a sigmoid gate: ``L = -f_tau(rho) A`` with
    ``f_tau(r) = (4 / tau) sigmoid(tau (r - 1))``, ``tau = tau_pos`` where ``A > 0`` else
    ``tau_neg``. ``f'(1) = 1``: on-policy the gradient is the policy gradient; far from 1 the gate
    flattens, so the update fades smoothly instead of being cut. ``tau_neg > tau_pos`` damps
    negative updates faster (the paper's asymmetry; defaults 1.0 / 1.05 as verl and TRL).

    Aggregation: verl's ``compute_policy_loss_sapo`` and TRL always reduce with
    ``seq-mean-token-mean`` (the paper's), whatever mode is configured. Here the per-token loss is
    reduced with the configured mode like every other loss; choose ``seq-mean-token-mean`` for the
    paper's objective (on verl, ``rlhf_ext_sapo`` with that mode equals verl's ``sapo``).

    Options: ``tau_pos``, ``tau_neg`` (verl ``actor.tau_pos``/``tau_neg``; TRL
    ``sapo_temperature_pos/neg``), ``log_ratio_clip`` (verl: 20). Metrics: ``ppo_kl``,
    ``ratio_mean``, ``gate_mean`` (mean ``f'(rho) = 4 s (1 - s) rho``: 1 on-policy).
    """
    check_positive("sapo", tau_pos=tau_pos, tau_neg=tau_neg)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        log_ratio, in_range = clamped_log_ratio(lp, old, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        positive = flag(torch.gt, adv, 0.0)
        # tau_pos where A > 0, else tau_neg: 1 * tau + 0 * tau' is exact, as torch.where would pick
        tau = (positive * tau_pos).add_(1.0 - positive, alpha=tau_neg)
        s = torch.sigmoid(tau * (ratio - 1.0))
        gate = s * tau.reciprocal().mul_(4.0)
        value = -gate * adv
        # d/dlog pi of -(4 / tau) sigmoid(tau (rho - 1)) A = -4 A s (1 - s) rho, times the clamp's derivative
        slope = (s * (1.0 - s)).mul_(ratio).mul_(4.0)
        coef = times_flag(-adv * slope, in_range)
    loss = with_derivative(value, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = token_mean(ratio * m, count)
    if metric_wanted("gate_mean"):
        metrics["gate_mean"] = token_mean(slope * m, count)
    return loss, metrics  # 0 on the padding already (see prepare_inputs)



__all__ = ["cispo", "sapo"]
