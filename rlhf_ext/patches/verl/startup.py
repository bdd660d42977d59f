"""Start-up checks of a verl run's rlhf_ext settings, and the off-policy sequence mask's setting.

Seam: ``verl.utils.config.validate_config(config, use_reference_policy, use_critic)``, which
``verl.trainer.main_ppo`` (and ``main_ppo_v0``, the one-step-off-policy recipe) calls on the
driver before any worker starts. The wrapper runs verl's checks, then :func:`config_problems`;
a problem raises ``ValueError`` there, so a run that cannot work stops before the first batch:

* ``algorithm.adv_estimator=rlhf_ext_<name>`` for an estimator that needs the reward's components
  (``gdpo``): verl 0.9.1's ``compute_advantage`` hands ``non_tensor_batch`` only to the estimator
  named exactly ``gdpo``, so the message points there;
* ``rlhf_ext_optimal_token_baseline`` / ``rlhf_ext_tir_optimal_token_baseline``: the estimator needs each
  token's ``sum_v pi_v^2`` and the old log-probs, which verl computes only with
  ``actor.calculate_sum_pi_squared`` (passed on by :mod:`.token_baseline`; equal to verl's own, tests/verl_env);
* any other ``rlhf_ext_<name>`` that is not registered;
* ``actor.kl_loss_type=k3_bias_corrected``: verl's KL loss calls ``kl_penalty(logprob,
  ref_logprob)`` without the old log-probs that the correction weight ``pi / pi_old`` needs (verl's
  own ``k3+`` is its unbiased-gradient KL loss);
* ``policy_loss.loss_mode=rlhf_ext_bypass_mode``: the loss needs the rollout log-probs as its old ones,
  which verl hands a loss only in bypass mode, where its trainer selects its own ``bypass_mode`` loss;
* the loss-mask variables (:data:`TOKEN_MASK_ENVS`), which travel to the workers like
  ``RLHF_EXT_VERL_KL_CLIP`` (``+ray_kwargs.ray_init.runtime_env.env_vars.<NAME>=...``):
  ``RLHF_EXT_VERL_OFF_POLICY_MASK_THRESHOLD`` works with rlhf_ext's losses (``rlhf_ext_<loss>``);
  ``RLHF_EXT_VERL_TOP_ENTROPY_QUANTILE`` and ``RLHF_EXT_VERL_MASK_TRUNCATED_COMPLETIONS`` are
  refused: verl's actor computes token entropy (and knows nothing of truncation) but calls a
  policy loss with only the log-probs, advantages, response mask and config.

:func:`env_problems` runs again when ``core_algos`` is imported (every process), so a worker with a
bad value stops too. ``RLHF_EXT_VERL_ADAPTIVE_ENTROPY`` is checked here too (:mod:`.entropy_control`:
its syntax, bounds around ``actor.entropy_coeff``, an entropy to measure, no distillation).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, List, Optional

from .names import PREFIX

OFF_POLICY_ENV = "RLHF_EXT_VERL_OFF_POLICY_MASK_THRESHOLD"
TOP_ENTROPY_ENV = "RLHF_EXT_VERL_TOP_ENTROPY_QUANTILE"
TRUNCATED_ENV = "RLHF_EXT_VERL_MASK_TRUNCATED_COMPLETIONS"
TOKEN_MASK_ENVS = (OFF_POLICY_ENV, TOP_ENTROPY_ENV, TRUNCATED_ENV)
BIAS_CORRECTED_KL = "k3_bias_corrected"
BYPASS_LOSS = "bypass_mode"  # rlhf_ext.algorithms.bypass_mode
VALIDATE_SEAM = ("config", "use_reference_policy", "use_critic")


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name, "")
    return value.strip() or None


def off_policy_threshold() -> Optional[float]:
    """``RLHF_EXT_VERL_OFF_POLICY_MASK_THRESHOLD`` as a number, None when unset; ``ValueError`` when bad."""
    text = _env(OFF_POLICY_ENV)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{OFF_POLICY_ENV} must be a number >= 0, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{OFF_POLICY_ENV} must be a finite number >= 0, got {text!r}")
    return value


def env_problems() -> List[str]:
    problems = []
    try:
        off_policy_threshold()
    except ValueError as exc:
        problems.append(str(exc))
    if _env(TOP_ENTROPY_ENV) is not None:
        problems.append(
            f"{TOP_ENTROPY_ENV} is set, but verl 0.9.1 calls a policy loss without the token entropy its actor "
            "computes (policy_loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, "
            "rollout_is_weights)), so top_entropy_quantile cannot be applied on verl; unset it")
    if _env(TRUNCATED_ENV) is not None:
        problems.append(
            f"{TRUNCATED_ENV} is set, but verl 0.9.1's policy loss receives no truncation flag (only the response "
            "mask), so truncated completions cannot be told apart on verl; unset it (verl's DAPO recipe shapes "
            "overlong responses in the reward instead)")
    from .entropy_control import env_problems as entropy_env_problems

    return problems + entropy_env_problems()


def _get(node: Any, dotted: str, default=None):
    for part in dotted.split("."):
        if node is None:
            return default
        getter = getattr(node, "get", None)
        node = getter(part, None) if getter is not None else getattr(node, part, None)
    return default if node is None else node


def config_problems(config: Any) -> List[str]:
    """Everything in a verl run config that rlhf_ext cannot run (empty: fine)."""
    from rlhf_ext.algorithms import available_advantages, available_token_advantages, get_advantage, host_inputs

    problems = env_problems()
    estimator = str(_get(config, "algorithm.adv_estimator", ""))
    if estimator.startswith(PREFIX):
        name = estimator[len(PREFIX):]
        if name in available_token_advantages():
            if not _get(config, "actor_rollout_ref.actor.calculate_sum_pi_squared", False):
                problems.append(
                    f"algorithm.adv_estimator={estimator}: the token-level estimator needs each token's "
                    "sum_pi_squared (sum over the vocabulary of pi^2), which verl's actor computes only with "
                    "actor_rollout_ref.actor.calculate_sum_pi_squared=True")
        elif name not in available_advantages():
            problems.append(f"algorithm.adv_estimator={estimator} is not an rlhf_ext estimator; rlhf_ext's: "
                            + ", ".join(PREFIX + n for n in available_advantages()))
        elif "turns" in host_inputs(get_advantage(name)):
            problems.append(
                f"algorithm.adv_estimator={estimator} assigns an advantage per agent turn from each turn's reward "
                "and anchor state, and verl 0.9.1's compute_advantage passes an estimator token rewards, masks and "
                "the group index only (no turns); GiGPO runs on OpenRLHF's multi-turn agent executor")
        elif "components" in host_inputs(get_advantage(name)):
            problems.append(
                f"algorithm.adv_estimator={estimator} normalises each reward component separately, but verl 0.9.1 "
                "hands the reward's components (non_tensor_batch) only to the estimator named exactly 'gdpo': use "
                "algorithm.adv_estimator=gdpo with algorithm.gdpo_reward_keys=[reward_accuracy,reward_format] "
                "(rlhf_ext's verl reward reports its components as reward_<name>)")
    actor = _get(config, "actor_rollout_ref.actor")
    kl_type = str(_get(actor, "kl_loss_type", ""))
    if _get(actor, "use_kl_loss", False) and kl_type.replace(PREFIX, "") == BIAS_CORRECTED_KL:
        problems.append(
            f"actor_rollout_ref.actor.kl_loss_type={kl_type}: the bias-corrected k3 weights KL by pi/pi_old, but "
            "verl 0.9.1's KL loss calls kl_penalty(logprob, ref_logprob) without the old log-probs; verl's own "
            "kl_loss_type=k3+ is its unbiased-gradient KL loss")
    loss_mode = str(_get(actor, "policy_loss.loss_mode", "vanilla"))
    if loss_mode == PREFIX + BYPASS_LOSS:
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}: the loss needs the rollout log-probs in place "
            "of the old ones, which verl 0.9.1 does only with algorithm.rollout_correction.bypass_mode=true, and then "
            "its apply_bypass_mode sets loss_mode to its own bypass_mode (equal to rlhf_ext's, tests/verl_env): "
            "use algorithm.rollout_correction.bypass_mode=true")
    if _env(OFF_POLICY_ENV) is not None and not loss_mode.startswith(PREFIX):
        problems.append(
            f"{OFF_POLICY_ENV} applies to rlhf_ext's policy losses, but actor_rollout_ref.actor.policy_loss.loss_mode="
            f"{loss_mode} is verl's own: use {PREFIX}{'ppo' if loss_mode == 'vanilla' else loss_mode} or unset it")
    from .entropy_control import config_problems as entropy_config_problems

    return problems + entropy_config_problems(config, _get)


def make_validate_config(original):
    @functools.wraps(original)
    def validate_config(config, use_reference_policy, use_critic, *args, **kwargs):
        result = original(config, use_reference_policy, use_critic, *args, **kwargs)
        problems = config_problems(config)
        if problems:
            raise ValueError("rlhf_ext: this verl run cannot start:\n  " + "\n  ".join(problems))
        return result

    validate_config.rlhf_ext_patched = True
    return validate_config
