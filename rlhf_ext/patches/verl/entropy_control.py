"""``RLHF_EXT_VERL_ADAPTIVE_ENTROPY``: verl's entropy bonus with Skywork-OR1's adaptive coefficient.

verl 0.9.1's actor loss (``verl.workers.utils.losses.ppo_loss``) subtracts
``config.entropy_coeff * entropy_loss`` (the token entropy aggregated like the policy loss) and
logs ``actor/entropy_loss``; the trainer asks the workers for the entropy when
``actor.calculate_entropy`` is true or ``actor.entropy_coeff`` is not 0. The controller
(:class:`rlhf_ext.algorithms.entropy_control.AdaptiveEntropyCoef`, its math and citation there)
lives on the driver, so every worker applies the same coefficient:

* seam ``verl.trainer.ppo.ray_trainer.RayPPOTrainer._update_actor(self, batch)`` (one call per
  training step, driver): puts the controller's applied coefficient in ``batch.meta_info`` (it
  reaches every micro-batch as non-tensor data), runs the update, then steps the controller with
  the step's ``actor/entropy_loss`` (the mean over the step's mini-batches, the value verl logs)
  and adds ``rlhf_ext/entropy_coef`` (applied this step) and ``rlhf_ext/entropy_coef_next`` to the
  step's metrics;
* seam ``verl.workers.engine_workers.ppo_loss`` (the name ``init_model`` binds into the actor's
  loss function, workers): the loss runs with ``entropy_coeff`` replaced by the coefficient the
  micro-batch carries (verl's config is frozen, so a copy with that field changed).

Setting (travels like ``RLHF_EXT_VERL_KL_CLIP``): ``1`` for TRL's defaults, or
``target=0.2,delta=0.005,min=0,max=1`` (any subset). ``actor.entropy_coeff`` is the initial
coefficient. The controller's state is not in verl's checkpoint: a resumed run starts again from
``actor.entropy_coeff``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Dict, List, Optional

ENV = "RLHF_EXT_VERL_ADAPTIVE_ENTROPY"
META_KEY = "rlhf_ext_entropy_coeff"
APPLIED_KEY = "rlhf_ext/entropy_coef"
NEXT_KEY = "rlhf_ext/entropy_coef_next"
ENTROPY_METRIC = "actor/entropy_loss"
STATE_ATTR = "_rlhf_ext_entropy_controller"
UPDATE_SEAM = ("self", "batch")
LOSS_SEAM = ("config", "model_output", "data", "dp_group")
# option in the variable -> AdaptiveEntropyCoef field
OPTIONS = {"target": "target", "delta": "delta", "min": "coef_min", "max": "coef_max"}


def setting() -> Optional[Dict[str, float]]:
    """The variable as controller keyword arguments (``{}``: all defaults), None when unset; ``ValueError`` when bad."""
    text = os.environ.get(ENV, "").strip()
    if not text or text.lower() in ("0", "false", "no", "off"):
        return None
    if text.lower() in ("1", "true", "yes", "on"):
        return {}
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in OPTIONS:
            raise ValueError(f"{ENV}: expected 1 or key=value pairs with keys {', '.join(OPTIONS)}, got {part!r}")
        try:
            out[OPTIONS[key]] = float(value)
        except ValueError:
            raise ValueError(f"{ENV}: {key} must be a number, got {value.strip()!r}") from None
    return out


def build_controller(initial_coef: float, options: Dict[str, float]):
    from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef

    try:
        return AdaptiveEntropyCoef(coef=float(initial_coef), **options)
    except ValueError as exc:
        raise ValueError(f"{ENV}: {exc} (the initial coefficient is actor_rollout_ref.actor.entropy_coeff)") from None


def env_problems() -> List[str]:
    try:
        setting()
    except ValueError as exc:
        return [str(exc)]
    return []


def config_problems(config: Any, get) -> List[str]:
    """What a run with the variable set cannot do (``get(node, dotted)`` reads verl's config)."""
    try:
        options = setting()
    except ValueError:
        return []  # reported by env_problems
    if options is None:
        return []
    actor = get(config, "actor_rollout_ref.actor")
    coef = get(actor, "entropy_coeff", 0.0)
    problems = []
    try:
        build_controller(coef, options)
    except ValueError as exc:
        problems.append(str(exc))
    if float(coef) == 0.0 and not get(actor, "calculate_entropy", False):
        problems.append(f"{ENV} needs the token entropy of each update, which verl's actor computes only with "
                        "actor_rollout_ref.actor.entropy_coeff != 0 or actor_rollout_ref.actor.calculate_entropy=True")
    if get(config, "distillation.enabled", False):
        problems.append(f"{ENV} is set, but verl's distillation loss calls its own ppo_loss, which the adaptive "
                        "coefficient does not reach; unset it or turn distillation off")
    return problems


def make_ppo_loss(original):
    """``engine_workers.ppo_loss``: run with the entropy coefficient the micro-batch carries, if any."""

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        from verl.utils import tensordict_utils as tu

        coef = tu.get_non_tensor_data(data=data, key=META_KEY, default=None)
        if coef is not None and float(coef) != config.entropy_coeff:
            config = dataclasses.replace(config, entropy_coeff=float(coef))
        return original(config, model_output, data, dp_group)

    ppo_loss.rlhf_ext_patched = True
    return ppo_loss


def _step_entropy(metrics: Dict[str, Any]) -> float:
    value = metrics.get(ENTROPY_METRIC)
    if value is None:
        raise RuntimeError(f"{ENV}: the actor update logged no {ENTROPY_METRIC}; verl computes the entropy only with "
                           "actor.entropy_coeff != 0 or actor.calculate_entropy=True")
    values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return math.fsum(values) / len(values)


def make_update_actor(original):
    """``RayPPOTrainer._update_actor``: apply the driver's coefficient this step, then step it."""

    @functools.wraps(original)
    def _update_actor(self, batch):
        options = setting()
        if options is None:
            return original(self, batch)
        state = self.__dict__.get(STATE_ATTR)
        if state is None:
            state = build_controller(self.config.actor_rollout_ref.actor.entropy_coeff, options)
            self.__dict__[STATE_ATTR] = state
        applied = state.applied()
        batch.meta_info[META_KEY] = applied
        try:
            output = original(self, batch)
        finally:
            batch.meta_info.pop(META_KEY, None)
        metrics = output.meta_info["metrics"]
        state.update(_step_entropy(metrics))
        metrics[APPLIED_KEY] = applied
        metrics[NEXT_KEY] = state.applied()
        return output

    _update_actor.rlhf_ext_patched = True
    return _update_actor


__all__ = ["ENV", "build_controller", "config_problems", "env_problems", "make_ppo_loss", "make_update_actor",
           "setting"]
