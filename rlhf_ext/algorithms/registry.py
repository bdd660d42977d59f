"""Registries of advantage estimators, policy losses and KL estimators.

Third-party packages add algorithms by declaring an entry point in the group
``rlhf_ext.algorithms`` whose value is a module; that module is imported on first registry
access, and its ``@register_*`` decorators do the rest::

    # in the third-party package's setup.py
    entry_points={"rlhf_ext.algorithms": ["my_algos = my_pkg.algos"]}
"""

from __future__ import annotations

from typing import Callable, Dict, List

from rlhf_ext.ground.registry import EntryPointGroup, Registry, UnknownNameError

from .loss_options import adapt_old_clip_names

ENTRY_POINT_GROUP = "rlhf_ext.algorithms"
ENTRY_POINTS = EntryPointGroup(ENTRY_POINT_GROUP)

ADVANTAGES = Registry("advantage estimator", ENTRY_POINTS)
POLICY_LOSSES = Registry("policy loss", ENTRY_POINTS)
KL_ESTIMATORS = Registry("KL estimator", ENTRY_POINTS)
# token-level estimators that need per-token inputs from the actor (.token_estimators): a host offers one only
# where it can pass those inputs, and refuses it by name elsewhere
TOKEN_ADVANTAGES = Registry("token-level advantage estimator", ENTRY_POINTS)


def load_entry_points() -> Dict[str, str]:
    """Import the ``rlhf_ext.algorithms`` entry point modules (once); return ``{name: error}`` of failures."""
    return ENTRY_POINTS.load()


def register_advantage(name: str, *, override: bool = False):
    """Register ``fn(scores: Tensor[P, N], **options) -> Tensor[P, N]`` under ``name``."""
    return ADVANTAGES.register(name, override=override)


def register_policy_loss(name: str, *, override: bool = False):
    """Register ``fn(log_probs, old_log_probs, advantages, mask, **options) -> (loss[B, T], metrics)``.

    A clip range is ``clip_ratio_low`` / ``clip_ratio_high``; a loss declaring the old names ``eps_low`` /
    ``eps_high`` is registered behind an adapter taking the new ones (DeprecationWarning,
    :func:`.loss_options.adapt_old_clip_names`). Returns ``fn`` itself."""
    register = POLICY_LOSSES.register(name, override=override)

    def decorator(fn: Callable) -> Callable:
        register(adapt_old_clip_names(fn, name, stacklevel=3))
        return fn

    return decorator


def register_kl_estimator(name: str, *, override: bool = False):
    """Register ``fn(log_probs, ref_log_probs) -> Tensor[B, T]`` under ``name``."""
    return KL_ESTIMATORS.register(name, override=override)


def register_token_advantage(name: str, *, override: bool = False):
    """Register ``fn(token_rewards[B, T], mask[B, T], groups, old_log_probs[B, T], sum_pi_squared[B, T], *,
    is_weights=None, **options) -> (advantages[B, T], returns[B, T])`` under ``name``
    (:mod:`.token_estimators`)."""
    return TOKEN_ADVANTAGES.register(name, override=override)


def get_token_advantage(name: str) -> Callable:
    return TOKEN_ADVANTAGES.get(name)


def available_token_advantages() -> List[str]:
    return TOKEN_ADVANTAGES.available()


def get_advantage(name: str) -> Callable:
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


def get_kl_estimator(name: str) -> Callable:
    return KL_ESTIMATORS.get(name)


def available_advantages() -> List[str]:
    return ADVANTAGES.available()


def available_policy_losses() -> List[str]:
    return POLICY_LOSSES.available()


def available_kl_estimators() -> List[str]:
    return KL_ESTIMATORS.available()


__all__ = [
    "ENTRY_POINT_GROUP",
    "UnknownNameError",
    "ADVANTAGES",
    "POLICY_LOSSES",
    "KL_ESTIMATORS",
    "TOKEN_ADVANTAGES",
    "register_token_advantage",
    "get_token_advantage",
    "available_token_advantages",
    "load_entry_points",
    "register_advantage",
    "register_policy_loss",
    "register_kl_estimator",
    "get_advantage",
    "get_policy_loss",
    "get_kl_estimator",
    "available_advantages",
    "available_policy_losses",
    "available_kl_estimators",
]
