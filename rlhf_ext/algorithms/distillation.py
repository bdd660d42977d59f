"""On-policy distillation: a teacher scores every token the student sampled; verl 0.9.1's two ways of using it.

The per-token losses are in :mod:`.distillation_losses`. This module combines them as verl's
``trainer/distillation/losses.py`` (``distillation_loss`` and ``distillation_ppo_loss``) does:

* **as a loss** (``use_policy_gradient=False``): the clamped per-token loss is backpropagated and
  aggregated with any :data:`rlhf_ext.algorithms.LOSS_AGG_MODES` mode -- supervised on-policy KD,
  Agarwal et al. 2023, "On-Policy Distillation of Language Models" (GKD), arXiv 2306.13649. Use ``k3``
  (or ``k2``, ``abs``) or ``forward_kl_topk``; ``k1`` is refused (its gradient does not depend on the
  teacher).
* **as a reward** (``use_policy_gradient=True``): the per-token advantage is ``-loss.detach()``, i.e.
  ``-(log pi_s - log pi_t)`` for ``k1``, optimised with any rlhf_ext policy loss (verl: its ``vanilla``
  PPO with clip 0.2 / 0.2 and dual clip 3, :data:`VERL_PG_OPTIONS` for rlhf_ext's ``ppo``) -- Thinking
  Machines, "On-Policy Distillation" (Lu et al. 2025, https://thinkingmachines.ai/blog/on-policy-distillation/).

Either **alone** (``use_task_rewards=False``: the loss is the distillation term) or **with task rewards**
(``use_task_rewards=True``: ``task_policy_loss + distillation_loss_coef * distillation_term``, the task
policy loss computed from the task advantages with the same policy loss). With policy gradient the two
terms are two surrogate losses summed, not one loss on summed advantages (they differ where the
clip binds), exactly as verl.

Entry points for hosts:

* :func:`distillation_token_loss` -- the per-token loss and its metrics from the config's ``loss_mode``;
* :func:`distillation_term` -- the aggregated distillation term (verl ``distillation_loss``);
* :func:`combine_with_task_loss` -- verl's combination of a host's task policy loss with that term;
* :func:`distillation_policy_loss` -- all three with an rlhf_ext policy loss for the task part (verl
  ``distillation_ppo_loss``); the MindSpeed-RL glue calls it.

Metric ``distill/loss`` is the aggregated distillation term (before ``distillation_loss_coef``, as verl's
``distillation/loss``); the others are listed in :mod:`.distillation_losses`; the distillation policy-gradient
loss's own metrics are prefixed ``distill/pg/``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import torch

from .aggregation import LOSS_AGG_MODES, aggregate_loss
from .distillation_losses import available_distillation_losses, get_distillation_loss
from .registry import get_policy_loss

Metrics = Dict[str, torch.Tensor]

# verl 0.9.1's policy loss for use_policy_gradient=True: ``vanilla`` with DistillationLossConfig's clip
# ratios 0.2 / 0.2 and compute_policy_loss_vanilla's default dual clip 3.0 == rlhf_ext's ``ppo`` with these.
VERL_PG_OPTIONS: Mapping[str, float] = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "dual_clip": 3.0}


@dataclass(frozen=True)
class DistillationConfig:
    """verl 0.9.1's ``DistillationLossConfig`` fields (and ``DistillationConfig.teacher_key``), same defaults as
    its dataclass (``verl/workers/config/distillation.py``; its YAML ``distillation.yaml`` differs: topk 32,
    both clamps null, use_policy_gradient false -- a verl YAML user gets those).

    ``loss_mode``: a registered distillation loss (``kl``/``k1``, ``abs``, ``mse``/``k2``,
    ``low_var_kl``/``k3``, ``forward_kl_topk``); ``topk``: teacher top-k size for top-k losses;
    ``use_policy_gradient``: reward (True) or loss (False); ``use_task_rewards``: add the task policy loss;
    ``distillation_loss_coef``: weight of the distillation term when ``use_task_rewards`` (ignored, i.e. 1,
    without); ``log_prob_min_clamp`` / ``loss_max_clamp``: see :mod:`.distillation_losses` (``None``: off);
    ``teacher_key``: the data field routing a sample to its teacher (several teachers).
    """

    loss_mode: str = "k3"
    topk: Optional[int] = 128
    use_policy_gradient: bool = True
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    log_prob_min_clamp: Optional[float] = -10.0
    loss_max_clamp: Optional[float] = 10.0
    teacher_key: str = "data_source"

    def __post_init__(self):
        known = available_distillation_losses()
        if self.loss_mode not in known:
            raise ValueError(f"distillation loss_mode {self.loss_mode!r} is unknown; registered: {', '.join(known)}")
        for name in ("use_policy_gradient", "use_task_rewards"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"distillation {name} must be a bool, got {getattr(self, name)!r}")
        if self.uses_topk and (isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1):
            raise ValueError(f"distillation loss_mode {self.loss_mode!r} needs topk, a positive int; got {self.topk!r}")
        if not self.use_policy_gradient and self.loss_mode in ("kl", "k1"):
            raise ValueError(
                f"distillation loss_mode {self.loss_mode!r} with use_policy_gradient=False: backpropagating k1 is "
                "wrong, its gradient wrt the student does not depend on the teacher; use k3 (or k2, abs, "
                "forward_kl_topk) as a loss, or k1 with use_policy_gradient=True"
            )
        coef = self.distillation_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
            raise ValueError(f"distillation distillation_loss_coef must be a finite number >= 0, got {coef!r}")
        for name in ("loss_max_clamp", "log_prob_min_clamp"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):  # fmt: skip
                raise ValueError(f"distillation {name} must be a finite number or None, got {value!r}")
        if self.loss_max_clamp is not None and not self.loss_max_clamp > 0:
            raise ValueError(f"distillation loss_max_clamp must be > 0 or None, got {self.loss_max_clamp!r}")
        if self.log_prob_min_clamp is not None and not self.log_prob_min_clamp <= 0:
            raise ValueError(f"distillation log_prob_min_clamp must be <= 0 or None, got {self.log_prob_min_clamp!r}")
        if not isinstance(self.teacher_key, str) or not self.teacher_key:
            raise ValueError(f"distillation teacher_key must be a non-empty string, got {self.teacher_key!r}")
        if self.use_policy_gradient and self.uses_topk:
            warnings.warn(
                "distillation: forward_kl_topk with use_policy_gradient=True uses only the sampled token's "
                "gradient, so the top-k signal is mostly unused (verl warns the same); "
                "prefer use_policy_gradient=False",
                stacklevel=3,
            )

    @property
    def uses_topk(self) -> bool:
        """True when the loss needs the student's logits and the teacher's top-k ids and log-probs."""
        return bool(getattr(get_distillation_loss(self.loss_mode), "uses_topk", False))

    @property
    def needs_task_advantages(self) -> bool:
        return self.use_task_rewards


def distillation_token_loss(
    config: DistillationConfig,
    mask: torch.Tensor,
    *,
    student_log_probs: Optional[torch.Tensor] = None,
    teacher_log_probs: Optional[torch.Tensor] = None,
    student_logits: Optional[torch.Tensor] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    teacher_topk_log_probs: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """Per-token distillation loss ``[B, T]`` (clamped, 0 on padding) and metrics for ``config.loss_mode``.

    Estimators need ``student_log_probs`` and ``teacher_log_probs`` (the sampled tokens', ``[B, T]``);
    ``forward_kl_topk`` needs ``student_logits`` ``[B, T, V]``, ``teacher_topk_ids`` and
    ``teacher_topk_log_probs`` ``[B, T, topk]``."""
    fn = get_distillation_loss(config.loss_mode)
    clamps = {"log_prob_min_clamp": config.log_prob_min_clamp, "loss_max_clamp": config.loss_max_clamp}
    if config.uses_topk:
        missing = [n for n, v in (("student_logits", student_logits), ("teacher_topk_ids", teacher_topk_ids),
                                  ("teacher_topk_log_probs", teacher_topk_log_probs)) if v is None]  # fmt: skip
        if missing:
            raise ValueError(f"distillation loss_mode {config.loss_mode!r} needs {', '.join(missing)}")
        return fn(student_logits, teacher_topk_ids, teacher_topk_log_probs, mask, topk=config.topk, **clamps)
    missing = [n for n, v in (("student_log_probs", student_log_probs), ("teacher_log_probs", teacher_log_probs))
               if v is None]  # fmt: skip
    if missing:
        raise ValueError(f"distillation loss_mode {config.loss_mode!r} needs {', '.join(missing)}")
    return fn(student_log_probs, teacher_log_probs, mask, **clamps)


def _policy_loss_fn(policy_loss: Union[str, Callable]) -> Callable:
    return get_policy_loss(policy_loss) if isinstance(policy_loss, str) else policy_loss


def distillation_term(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    config: DistillationConfig,
    log_probs: Optional[torch.Tensor] = None,
    old_log_probs: Optional[torch.Tensor] = None,
    policy_loss: Union[str, Callable] = "ppo",
    policy_loss_options: Optional[Mapping] = None,
    loss_agg_mode: str = "token-mean",
    token_weights: Optional[torch.Tensor] = None,
    **agg_counts,
) -> Tuple[torch.Tensor, Metrics]:
    """The aggregated distillation term (verl ``distillation_loss``) from :func:`distillation_token_loss`'s output.

    ``use_policy_gradient=False``: ``aggregate_loss(per_token_loss, mask, loss_agg_mode, **agg_counts)``.
    ``use_policy_gradient=True``: ``policy_loss(log_probs, old_log_probs, -per_token_loss.detach(), mask,
    **policy_loss_options)``, times ``token_weights`` when given (verl's ``rollout_is_weights``), aggregated the
    same way; ``log_probs`` / ``old_log_probs`` (current and rollout-time student, ``[B, T]``) are then required.
    ``agg_counts``: ``num_tokens``, ``num_seqs``, ``max_len`` as :func:`rlhf_ext.algorithms.aggregate_loss`.
    Metrics: ``distill/loss`` (this term, detached) and, with policy gradient, the policy loss's metrics
    prefixed ``distill/pg/``."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {loss_agg_mode!r}; choose from {', '.join(LOSS_AGG_MODES)}")
    metrics: Metrics = {}
    if config.use_policy_gradient:
        if log_probs is None or old_log_probs is None:
            raise ValueError("distillation with use_policy_gradient=True needs log_probs and old_log_probs")
        advantages = -per_token_loss.detach()
        pg_loss, pg_metrics = _policy_loss_fn(policy_loss)(log_probs, old_log_probs, advantages, mask,
                                                           **dict(policy_loss_options or {}))  # fmt: skip
        if token_weights is not None:
            pg_loss = pg_loss * token_weights
        term = aggregate_loss(pg_loss, mask, loss_agg_mode, **agg_counts)
        metrics.update({f"distill/pg/{k}": v for k, v in pg_metrics.items()})
    else:
        term = aggregate_loss(per_token_loss, mask, loss_agg_mode, **agg_counts)
    metrics["distill/loss"] = term.detach()
    return term, metrics


def combine_with_task_loss(task_loss, distill_term: torch.Tensor, config: DistillationConfig) -> torch.Tensor:
    """verl ``distillation_ppo_loss``'s combination: ``task_loss + distillation_loss_coef * distill_term`` with
    ``use_task_rewards``, else ``distill_term`` alone (coefficient 1; ``task_loss`` is ignored and may be None)."""
    if not config.use_task_rewards:
        return distill_term
    if task_loss is None:
        raise ValueError("distillation with use_task_rewards=True needs the task policy loss (task rewards)")
    return task_loss + config.distillation_loss_coef * distill_term


def distillation_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: Optional[torch.Tensor],
    mask: torch.Tensor,
    *,
    config: DistillationConfig,
    teacher_log_probs: Optional[torch.Tensor] = None,
    student_logits: Optional[torch.Tensor] = None,
    teacher_topk_ids: Optional[torch.Tensor] = None,
    teacher_topk_log_probs: Optional[torch.Tensor] = None,
    policy_loss: Union[str, Callable] = "ppo",
    policy_loss_options: Optional[Mapping] = None,
    loss_agg_mode: str = "token-mean",
    token_weights: Optional[torch.Tensor] = None,
    **agg_counts,
) -> Tuple[torch.Tensor, Metrics]:
    """The whole actor loss of an on-policy distillation step (verl ``distillation_ppo_loss``), as a scalar.

    ``log_probs`` (current student, with grad), ``old_log_probs`` (rollout-time student), ``advantages`` (task
    advantages; required only with ``use_task_rewards``) and ``mask`` are ``[B, T]``; the teacher inputs as
    :func:`distillation_token_loss` (for ``forward_kl_topk``, ``student_logits`` must be the logits
    ``log_probs`` were taken from, so the gradient reaches the model through both). The task part is
    ``aggregate(policy_loss(log_probs, old_log_probs, advantages, mask) * token_weights)`` with the same
    policy loss, options and aggregation as the distillation term. Returns ``(loss, metrics)``: the task policy
    loss's metrics under their own names, ``distill/task_loss`` (when used) and the distillation metrics."""
    if config.use_task_rewards and advantages is None:
        raise ValueError("distillation with use_task_rewards=True needs the task advantages (a task reward)")
    per_token, metrics = distillation_token_loss(
        config, mask, student_log_probs=log_probs, teacher_log_probs=teacher_log_probs,
        student_logits=student_logits, teacher_topk_ids=teacher_topk_ids,
        teacher_topk_log_probs=teacher_topk_log_probs,
    )  # fmt: skip
    options = dict(policy_loss_options or {})
    term, term_metrics = distillation_term(
        per_token, mask, config=config, log_probs=log_probs, old_log_probs=old_log_probs, policy_loss=policy_loss,
        policy_loss_options=options, loss_agg_mode=loss_agg_mode, token_weights=token_weights, **agg_counts,
    )  # fmt: skip
    metrics.update(term_metrics)
    task_loss = None
    if config.use_task_rewards:
        task_tokens, task_metrics = _policy_loss_fn(policy_loss)(log_probs, old_log_probs, advantages, mask, **options)
        if token_weights is not None:
            task_tokens = task_tokens * token_weights
        task_loss = aggregate_loss(task_tokens, mask, loss_agg_mode, **agg_counts)
        metrics = {**task_metrics, **metrics, "distill/task_loss": task_loss.detach()}
    return combine_with_task_loss(task_loss, term, config), metrics


__all__ = [
    "VERL_PG_OPTIONS",
    "DistillationConfig",
    "distillation_token_loss",
    "distillation_term",
    "combine_with_task_loss",
    "distillation_policy_loss",
]
