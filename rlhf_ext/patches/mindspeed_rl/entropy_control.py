"""``rl_config.adaptive_entropy``: MindSpeed-RL's entropy bonus with Skywork-OR1's adaptive coefficient.

MindSpeed-RL 2.1.0's GRPO and DAPO actor losses subtract ``entropy_coeff x`` the token-mean entropy
(``actor/entropy``); the coefficient reaches the loss through ``Actor.get_loss_meta_func`` from the
training engine's ``entropy_coeff`` at every forward-backward, and MindSpeed-RL keeps it fixed
(``rl_config.entropy_coeff``). With ``adaptive_entropy`` the coefficient follows
:class:`rlhf_ext.algorithms.entropy_control.AdaptiveEntropyCoef` (Skywork-OR1, arXiv 2505.22312; TRL
1.16's ``use_adaptive_entropy``), the same controller the OpenRLHF and verl hosts use:

* seam ``workers.actor_hybrid_worker.ActorHybridWorkerBase.update`` (one call per global step on
  every actor rank): sets the engine's ``entropy_coeff`` to the controller's applied coefficient
  before the step and, after it, steps the controller with the step's entropy;
* seam ``models.actor.Actor.update_actor`` (one call per batch the worker takes from the transfer
  dock): adds up the ``actor/entropy`` values of the batch's micro-batches (MindSpeed-RL's own
  metric, a token mean per micro-batch).

The step's entropy is the mean of those micro-batch values over the step's batches and, through
one ``all_reduce`` over Megatron's data-parallel group, over the data-parallel ranks -- what
MindSpeed-RL reports as ``actor/entropy`` -- so every rank takes the same step. Only the last
pipeline stage computes a loss, so only it measures and only there the coefficient matters.
``rl_config.entropy_coeff`` is the initial coefficient (0 is fine: the rlhf_ext loss then still
computes the entropy, which MindSpeed-RL skips at 0). Logged per step through the transfer dock's
metrics: ``rlhf_ext/entropy_coef`` (applied this step) and ``rlhf_ext/entropy_coef_next``. The
controller is not in the checkpoint: a resumed run starts again from ``rl_config.entropy_coeff``.

``rl_config`` key: ``adaptive_entropy: true`` (TRL's defaults) or a mapping with TRL's names,
``{entropy_target: 0.2, entropy_coef_delta: 0.005, entropy_coef_min: 0, entropy_coef_max: 1}``
(``enabled: false`` switches it off).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, Mapping, Optional

KEY = "adaptive_entropy"
APPLIED_KEY = "rlhf_ext/entropy_coef"
NEXT_KEY = "rlhf_ext/entropy_coef_next"
ENTROPY_METRIC = "actor/entropy"
STATE_ATTR = "_rlhf_ext_entropy_controller"
SUM_ATTR = "_rlhf_ext_entropy_sum"  # [sum of micro-batch entropies, their count] for the step so far
OPTIONS = (("entropy_target", "target", 0.2), ("entropy_coef_delta", "delta", 0.005),
           ("entropy_coef_min", "coef_min", 0.0), ("entropy_coef_max", "coef_max", 1.0))


def check_adaptive_entropy(value, source: Mapping[str, Any]) -> Dict[str, Any]:
    """Validate ``rl_config.adaptive_entropy``; ``{}`` when absent or off, else
    ``{"adaptive_entropy": {the controller's fields}}`` (plain values: they pickle with the settings).
    Raises ``ValueError`` naming the key (:mod:`.config` turns it into its ``ConfigError``)."""
    from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef

    if value is None or value is False:
        return {}
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise ValueError(f"rl_config.{KEY} must be true, false or a mapping like {{entropy_target: 0.2}}, "
                          f"got {value!r}")
    value = dict(value)
    enabled = value.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"rl_config.{KEY}.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return {}
    names = [name for name, _, _ in OPTIONS]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"rl_config.{KEY} has no key {unknown[0]!r}; its keys: enabled, {', '.join(names)}")
    fields = {}
    for name, field, default in OPTIONS:
        given = value.get(name, default)
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            raise ValueError(f"rl_config.{KEY}.{name} must be a number, got {given!r}")
        fields[field] = float(given)
    coef = source.get("entropy_coeff", 0.0)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef):
        raise ValueError(f"rl_config.entropy_coeff (the initial coefficient of {KEY}) must be a finite number, "
                          f"got {coef!r}")
    try:
        AdaptiveEntropyCoef(coef=float(coef), **fields)
    except ValueError as exc:
        raise ValueError(f"rl_config.{KEY}: {exc} (the initial coefficient is rl_config.entropy_coeff)") from None
    return {KEY: {"coef": float(coef), **fields}}


def _spec(name) -> Optional[Dict[str, Any]]:
    # the settings ride on rl_config.kl_penalty, a config.ConfiguredName (a plain str: none)
    return dict(getattr(name, "settings", None) or {}).get(KEY)


def controller(worker, spec: Mapping[str, Any]):
    """The worker's controller, built on first use from the settings."""
    from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef

    state = worker.__dict__.get(STATE_ATTR)
    if state is None:
        state = worker.__dict__[STATE_ATTR] = AdaptiveEntropyCoef(**spec)
    return state


def data_parallel_sum(parallel_state, device, total: float, count: int):
    """``(total, count)`` summed over Megatron's data-parallel group (unchanged without torch.distributed)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or parallel_state is None:
        return total, count
    group = parallel_state.get_data_parallel_group()
    if dist.get_world_size(group) == 1:
        return total, count
    # float32: the collective backends on every target (HCCL, NCCL, gloo) reduce it
    vec = torch.tensor([total, float(count)], dtype=torch.float32, device=device)
    dist.all_reduce(vec, op=dist.ReduceOp.SUM, group=group)
    return float(vec[0]), int(round(float(vec[1])))


def _engine_device(engine):
    model = getattr(engine, "model", None)
    try:
        return next(model[0].parameters()).device
    except (TypeError, IndexError, StopIteration, AttributeError):
        return None


def _reports_metrics(parallel_state) -> bool:
    # the ranks MindSpeed-RL's own update() sends the actor metrics from
    if parallel_state is None:
        return True
    return bool(parallel_state.is_pipeline_last_stage(ignore_virtual=True)
                and parallel_state.get_tensor_model_parallel_rank() == 0
                and parallel_state.get_context_parallel_rank() == 0)


def _is_last_stage(parallel_state) -> bool:
    return parallel_state is None or bool(parallel_state.is_pipeline_last_stage(ignore_virtual=True))


def make_update_actor(original, module=None):
    """``Actor.update_actor``: add up the batch's ``actor/entropy`` micro-batch values for the worker."""

    @functools.wraps(original)
    def update_actor(self, data, kl_ctrl=None):
        metrics = original(self, data, kl_ctrl)
        acc = self.__dict__.get(SUM_ATTR)
        if acc is not None and isinstance(metrics, Mapping):
            values = metrics.get(ENTROPY_METRIC) or []
            if not isinstance(values, (list, tuple)):
                values = [values]
            acc[0] += sum(float(v) for v in values)
            acc[1] += len(values)
        return metrics

    return update_actor


def make_worker_update(original, module=None):
    """``ActorHybridWorkerBase.update``: apply the controller's coefficient, step it with the step's entropy."""
    import ray

    @functools.wraps(original)
    def update(self, kl_ctrl=None, skip_actor_log_prob=False):
        spec = _spec(getattr(self.rl_config, "kl_penalty", None))
        if not spec:
            return original(self, kl_ctrl, skip_actor_log_prob)
        state = controller(self, spec)
        engine = self.actor_hybrid.train_actor
        applied = state.applied()
        engine.entropy_coeff = applied
        engine.__dict__[SUM_ATTR] = [0.0, 0]
        try:
            result = original(self, kl_ctrl, skip_actor_log_prob)
        finally:
            total, count = engine.__dict__.pop(SUM_ATTR)
        parallel_state = getattr(self, "parallel_state", None)
        if _is_last_stage(parallel_state):
            total, count = data_parallel_sum(parallel_state, _engine_device(engine), total, count)
            if count:
                state.update(total / count)
        engine.entropy_coeff = state.applied()
        if _reports_metrics(parallel_state):
            for key, value in ((APPLIED_KEY, applied), (NEXT_KEY, state.applied())):
                ray.get(self.td.update_metrics.remote(key=key, value=value))
        return result

    return update


__all__ = ["KEY", "APPLIED_KEY", "NEXT_KEY", "check_adaptive_entropy", "controller", "data_parallel_sum",
           "make_update_actor", "make_worker_update"]
