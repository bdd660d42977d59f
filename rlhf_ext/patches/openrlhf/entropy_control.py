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
``rlhf_ext/entropy_coef`` (applied this step) and ``rlhf_ext/entropy_coef_next``. The controller's
state is not in the checkpoint: a resumed run starts again from ``--actor.entropy_coef``.
"""

from __future__ import annotations

import functools
from typing import Optional

from .config import setting

FLAG = "--rlhf_ext.adaptive_entropy"
APPLIED_KEY = "rlhf_ext/entropy_coef"
NEXT_KEY = "rlhf_ext/entropy_coef_next"
STATE_ATTR = "_rlhf_ext_entropy_controller"
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
    """The trainer's controller (built on first use from its ``args``), or None when the flag is off."""
    args = trainer.args
    if not setting(args, "rlhf_ext.adaptive_entropy", False):
        return None
    state = trainer.__dict__.get(STATE_ATTR)
    if state is None:
        state = _controller(lambda dotted: setting(args, dotted))
        trainer.__dict__[STATE_ATTR] = state
    return state


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
