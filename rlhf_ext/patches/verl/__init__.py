"""The ``rlhf_ext`` plugin for verl 0.9.x: what it registers, which seam it patches, and activation.

verl imports every entry point of the group ``verl.plugins`` at ``import verl``, in every process
that imports verl (driver, Ray workers), unless ``VERL_USE_EXTERNAL_PLUGINS=none`` (or a list of
other plugin names). rlhf_ext's entry point is :mod:`rlhf_ext.patches.verl.plugin`, which calls
:func:`activate`. Nothing needs patching for the algorithms: verl has registries.

Seams (each checked against the parameter list it was written for, see :func:`check_seams`):

==========================================  ===========================================  ==================
where (``verl.trainer.ppo.core_algos``)     what                                         runs in
==========================================  ===========================================  ==================
``register_adv_est`` (registry)             every rlhf_ext estimator as ``rlhf_ext_<n>``  driver (advantages)
                                            (:mod:`.advantages`)
``register_policy_loss`` (registry)         every rlhf_ext loss as ``rlhf_ext_<n>``, via  actor workers
                                            verl's ``agg_loss`` (:mod:`.policy_loss`)
``kl_penalty_forward`` (patched, only with  ``RLHF_EXT_VERL_KL_CLIP``: KL value clamp     driver, actor workers
``RLHF_EXT_VERL_KL_CLIP`` set)              (:mod:`.kl`)
``verl.utils.config.validate_config``       start-up checks of the rlhf_ext settings     driver
(patched)                                   (:mod:`.startup`)
``ray_trainer.compute_advantage`` (patched) ``rlhf_ext_optimal_token_baseline`` and       driver (advantages)
                                            ``rlhf_ext_tir_optimal_token_baseline`` get
                                            the inputs verl gives its own
                                            (:mod:`.token_baseline`)
``rollout_corr_helper.compute_rollout_``    rlhf_ext's rollout-correction modes under     driver
``correction_and_add_to_batch`` (patched;   verl's ``algorithm.rollout_correction`` keys
verl's own values pass through untouched)   (:mod:`.rollout_correction`)
``ray_trainer.RayPPOTrainer._update_actor``  with ``RLHF_EXT_VERL_ADAPTIVE_ENTROPY``: the       driver
(patched; untouched when the variable is    adaptive entropy coefficient, stepped per
unset)                                      step, logged (:mod:`.entropy_control`)
``engine_workers.ppo_loss`` (patched)       the actor loss applies that coefficient      actor workers
==========================================  ===========================================  ==================

Registration happens when ``core_algos`` is imported (a post-import hook), so ``import verl`` in a
process that never computes advantages or losses stays as cheap as before. Names taken by verl
itself are never replaced. Estimators and losses are whatever :mod:`rlhf_ext.algorithms` has at
that moment -- built-ins, ``@register_advantage`` in imported modules and the
``rlhf_ext.algorithms`` entry point group -- so estimators and losses added to rlhf_ext later
appear in verl without a change here; call :func:`register_all` again for ones registered
after ``core_algos`` was imported.

Errors: verl logs a failing plugin only at debug level, so this module reports its own problems
with ``logging.error`` (``rlhf_ext: ...``) and ``python -m rlhf_ext.patches.verl`` checks the
installed verl and prints what is registered, exiting non-zero on a problem.
"""

from __future__ import annotations

import logging
import threading

from ...seams import import_hooks
from ...seams.host import HostRelease
from ...seams.table import Requirement, requirement_problems
from .names import (
    ALLOW_UNSUPPORTED_ENV,
    KL_CLIP_ENV,
    OPTIONS_KEY,
    PREFIX,
    SUPPORTED_DESCRIPTION,
    SUPPORTED_SERIES,
    WHITENED_ESTIMATORS,
    kl_clip_setting,
    parse_kl_clip,
    verl_name,
)

logger = logging.getLogger("rlhf_ext.verl")

CORE_ALGOS = "verl.trainer.ppo.core_algos"
VERL_CONFIG = "verl.utils.config"
RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
ROLLOUT_CORR_HELPER = "verl.trainer.ppo.rollout_corr_helper"
ENGINE_WORKERS = "verl.workers.engine_workers"

