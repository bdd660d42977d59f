"""rlhf_ext's token-level estimators on verl, fed with the inputs verl computes for its own.

:func:`rlhf_ext.algorithms.optimal_token_baseline` (arXiv 2602.07078) and its multi-turn form
:func:`rlhf_ext.algorithms.tir_optimal_token_baseline` (every estimator of
:func:`rlhf_ext.algorithms.available_token_advantages`) need, per response token, the old log-probs and
``sum_pi_squared`` (the sum over the vocabulary of pi^2). verl 0.9.1's actor computes the latter with
``actor_rollout_ref.actor.calculate_sum_pi_squared=True``, but ``ray_trainer.compute_advantage`` hands
both only to the estimators named ``optimal_token_baseline`` / ``tir_optimal_token_baseline``.

Seam: ``verl.trainer.ppo.ray_trainer.compute_advantage`` (patched when ``ray_trainer`` is imported,
so the modules that import the name later -- ``ppo.v1.utils``, the experimental trainers -- get
the patched function). For ``algorithm.adv_estimator=rlhf_ext_<name>`` of a token-level estimator it
passes ``old_log_probs``, ``sum_pi_squared`` and, when present, ``rollout_is_weights`` from the batch, as
verl does for its own names; every other estimator goes to verl's function untouched. Options:
``+algorithm.rlhf_ext.handle_zero_tail`` (verl's key) and ``eps``.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from .names import verl_name

SEAM_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")


def token_estimator_names() -> tuple:
    from rlhf_ext.algorithms import available_token_advantages

    return tuple(available_token_advantages())


def _options(config: Any, key: str) -> dict:
    from rlhf_ext.algorithms.token_estimators import OPTIONS

    from .advantages import as_plain
    from .names import OPTIONS_KEY

    raw = None if config is None else as_plain(getattr(config, "get", lambda k, d=None: None)(OPTIONS_KEY, None))
    options = dict(raw or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"advantage estimator {key!r} has no option {', '.join(map(repr, unknown))}; "
                         f"it takes: {', '.join(OPTIONS)}")
    return options


def make_verl_token_estimator(name: str):
    """verl-convention adapter of the registered token-level estimator ``name`` -> ``(advantages, returns)``."""
    key = verl_name(name)

    @torch.no_grad()
    def verl_token_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                             old_log_probs: Optional[torch.Tensor] = None,
                             sum_pi_squared: Optional[torch.Tensor] = None,
                             rollout_is_weights: Optional[torch.Tensor] = None, config: Optional[Any] = None,
                             **kwargs):
        from rlhf_ext.algorithms import get_token_advantage

        missing = [n for n, v in (("index (uid)", index), ("old_log_probs", old_log_probs),
                                  ("sum_pi_squared", sum_pi_squared)) if v is None]
        if missing:
            raise ValueError(f"advantage estimator {key!r} did not get {', '.join(missing)}: set "
                             "actor_rollout_ref.actor.calculate_sum_pi_squared=True (verl computes sum_pi_squared "
                             "only then)")
        adv, returns = get_token_advantage(name)(token_level_rewards, response_mask, index, old_log_probs,
                                                 sum_pi_squared, is_weights=rollout_is_weights,
                                                 **_options(config, key))
        return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)

    verl_token_estimator.rlhf_ext_name = name
    verl_token_estimator.__name__ = verl_token_estimator.__qualname__ = f"verl_{name}"
    return verl_token_estimator


_ADAPTERS: dict = {}


def verl_token_adapter(name: str):
    """The one adapter of ``name`` (registered in verl once, recognised by identity)."""
    if name not in _ADAPTERS:
        _ADAPTERS[name] = make_verl_token_estimator(name)
    return _ADAPTERS[name]


def make_compute_advantage(original):
    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        names = {verl_name(n): n for n in token_estimator_names()}
        name = names.get(str(adv_estimator))
        if name is None:
            return original(data, adv_estimator, *args, **kwargs)
        config = kwargs.get("config", args[4] if len(args) > 4 else None)  # gamma, lam, num_repeat, norm, config
        batch = data.batch
        advantages, returns = verl_token_adapter(name)(
            token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
            index=data.non_tensor_batch.get("uid"), old_log_probs=batch.get("old_log_probs", None),
            sum_pi_squared=batch.get("sum_pi_squared", None), rollout_is_weights=batch.get("rollout_is_weights", None),
            config=config)
        batch["advantages"] = advantages
        batch["returns"] = returns
        return data

    compute_advantage.rlhf_ext_patched = True
    return compute_advantage
