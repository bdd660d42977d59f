"""Framework-free RL algorithms, selectable by name.

Registries (verl ``core_algos.py`` style)::

    from rlhf_ext.algorithms import get_advantage, register_advantage

    adv = get_advantage("grpo")(scores)          # scores: [num_prompts, samples_per_prompt]

    @register_advantage("my_estimator")
    def my_estimator(scores, **options): ...

Third-party packages register through the entry point group ``rlhf_ext.algorithms``.
See docs/algorithms.md for each formula, its paper and the OpenRLHF flag that selects it.
"""

from .registry import (
    ENTRY_POINT_GROUP,
    UnknownNameError,
    available_advantages,
    available_kl_estimators,
    available_policy_losses,
    available_token_advantages,
    get_advantage,
    get_kl_estimator,
    get_policy_loss,
    get_token_advantage,
    register_advantage,
    register_kl_estimator,
    register_policy_loss,
    register_token_advantage,
)
from .advantages import dr_grpo, grpo, maxrl, passk, reinforce_pp, reinforce_pp_baseline, rft, rloo, whiten
from .advantages import HOST_INPUTS, gdpo, gpg, host_inputs, opo, optimal_token_baseline, passk_best
from .ppo_losses import gspo, noclip, pg, ppo, ppo_clip_fractions
from .loss_options import CLIP_HIGH, CLIP_LOW, OLD_CLIP_NAMES, accepted_options
from .token_weight_losses import cispo, sapo
from .sequence_losses import gmpo, luspo, vespo
from .covariance_losses import clip_cov, kl_cov
from .dppo_losses import dppo_kl, dppo_tv
from .dro_loss import dro
from .bypass_loss import bypass_mode
from .multiturn_token_baseline import tir_optimal_token_baseline
from .ratio_caps import refusal as ratio_cap_refusal
from .token_estimators import MISSING_INPUT as TOKEN_ESTIMATOR_INPUT
from .updates import UpdateCounter, has_signal, zero_advantage_rows
from .aggregation import LOSS_AGG_MODES, aggregate_loss
from .kl import abs_kl, k1, k2, k3, k3_bias_corrected, k3_plus, kl_estimate, parse_kl_clip
from .dapo import overlong_penalty, zero_variance_groups
from .dapo import off_policy_sequence_mask, top_entropy_mask, truncated_completion_mask
from .preference import nll_loss, simpo_loss, simpo_objective
from .mismatch import MISMATCH_METRICS, mismatch_stats
from .checks import deferred_finite_checks
from .metric_requests import metric_wanted, only_metrics
from .rollout_correction import (
    IS_LEVELS,
    REJECTION_OPTIONS,
    CorrectionResult,
    RolloutCorrection,
    apply_rollout_correction,
    openrlhf_correction,
    rollout_correction,
)
from .sampling_support import kept_log_mass, truncated_log_probs
from .gigpo import gigpo, gigpo_turn_advantages
from .staleness import behaviour_weights, decoupled_objective, m2po_mask, proximal_log_probs
from .entropy_control import AdaptiveEntropyCoef
from .ref_sync import mix_into_reference, sync_due
from .distillation_losses import (
    available_distillation_losses,
    forward_kl_topk,
    get_distillation_loss,
    register_distillation_loss,
    reverse_kl_abs,
    reverse_kl_k1,
    reverse_kl_k2,
    reverse_kl_k3,
)
from .distillation import (
    VERL_PG_OPTIONS,
    DistillationConfig,
    combine_with_task_loss,
    distillation_policy_loss,
    distillation_term,
    distillation_token_loss,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "UnknownNameError",
    "available_advantages",
    "available_kl_estimators",
    "available_policy_losses",
    "get_advantage",
    "get_kl_estimator",
    "get_policy_loss",
    "register_advantage",
    "register_kl_estimator",
    "register_policy_loss",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "passk",
    "maxrl",
    "rft",
    "whiten",
    "gpg",
    "opo",
    "passk_best",
    "gdpo",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "ratio_cap_refusal",
    "available_token_advantages",
    "get_token_advantage",
    "register_token_advantage",
    "TOKEN_ESTIMATOR_INPUT",
    "HOST_INPUTS",
    "host_inputs",
    "ppo",
    "ppo_clip_fractions",
    "CLIP_LOW",
    "CLIP_HIGH",
    "OLD_CLIP_NAMES",
    "accepted_options",
    "gspo",
    "pg",
    "noclip",
    "cispo",
    "sapo",
    "gmpo",
    "clip_cov",
    "kl_cov",
    "dppo_tv",
    "dppo_kl",
    "dro",
    "bypass_mode",
    "luspo",
    "vespo",
    "UpdateCounter",
    "has_signal",
    "zero_advantage_rows",
    "LOSS_AGG_MODES",
    "aggregate_loss",
    "k1",
    "k2",
    "k3",
    "kl_estimate",
    "parse_kl_clip",
    "abs_kl",
    "k3_plus",
    "k3_bias_corrected",
    "zero_variance_groups",
    "overlong_penalty",
    "truncated_completion_mask",
    "off_policy_sequence_mask",
    "top_entropy_mask",
    "simpo_loss",
    "simpo_objective",
    "nll_loss",
    "MISMATCH_METRICS",
    "mismatch_stats",
    "deferred_finite_checks",
    "metric_wanted",
    "only_metrics",
    "IS_LEVELS",
    "REJECTION_OPTIONS",
    "CorrectionResult",
    "RolloutCorrection",
    "apply_rollout_correction",
    "openrlhf_correction",
    "rollout_correction",
    "kept_log_mass",
    "truncated_log_probs",
    "available_distillation_losses",
    "get_distillation_loss",
    "register_distillation_loss",
    "reverse_kl_k1",
    "reverse_kl_abs",
    "reverse_kl_k2",
    "reverse_kl_k3",
    "forward_kl_topk",
    "VERL_PG_OPTIONS",
    "DistillationConfig",
    "distillation_token_loss",
    "distillation_term",
    "combine_with_task_loss",
    "distillation_policy_loss",
    "gigpo",
    "gigpo_turn_advantages",
    "behaviour_weights",
    "decoupled_objective",
    "m2po_mask",
    "proximal_log_probs",
    "AdaptiveEntropyCoef",
    "mix_into_reference",
    "sync_due",
]