# name in core_algos -> the parameter list this glue was written against (None: must exist).
ADVANTAGE_SEAMS = {
    "register_adv_est": ("name_or_enum",),
    "get_adv_estimator_fn": ("name_or_enum",),
    "ADV_ESTIMATOR_REGISTRY": None,
}
POLICY_LOSS_SEAMS = {
    "register_policy_loss": ("name",),
    "get_policy_loss_fn": ("name",),
    "POLICY_LOSS_REGISTRY": None,
    "agg_loss": ("loss_mat", "loss_mask", "loss_agg_mode", "dp_size", "batch_num_tokens", "global_batch_size",
                 "loss_scale_factor"),
}
KL_SEAMS = {
    "kl_penalty_forward": ("logprob", "ref_logprob", "kl_penalty"),
    "kl_penalty": ("logprob", "ref_logprob", "kl_penalty"),
}


class VerlCompatibilityError(RuntimeError):
    """The installed verl does not have what the rlhf_ext glue was written against."""


_lock = threading.RLock()
_registered = {"advantages": [], "policy_losses": [], "skipped": []}
_kl_original = []  # [(module, original)] when the KL seam is patched


RELEASE = HostRelease("verl", SUPPORTED_SERIES, SUPPORTED_DESCRIPTION, ALLOW_UNSUPPORTED_ENV, VerlCompatibilityError,
                      distribution="verl", install_hint="install verl==0.9.1",
                      still_checked="the seam checks still run")
# verl_version(): the installed version, from its distribution metadata (read once per process).
# check_version(): raise unless verl is a supported release (RLHF_EXT_ALLOW_UNSUPPORTED_VERL=1
# overrides; the seam checks still run then).
verl_version, check_version = RELEASE.version, RELEASE.check


def _problems(module, seams) -> list:
    return requirement_problems(module, [Requirement(name, params) for name, params in seams.items()])


def check_seams(module, *, kl: bool = False) -> list:
    """Every mismatch between ``core_algos`` and what this glue expects (empty: all fit)."""
    problems = _problems(module, ADVANTAGE_SEAMS) + _problems(module, POLICY_LOSS_SEAMS)
    if kl:
        problems += _problems(module, KL_SEAMS)
        penalty = getattr(module, "kl_penalty", None)
        # The patch reaches kl_penalty's callers only if kl_penalty looks the name up at call time.
        if penalty is not None and "kl_penalty_forward" not in getattr(getattr(penalty, "__code__", None),
                                                                       "co_names", ()):
            problems.append(f"{module.__name__}.kl_penalty no longer calls kl_penalty_forward by name")
    return problems


def register_all(module=None) -> dict:
    """Register every rlhf_ext estimator and loss in verl's registries (idempotent); return what was done.

    ``module``: ``verl.trainer.ppo.core_algos`` (imported when omitted). A name verl already uses
    for something else is skipped with a warning, never replaced.
    """
    import importlib

    from rlhf_ext.algorithms import available_advantages, available_policy_losses, get_advantage, get_policy_loss

    from .advantages import make_verl_estimator
    from .policy_loss import make_verl_policy_loss

    if module is None:
        module = importlib.import_module(CORE_ALGOS)
    check_version()
    problems = check_seams(module)
    if problems:
        raise VerlCompatibilityError(
            f"rlhf_ext cannot register in verl {verl_version()}; nothing was registered:\n  " + "\n  ".join(problems))
    with _lock:
        for name in available_advantages():
            key = verl_name(name)
            current = module.ADV_ESTIMATOR_REGISTRY.get(key)
            if current is not None:
                if getattr(current, "rlhf_ext_name", None) != name:
                    _skip(f"advantage estimator {key!r} is already registered in verl by {current!r}")
                continue
            module.register_adv_est(key)(make_verl_estimator(name, get_advantage(name)))
            _registered["advantages"].append(key)
        for name in available_policy_losses():
            key = verl_name(name)
            current = module.POLICY_LOSS_REGISTRY.get(key)
            if current is not None:
                if getattr(current, "rlhf_ext_name", None) != name:
                    _skip(f"policy loss {key!r} is already registered in verl by {current!r}")
                continue
            module.register_policy_loss(key)(make_verl_policy_loss(name, get_policy_loss(name), module.agg_loss))
            _registered["policy_losses"].append(key)
        from .token_baseline import token_estimator_names, verl_token_adapter

        for name in token_estimator_names():  # fed by the compute_advantage hook (.token_baseline)
            key, adapter = verl_name(name), verl_token_adapter(name)
            current = module.ADV_ESTIMATOR_REGISTRY.get(key)
            if current is None:
                module.register_adv_est(key)(adapter)
                _registered["advantages"].append(key)
            elif current is not adapter:
                _skip(f"advantage estimator {key!r} is already registered in verl by {current!r}")
        return registered()


