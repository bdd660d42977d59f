"""verl's ``bypass_mode`` policy loss: the rollout engine's log-probs are the behaviour policy, and the
rollout correction is computed inside the loss, against the current policy.

Convention: :mod:`.ppo_losses` (``fn(log_probs, old_log_probs, advantages, mask, **options) ->
(per_token_loss[B, T], metrics)``), except that ``old_log_probs`` must be the *rollout* log-probs
(verl's trainer puts them in place of ``log pi_old`` in bypass mode and skips the old-log-prob pass).
A host that hands its losses the trainer's recomputed ``log pi_old`` cannot run it as such; it has
the same numbers as rlhf_ext's bypass flag with ``ppo`` / ``pg`` (docs/rollout_correction.md).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .metric_requests import metric_wanted
from .ppo_losses import pg, ppo
from .ratio_common import Metrics
from .registry import register_policy_loss
from .rollout_correction import (RolloutCorrection, apply_rollout_correction, rejection_thresholds,
                                 rollout_correction)

NAME = "bypass_mode"
LOSS_TYPES = ("ppo_clip", "reinforce")
METRIC_PREFIX = "rollout_corr/"


@register_policy_loss(NAME)
def bypass_mode(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "ppo_clip",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: Optional[float] = None,
    dual_clip: Optional[float] = None,
    delta: Optional[float] = None,
    rollout_is: Optional[str] = "sequence",
    rollout_is_threshold=2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs=None,
    rollout_rs_threshold=None,
) -> Tuple[torch.Tensor, Metrics]:
    """verl 0.9.1's ``compute_policy_loss_bypass_mode`` (``core_algos.py``; rollout correction from
    ``rollout_corr_helper``), with ``old_log_probs`` the rollout log-probs ``log pi_rollout``.

    The correction (:func:`.rollout_correction.rollout_correction`, verl's option names: ``rollout_is``
    level and ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs`` /
    ``rollout_rs_threshold``; defaults those of verl's ``RolloutCorrectionConfig``: sequence-level IS
    truncated at 2, no rejection) is computed from ``d = log pi - log pi_rollout`` with the current,
    detached ``log pi``; then by ``loss_type``:

    * ``ppo_clip`` (verl's default): PPO's clipped surrogate (:func:`.ppo_losses.ppo`; verl's
      ``vanilla``, dual clip ``dual_clip`` = verl's ``clip_ratio_c``; TRL's ``delta`` too) with the ratio ``pi / pi_rollout``,
      which already corrects for the rollout policy, so the IS weights are *not* applied (verl: that
      would count the correction twice); the rejection mask zeroes the rejected tokens;
    * ``reinforce``: ``-w A log pi`` (:func:`.ppo_losses.pg` times the detached, truncated weight
      ``w`` of ``pi / pi_rollout``; 0 on rejected tokens; Yao et al. 2025, TIS).

    Rejected tokens stay in the aggregation's counts as zero-loss tokens (rlhf_ext's rule on every host).
    verl's loss aggregates over the kept tokens, which changes only ``seq-mean-token-mean`` (each
    sequence divided by its kept tokens) and, without the global counts its actor passes
    (``global_batch_info``), ``token-mean``.

    Metrics: the loss's own (``ppo_kl`` ...) and the correction's, as ``rollout_corr/<name>``.
    """
    # reinforce ignores dual_clip as verl's does (verl's actor always sets clip_ratio_c); delta is asked for
    if loss_type == "reinforce" and delta is not None:
        raise ValueError("bypass_mode: loss_type=reinforce has no ratio to cap (-w A log pi); delta applies to "
                         "loss_type=ppo_clip")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"bypass_mode: loss_type must be one of {', '.join(LOSS_TYPES)} (verl's "
                         f"rollout_correction.loss_type), got {loss_type!r}")
    config = RolloutCorrection(is_level=rollout_is, is_threshold=rollout_is_threshold,
                               batch_normalize=bool(rollout_is_batch_normalize),
                               rejection=rejection_thresholds(rollout_rs, rollout_rs_threshold, thresholds_alone=True))
    # ppo_clip uses the weights for nothing but metrics: without rejection and with none of them wanted
    # (a host's step metrics off), the correction is not computed at all
    needed = (loss_type == "reinforce" and config.is_level is not None) or bool(config.rejection) or any(
        metric_wanted(METRIC_PREFIX + key) for key in ("k1_kl", "k3_kl", "is_mean", "weight_mean", "ess"))
    result = rollout_correction(log_probs.detach(), old_log_probs, mask, config) if needed else None
    if loss_type == "reinforce":
        per_token, metrics = pg(log_probs, old_log_probs, advantages, mask)
        if result is not None:
            per_token = apply_rollout_correction(per_token, result)
    else:
        per_token, metrics = ppo(log_probs, old_log_probs, advantages, mask, clip_ratio_low=clip_ratio_low,
                                 clip_ratio_high=clip_ratio_high, dual_clip=dual_clip, delta=delta)
        if config.rejection:
            per_token = torch.where(result.mask, per_token, per_token.new_zeros(()))
    metrics = dict(metrics)
    for key, value in (result.metrics if result is not None else {}).items():
        if metric_wanted(METRIC_PREFIX + key):
            metrics[METRIC_PREFIX + key] = value
    return per_token, metrics


__all__ = ["LOSS_TYPES", "NAME", "bypass_mode"]
