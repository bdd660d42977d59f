"""Zero-advantage updates counted in OpenRLHF's actor (attempted vs applied optimizer steps).

OpenRLHF runs every optimizer step of ``ActorPPOTrainer.ppo_train`` whatever the advantages are.
The wrapped ``training_step`` feeds each micro-batch's advantages to an
:class:`rlhf_ext.algorithms.UpdateCounter`; at each optimizer-step boundary (every
``accumulated_gradient`` micro-batches, or OpenRLHF's dynamic-batch boundaries) the verdict is
the maximum over data-parallel ranks, so all ranks count the same steps. The wrapped
``ppo_train`` adds, to the status of each global step (and so to the run's logged metrics):

* ``rlhf_ext/updates_attempted``: optimizer steps run on this rollout batch;
* ``rlhf_ext/updates_applied``: those with a non-zero advantage on some response token;
* ``rlhf_ext/updates_zero_advantage``: the difference (steps that moved the weights only through
  KL / entropy terms and optimizer momentum);
* ``rlhf_ext/updates_applied_total`` / ``rlhf_ext/updates_attempted_total``: since the actor started.
"""

from __future__ import annotations

import functools

import torch

from rlhf_ext.algorithms import UpdateCounter

from .config import setting, step_metrics

_ATTR = "_rlhf_ext_update_counter"
_TOTAL_ATTR = "_rlhf_ext_update_totals"


def counter(trainer) -> UpdateCounter:
    c = getattr(trainer, _ATTR, None)
    if c is None:
        c = UpdateCounter()
        setattr(trainer, _ATTR, c)
    return c


def _is_boundary(trainer, step: int) -> bool:
    if setting(trainer.args, "train.dynamic_batch_enable", False):
        return bool(trainer.replay_buffer.dynamic_optimizer_step[step])
    gas = max(int(getattr(trainer.strategy, "accumulated_gradient", 1) or 1), 1)
    return (step + 1) % gas == 0


def micro_batch_signal(advantages, action_mask) -> bool:
    """Whether a response token has a non-zero advantage: :func:`rlhf_ext.algorithms.has_signal`
    without its input checks (OpenRLHF's loss has just used these tensors), one synchronisation.
    A NaN advantage counts as signal (the guard reports it)."""
    with torch.no_grad():
        m = action_mask if action_mask.dtype == torch.bool else action_mask.bool()
        return bool(((advantages != 0) & m).any())


def record_micro_batch(trainer, experience, step: int) -> None:
    """Called after OpenRLHF's ``training_step`` ran on ``experience`` (micro-batch ``step`` of the epoch)."""
    if not step_metrics(trainer.args):
        return
    c = counter(trainer)
    c.add_signal(micro_batch_signal(experience.advantages, experience.action_mask))
    if _is_boundary(trainer, step):
        signal = float(c.window_signal)
        all_reduce = getattr(trainer.strategy, "all_reduce", None)
        if all_reduce is not None:
            signal = all_reduce(signal, op="max")
        c.end_update(bool(signal))


def make_ppo_train(original, module=None):
    @functools.wraps(original)
    def ppo_train(self, kl_ctl):
        if not step_metrics(self.args):
            return original(self, kl_ctl)
        c = counter(self)
        c.reset()
        status = original(self, kl_ctl)
        totals = getattr(self, _TOTAL_ATTR, [0, 0])
        totals = [totals[0] + c.attempted, totals[1] + c.applied]
        setattr(self, _TOTAL_ATTR, totals)
        if isinstance(status, dict):
            status.update(c.metrics())
            status["rlhf_ext/updates_attempted_total"] = float(totals[0])
            status["rlhf_ext/updates_applied_total"] = float(totals[1])
        return status

    return ppo_train