def _skip(message: str) -> None:
    if message not in _registered["skipped"]:
        _registered["skipped"].append(message)
        logger.warning("rlhf_ext: %s; rlhf_ext's version is not available under that name", message)


def registered() -> dict:
    """``{"advantages": [...], "policy_losses": [...], "skipped": [...], "kl_clip": ...}`` in this process."""
    with _lock:
        out = {k: list(v) for k, v in _registered.items()}
        out["kl_clip"] = getattr(_kl_original[0][0].kl_penalty_forward, "rlhf_ext_kl_clip", None) \
            if _kl_original else "verl default"
        return out


def patch_kl(module, setting: str) -> None:
    """Patch ``core_algos.kl_penalty_forward`` with the clamp ``setting`` (``RLHF_EXT_VERL_KL_CLIP`` syntax)."""
    from .kl import make_kl_penalty_forward

    bounds = parse_kl_clip(setting)
    problems = _problems(module, KL_SEAMS) + [p for p in check_seams(module, kl=True) if "by name" in p]
    if problems:
        raise VerlCompatibilityError(
            f"{KL_CLIP_ENV} is set, but rlhf_ext cannot patch verl {verl_version()}'s KL penalty; "
            f"unset it to use verl's fixed clamp:\n  " + "\n  ".join(problems))
    with _lock:
        if _kl_original:
            module.kl_penalty_forward = _kl_original[0][1]
            _kl_original.clear()
        original = module.kl_penalty_forward
        module.kl_penalty_forward = make_kl_penalty_forward(original, bounds)
        _kl_original.append((module, original))


def unpatch_kl() -> None:
    with _lock:
        for module, original in _kl_original:
            module.kl_penalty_forward = original
        _kl_original.clear()


def _on_core_algos(module) -> None:
    """Post-import hook: register, and patch KL when asked; report problems loudly (verl would hide them)."""
    try:
        register_all(module)
    except Exception as exc:
        logger.error("rlhf_ext: verl plugin registered nothing: %s: %s", type(exc).__name__, exc)
    from .startup import env_problems

    problems = env_problems()
    if problems:
        # as with a bad KL clamp: a setting that cannot be honoured stops the process
        logger.error("rlhf_ext: %s", "; ".join(problems))
        raise VerlCompatibilityError("rlhf_ext: " + "; ".join(problems))
    setting = kl_clip_setting()
    if setting is not None:
        try:
            patch_kl(module, setting)
        except Exception as exc:
            logger.error("rlhf_ext: %s", exc)
            # Asking for a KL clamp and silently training without it is worse than stopping.
            raise


_active = []


def is_active() -> bool:
    """Whether :func:`activate` ran in this process (verl loaded the ``verl.plugins`` entry point)."""
    return bool(_active)


def activate() -> None:
    """Called when verl loads the ``verl.plugins`` entry point (at ``import verl``); idempotent."""
    with _lock:
        if _active:
            return
        _active.append(True)
    import_hooks.when_imported(CORE_ALGOS, _on_core_algos)
    import_hooks.when_imported(VERL_CONFIG, _on_verl_config)
    import_hooks.when_imported(RAY_TRAINER, _on_ray_trainer)
    import_hooks.when_imported(ROLLOUT_CORR_HELPER, _on_rollout_corr_helper)
    import_hooks.when_imported(ENGINE_WORKERS, _on_engine_workers)


