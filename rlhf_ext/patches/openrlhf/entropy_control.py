"""``--rlhf_ext.adaptive_entropy``: OpenRLHF's entropy bonus with Skywork-OR1's adaptive coefficient.

OpenRLHF 0.11.2's ``ActorPPOTrainer.training_step`` computes the token entropy when
``--actor.entropy_coef`` is set and subtracts ``entropy_coef * entropy_loss`` (the entropy
aggregated like the policy loss) when it is not 0; it reads ``args.actor.entropy_coef`` on every
micro-batch. The seam ``ActorPPOTrainer.ppo_train`` (one call per global step) sets that value to the
controller's applied coefficient (:class:`rlhf_ext.algorithms.entropy_control.AdaptiveEntropyCoef`)
before the step and, after it, steps the controller with the step's ``entropy_loss`` -- the
token-weighted mean over the step's micro-batches and data-parallel ranks that OpenRLHF's status
holds, so every rank takes the same step. ``--actor.entropy_coef`` is the initial coefficient.

The controller steps once per global step (Skywork-OR1's ``k``); TRL steps once per optimizer step,
the same thing when a rollout batch is one optimizer step (OpenRLHF's default). Logged per step:
``rlhf_ext/entropy_coef`` (applied this step) and ``rlhf_ext/entropy_coef_next``.

The controller's state (coefficient, last entropy) is in the actor's DeepSpeed checkpoint: the seam
``DeepspeedStrategy.save_ckpt`` adds it to the ``client_state`` of a save into ``<ckpt.path>/_actor``
(under :data:`CHECKPOINT_KEY`), and ``DeepspeedStrategy.load_ckpt`` hands it to the controller the
resumed run builds, so ``--ckpt.load_enable`` continues with the coefficient where it stopped. The
controller lives on the process's strategy (one per model process in OpenRLHF), which both seams see.
"""

from __future__ import annotations

import functools
from typing import Optional

from .config import setting

FLAG = "--rlhf_ext.adaptive_entropy"
APPLIED_KEY = "rlhf_ext/entropy_coef"
NEXT_KEY = "rlhf_ext/entropy_coef_next"
STATE_ATTR = "_rlhf_ext_entropy_controller"
LOADED_ATTR = "_rlhf_ext_entropy_controller_loaded"
CHECKPOINT_KEY = "rlhf_ext_entropy_controller"
ACTOR_CKPT_DIR = "_actor"  # PolicyModelActor saves into <ckpt.path>/_actor
OPTIONS = (("entropy_target", 0.2, "target entropy (TRL's entropy_target)"),
           ("entropy_coef_delta", 0.005, "step of the coefficient per global step (TRL's entropy_coef_delta)"),
           ("entropy_coef_min", 0.0, "lower bound of the coefficient"),
           ("entropy_coef_max", 1.0, "upper bound of the coefficient"))


def add_arguments(group) -> None:
    group.add_argument(
        FLAG, action="store_true", default=False,
        help="adaptive entropy bonus (Skywork-OR1, arXiv 2505.22312; TRL's use_adaptive_entropy): the coefficient "
        "(initially --actor.entropy_coef) steps toward the target entropy each step and applies only at or below it",
    )  # fmt: skip
    for name, default, text in OPTIONS:
        group.add_argument(f"--rlhf_ext.{name}", type=float, default=None, metavar="X",
                           help=f"{FLAG}: {text} (default {default})")


def _controller(get):
    from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef

    kwargs = {name: (default if get(f"rlhf_ext.{name}") is None else float(get(f"rlhf_ext.{name}")))
              for name, default, _ in OPTIONS}
    return AdaptiveEntropyCoef(coef=float(get("actor.entropy_coef")), target=kwargs["entropy_target"],
                               delta=kwargs["entropy_coef_delta"], coef_min=kwargs["entropy_coef_min"],
                               coef_max=kwargs["entropy_coef_max"])


def finalize(namespace) -> None:
    """Validate (``ValueError`` naming the flag)."""
    def get(dotted):
        return getattr(namespace, dotted, None)

    if not get("rlhf_ext.adaptive_entropy"):
        given = [f"--rlhf_ext.{n}" for n, _, _ in OPTIONS if get(f"rlhf_ext.{n}") is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set the adaptive entropy bonus: add {FLAG}")
        return
    if get("actor.entropy_coef") is None:
        raise ValueError(f"{FLAG} needs --actor.entropy_coef, the initial coefficient (0 is fine): OpenRLHF computes "
                         "the token entropy only when it is set")
    try:
        _controller(get)
    except ValueError as exc:
        raise ValueError(f"{FLAG}: {exc}") from None


def controller(trainer):
    """The trainer's controller (built on first use from its ``args``, then from a resumed checkpoint's
    state when there is one), or None when the flag is off."""
    args = trainer.args
    if not setting(args, "rlhf_ext.adaptive_entropy", False):
        return None
    holder = trainer.strategy.__dict__
    state = holder.get(STATE_ATTR)
    if state is None:
        state = _controller(lambda dotted: setting(args, dotted))
        loaded = holder.pop(LOADED_ATTR, None)
        if loaded is not None:
            state.load_state_dict(loaded)
        holder[STATE_ATTR] = state
    return state


def _is_actor_checkpoint(save_dir) -> bool:
    import os

    return os.path.basename(os.path.normpath(str(save_dir))) == ACTOR_CKPT_DIR


def make_save_ckpt(original, module=None):
    """``DeepspeedStrategy.save_ckpt``: the controller's state joins the actor checkpoint's ``client_state``."""

    @functools.wraps(original)
    def save_ckpt(self, model, save_dir, tag=None, max_num=3, max_mem=1000, client_state=None, save_latest=True,
                  metric_value=None, metric_key=None):
        state = self.__dict__.get(STATE_ATTR)
        if state is not None and _is_actor_checkpoint(save_dir):
            client_state = {**(client_state or {}), CHECKPOINT_KEY: state.state_dict()}
        return original(self, model, save_dir, tag, max_num, max_mem, client_state, save_latest,
                         metric_value, metric_key)

    return save_ckpt


def make_load_ckpt(original, module=None):
    """``DeepspeedStrategy.load_ckpt``: keep a saved controller state for the controller the run builds."""

    @functools.wraps(original)
    def load_ckpt(self, model, load_dir, *args, **kwargs):
        load_path, states = original(self, model, load_dir, *args, **kwargs)
        saved = states.get(CHECKPOINT_KEY) if isinstance(states, dict) else None
        if saved is not None and _is_actor_checkpoint(load_dir):
            if STATE_ATTR in self.__dict__:
                self.__dict__[STATE_ATTR].load_state_dict(saved)
            else:
                self.__dict__[LOADED_ATTR] = saved
        return load_path, states

    return load_ckpt


def make_ppo_train(original, module=None):
    """``ActorPPOTrainer.ppo_train``: apply the controller's coefficient, step it with the step's entropy."""

    @functools.wraps(original)
    def ppo_train(self, kl_ctl):
        state = controller(self)
        if state is None:
            return original(self, kl_ctl)
        applied = state.applied()
        self.args.actor.entropy_coef = applied
        status = original(self, kl_ctl)
        entropy: Optional[float] = status.get("entropy_loss") if isinstance(status, dict) else None
        if entropy is not None:
            state.update(float(entropy))
        if isinstance(status, dict):
            status[APPLIED_KEY] = applied
            status[NEXT_KEY] = state.applied()
        return status

    return ppo_train
