"""DRO: the policy gradient with a quadratic penalty on the log-ratio to the behaviour policy
(Direct Reward Optimisation; verl 0.9.1 ``compute_policy_loss_dro``, ``policy_loss.dro_beta``).

Convention, padding and cost: :mod:`.ratio_common`.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from .linearised import with_derivative
from .metric_requests import metric_wanted
from .ppo_losses import zero_padded_mean
from .ratio_common import Metrics, prepare_inputs
from .registry import register_policy_loss


@register_policy_loss("dro")
def dro(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    dro_beta: float = 0.1,
) -> Tuple[torch.Tensor, Metrics]:
    """DRO's per-token loss ``L = -(A log pi - beta/2 (log pi - log pi_old)^2)`` (Richemond et al. 2024,
    "Offline regularised reinforcement learning for large language models alignment", arXiv 2405.19107;
    formula as verl 0.9.1's ``core_algos.compute_policy_loss_dro``).

    The policy gradient ``-A grad log pi`` plus ``beta (log pi - log pi_old) grad log pi``: a soft trust
    region that pulls the policy back toward the one that sampled, in proportion to how far it moved,
    instead of PPO's hard clip. On-policy (``pi = pi_old``) the penalty and its gradient are 0 and the
    loss is :func:`.ppo_losses.pg`'s. ``dro_beta`` (verl's key, > 0) is the penalty's weight; verl
    has no default and requires it, rlhf_ext's 0.1 is only a starting point (one tenth of the policy
    gradient's pull at a log-ratio of 1 per unit advantage). The log-ratio is not clamped (no ``exp``: nothing can overflow), as in verl;
    value and gradient are verl's.

    Metrics: ``ppo_kl`` (mean of ``log pi_old - log pi``), ``dro_penalty`` (mean of
    ``(log pi - log pi_old)^2 / 2``, the penalty before ``beta``).
    """
    if dro_beta is None or isinstance(dro_beta, bool) or not (dro_beta > 0 and math.isfinite(dro_beta)):
        raise ValueError(f"dro: dro_beta must be a finite number > 0 (verl's policy_loss.dro_beta), got {dro_beta!r}")
    _, lp, old, adv, _, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        d = lp.detach() - old  # 0 on the padding (zeroed inputs)
        half_sq = 0.5 * d * d
        value = torch.addcmul(dro_beta * half_sq, adv, lp.detach(), value=-1.0)  # -(A lp - beta d^2 / 2)
        derivative = torch.add(-adv, d, alpha=dro_beta)  # -(A - beta d)
    loss = with_derivative(value, lp, derivative)
    metrics: Metrics = {}
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(d, count, negate=True)
    if metric_wanted("dro_penalty"):
        metrics["dro_penalty"] = zero_padded_mean(half_sq, count)
    return loss, metrics


__all__ = ["dro"]