def _on_ray_trainer(module) -> None:
    """Post-import hook: route the token-level estimators' inputs (:mod:`.token_baseline`)."""
    from .token_baseline import SEAM_PARAMS, make_compute_advantage

    problems = requirement_problems(module, [Requirement("compute_advantage", SEAM_PARAMS)])
    if problems:
        logger.error("rlhf_ext: the token-level estimators (rlhf_ext_optimal_token_baseline, ...) are unavailable in "
                     "verl %s: %s", verl_version(),
                     "; ".join(problems))
        return
    if not getattr(module.compute_advantage, "rlhf_ext_patched", False):
        _config_original.append((module, module.compute_advantage))
        module.compute_advantage = make_compute_advantage(module.compute_advantage)
    from .entropy_control import UPDATE_SEAM, make_update_actor

    problems = requirement_problems(module, [Requirement("RayPPOTrainer._update_actor", UPDATE_SEAM)])
    if problems:
        logger.error("rlhf_ext: the adaptive entropy coefficient is unavailable in verl %s: %s", verl_version(),
                     "; ".join(problems))
        return
    trainer = module.RayPPOTrainer
    if not getattr(trainer._update_actor, "rlhf_ext_patched", False):
        _config_original.append((trainer, trainer._update_actor))
        trainer._update_actor = make_update_actor(trainer._update_actor)


def _on_engine_workers(module) -> None:
    """Post-import hook: the actor loss takes the adaptive entropy coefficient (:mod:`.entropy_control`)."""
    from .entropy_control import LOSS_SEAM, make_ppo_loss

    problems = requirement_problems(module, [Requirement("ppo_loss", LOSS_SEAM)])
    if problems:
        logger.error("rlhf_ext: the adaptive entropy coefficient is unavailable in verl %s: %s", verl_version(),
                     "; ".join(problems))
        return
    if not getattr(module.ppo_loss, "rlhf_ext_patched", False):
        _config_original.append((module, module.ppo_loss))
        module.ppo_loss = make_ppo_loss(module.ppo_loss)


def _on_verl_config(module) -> None:
    """Post-import hook: wrap ``validate_config`` with rlhf_ext's start-up checks (:mod:`.startup`)."""
    from .startup import VALIDATE_SEAM, make_validate_config

    problems = requirement_problems(module, [Requirement("validate_config", VALIDATE_SEAM)])
    if problems:
        logger.error("rlhf_ext: cannot add its start-up checks to verl %s: %s", verl_version(), "; ".join(problems))
        return
    if not getattr(module.validate_config, "rlhf_ext_patched", False):
        _config_original.append((module, module.validate_config))
        module.validate_config = make_validate_config(module.validate_config)


_config_original = []


def _on_rollout_corr_helper(module) -> None:
    """Post-import hook: rlhf_ext's rollout-correction modes under verl's keys (:mod:`.rollout_correction`)."""
    from .rollout_correction import patch

    try:
        patch(module)
    except Exception as exc:
        logger.error("rlhf_ext: %s", exc)


def deactivate() -> None:
    """Remove rlhf_ext's names from verl's registries and undo the KL patch (tests only)."""
    import sys

    import_hooks.clear(CORE_ALGOS)
    import_hooks.clear(VERL_CONFIG)
    import_hooks.clear(RAY_TRAINER)
    import_hooks.clear(ROLLOUT_CORR_HELPER)
    import_hooks.clear(ENGINE_WORKERS)
    _active.clear()
    helper = sys.modules.get(ROLLOUT_CORR_HELPER)
    if helper is not None:
        from .rollout_correction import unpatch

        unpatch(helper)
    unpatch_kl()
    for patched_module, original in _config_original:
        setattr(patched_module, original.__name__, original)
    _config_original.clear()
    module = sys.modules.get(CORE_ALGOS)
    with _lock:
        if module is not None:
            for key in _registered["advantages"]:
                module.ADV_ESTIMATOR_REGISTRY.pop(key, None)
            for key in _registered["policy_losses"]:
                module.POLICY_LOSS_REGISTRY.pop(key, None)
        for value in _registered.values():
            value.clear()


__all__ = [
    "CORE_ALGOS",
    "KL_CLIP_ENV",
    "OPTIONS_KEY",
    "PREFIX",
    "SUPPORTED_DESCRIPTION",
    "VerlCompatibilityError",
    "WHITENED_ESTIMATORS",
    "activate",
    "is_active",
    "check_seams",
    "check_version",
    "deactivate",
    "patch_kl",
    "register_all",
    "registered",
    "unpatch_kl",
    "verl_name",
    "verl_version",
]
