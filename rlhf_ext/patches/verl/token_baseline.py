"""rlhf_ext's optimal token baseline on verl, fed with the inputs verl computes for its own.

:func:`rlhf_ext.algorithms.optimal_token_baseline` (arXiv 2602.07078) needs, per response token,
the old log-probs and ``sum_pi_squared`` (the sum over the vocabulary of pi^2). verl 0.9.1's actor
computes the latter with ``actor_rollout_ref.actor.calculate_sum_pi_squared=True``, but
``ray_trainer.compute_advantage`` hands both only to the estimator named ``optimal_token_baseline``.

Seam: ``verl.trainer.ppo.ray_trainer.compute_advantage`` (patched when ``ray_trainer`` is imported,
so the modules that import the name later -- ``ppo.v1.utils``, the experimental trainers -- get
the patched function). For ``algorithm.adv_estimator=rlhf_ext_optimal_token_baseline`` it passes
``old_log_probs``, ``sum_pi_squared`` and, when present, ``rollout_is_weights`` from the batch, as
verl does for its own name; every other estimator goes to verl's function untouched. Options:
``+algorithm.rlhf_ext.handle_zero_tail`` (verl's key) and ``eps``.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from .names import verl_name

NAME = "optimal_token_baseline"
VERL_NAME = verl_name(NAME)
SEAM_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")


def _options(config: Any) -> dict:
    from .advantages import as_plain
    from .names import OPTIONS_KEY

    raw = None if config is None else as_plain(getattr(config, "get", lambda k, d=None: None)(OPTIONS_KEY, None))
    options = dict(raw or {})
    unknown = sorted(set(options) - {"handle_zero_tail", "eps"})
    if unknown:
        raise ValueError(f"advantage estimator {VERL_NAME!r} has no option {', '.join(map(repr, unknown))}; "
                         "it takes: handle_zero_tail, eps")
    return options


@torch.no_grad()
def verl_token_baseline(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                        old_log_probs: Optional[torch.Tensor] = None, sum_pi_squared: Optional[torch.Tensor] = None,
                        rollout_is_weights: Optional[torch.Tensor] = None, config: Optional[Any] = None, **kwargs):
    """verl-convention adapter of :func:`rlhf_ext.algorithms.optimal_token_baseline` -> ``(advantages, returns)``."""
    from rlhf_ext.algorithms import optimal_token_baseline

    missing = [n for n, v in (("index (uid)", index), ("old_log_probs", old_log_probs),
                              ("sum_pi_squared", sum_pi_squared)) if v is None]
    if missing:
        raise ValueError(f"advantage estimator {VERL_NAME!r} did not get {', '.join(missing)}: set "
                         "actor_rollout_ref.actor.calculate_sum_pi_squared=True (verl computes sum_pi_squared only "
                         "then)")
    adv, returns = optimal_token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                                          is_weights=rollout_is_weights, **_options(config))
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


verl_token_baseline.rlhf_ext_name = NAME


def make_compute_advantage(original):
    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        if str(adv_estimator) != VERL_NAME:
            return original(data, adv_estimator, *args, **kwargs)
        config = kwargs.get("config", args[4] if len(args) > 4 else None)  # gamma, lam, num_repeat, norm, config
        batch = data.batch
        advantages, returns = verl_token_baseline(
            token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
            index=data.non_tensor_batch.get("uid"), old_log_probs=batch.get("old_log_probs", None),
            sum_pi_squared=batch.get("sum_pi_squared", None), rollout_is_weights=batch.get("rollout_is_weights", None),
            config=config)
        batch["advantages"] = advantages
        batch["returns"] = returns
        return data

    compute_advantage.rlhf_ext_patched = True
    return compute_advantage
