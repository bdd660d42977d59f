"""On-policy distillation in MindSpeed-RL 2.1.0's GRPO actor loss, the teacher in the reference slot.

``rl_config.distillation: {loss_mode: k1, use_policy_gradient: true, use_task_rewards: false, ...}`` (verl
0.9.1's ``DistillationLossConfig`` names, :class:`rlhf_ext.algorithms.DistillationConfig`) switches it on.
The teacher is the model MindSpeed-RL loads as its reference: ``rl_config.integrated_mode_config.
ref_model_load_path`` (integrated worker, the default: the teacher must have the student's architecture,
it is built by the actor's model provider) or ``ref_config.load`` (separate reference worker). The
reference worker then computes the teacher's log-probs of every sampled token into the transfer dock's
``ref_log_prob`` column, which the GRPO actor loss receives; that loss computes
:func:`rlhf_ext.algorithms.distillation_token_loss` on them and combines it with the task policy loss
as verl does (:func:`rlhf_ext.algorithms.distillation_term`, :func:`rlhf_ext.algorithms.combine_with_task_loss`).

Because the reference slot holds the teacher, there is no KL to the initial policy: the KL-to-reference
loss term is dropped (``actor/kl_loss`` reports 0), and ``init_kl_coef`` must be 0 and
``use_kl_in_reward`` false (refused otherwise, naming why). Refused as well, each with its reason:
``forward_kl_topk`` / ``topk`` (the reference worker computes only the sampled tokens' log-probs, no
top-k), ``teacher_key`` (one reference slot: one teacher), and, for now, the combination with rollout
correction and the token masks (``top_entropy_quantile``, ``off_policy_mask_threshold``), whose
semantics for the distillation term are not defined here. The teacher must share the student's
tokenizer (MindSpeed-RL builds both from ``megatron_training.tokenizer_name_or_path``).

The distillation policy-gradient term (``use_policy_gradient: true``) uses the task's policy loss
(``policy_loss_type`` and clip range, as :func:`.losses.policy_loss_and_options` resolves them) and the
same aggregation (``loss_agg_mode``, default ``token-mean``). Metrics ``distill/*`` (docs/distillation.md)
join the actor's. ``rl_config.distillation`` is validated in :func:`.config.check_distillation`.
A NaN/Inf teacher log-probability on a response token raises ``ValueError`` naming
``teacher_log_probs`` in the actor worker (MindSpeed-RL has no rlhf_ext non-finite guard).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

KEY = "distillation"  # the settings entry :func:`.config.check_distillation` writes


def config_of(settings: Mapping[str, Any]):
    """The :class:`rlhf_ext.algorithms.DistillationConfig` carried by the settings (validated by
    :func:`.config.check_distillation` when ``RLConfig`` was built), or ``None``."""
    from rlhf_ext.algorithms import DistillationConfig

    fields = settings.get(KEY)
    return None if not fields else DistillationConfig(**fields)


def distillation_loss(config, task_pg: torch.Tensor, log_probs: torch.Tensor, old_log_prob: Optional[torch.Tensor],
                      mask: torch.Tensor, batch, policy_loss: str, options: Mapping[str, Any], mode: str,
                      max_len=None):  # fmt: skip
    """``(actor policy loss, metrics)``: the task term ``task_pg`` (already aggregated) combined with the
    distillation term on the batch's ``ref_log_prob`` (the teacher's), as verl's ``distillation_ppo_loss``."""
    from rlhf_ext.algorithms import combine_with_task_loss, distillation_term, distillation_token_loss

    teacher = batch.get("ref_log_prob") if hasattr(batch, "get") else None
    if teacher is None:
        raise ValueError(
            "rl_config.distillation needs the teacher's log-probs in the actor batch (ref_log_prob, from the reference "
            "worker): MindSpeed-RL's GRPO trainer computes them; its DAPO trainer runs no reference worker")
    teacher = teacher.to(log_probs.device, log_probs.dtype)
    if old_log_prob is None:
        old_log_prob = log_probs.detach().clone()  # skip_actor_log_prob: the current policy sampled
    per_token, metrics = distillation_token_loss(config, mask, student_log_probs=log_probs, teacher_log_probs=teacher)
    term, term_metrics = distillation_term(per_token, mask, config=config, log_probs=log_probs,
                                           old_log_probs=old_log_prob, policy_loss=policy_loss,
                                           policy_loss_options=options, loss_agg_mode=mode,
                                           max_len=max_len)  # fmt: skip
    metrics.update(term_metrics)
    return combine_with_task_loss(task_pg, term, config), metrics
