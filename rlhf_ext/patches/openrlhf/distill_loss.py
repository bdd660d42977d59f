"""The distillation term in OpenRLHF's actor loss (``ActorPPOTrainer.training_step``, PolicyModelActor).

verl 0.9.1's ``distillation_ppo_loss`` (``verl/trainer/distillation/losses.py``), re-expressed on
OpenRLHF's training step through :mod:`rlhf_ext.algorithms.distillation`:

* the per-token loss is :func:`rlhf_ext.algorithms.distillation_token_loss` of the student's current
  log-probs (``forward_kl_topk``: its logits, read off the actor's output by a forward hook) and the
  teacher's values that :mod:`.teacher` put into ``Experience.info``;
* ``use_policy_gradient`` true: the distillation term is the actor's own policy loss
  (``self.actor_loss_fn``: ``--actor.policy_loss_type``, its clip settings, aggregation mode and rollout
  correction) called with the advantages ``-loss.detach()``; false: the per-token loss aggregated as
  OpenRLHF aggregates its KL loss (``openrlhf.models.aggregate_loss`` over the step's global token or
  sample count; ``seq-mean-token-mean`` per sample, else per token);
* :func:`rlhf_ext.algorithms.combine_with_task_loss` joins it to OpenRLHF's task policy loss: the
  policy loss OpenRLHF logs and backpropagates is ``task + coef * term`` (``use_task_rewards``) or the
  term alone. OpenRLHF's KL loss to the reference model (``--algo.kl.use_loss``) is added as usual.

The combination happens in a forward hook on ``actor_loss_fn`` that returns the combined loss, so
everything OpenRLHF and the plugin do after the loss (non-finite guard, entropy, backward) sees it. A
NaN/Inf teacher log-prob is recorded by the loss's input check and becomes a guard incident whose
``origin`` names ``teacher_log_probs`` (:mod:`.guard`).

Metrics (one per micro-batch, token-weighted by OpenRLHF's ``ppo_train``): ``distill/loss``,
``distill/reverse_kl_k1``, ``distill/reverse_kl_k3`` (the sampled tokens' estimates, top-k mode too),
for top-k ``distill/student_topk_mass``, ``distill/teacher_topk_mass``, ``distill/topk_overlap``; recorded
in ``metrics.jsonl`` as ``train/distill/...``.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, Optional

import torch

from .config import setting
from .teacher import LOG_PROBS_KEY, TEACHER_INFO_KEYS, TOPK_IDS_KEY, TOPK_LOG_PROBS_KEY

REPORTED = ("distill/loss", "distill/reverse_kl_k1", "distill/reverse_kl_k3", "distill/student_topk_mass",
            "distill/teacher_topk_mass", "distill/topk_overlap", "distill/task_loss")  # fmt: skip


def _fit_rows(value, n_actions: int) -> torch.Tensor:
    """Per-sample rows (a batched tensor or OpenRLHF's re-batched list of them) right-padded / cut to
    ``n_actions``: the action axis is aligned at its start, and positions past a row's own length are masked."""
    rows = list(value)
    out = []
    for row in rows:
        row = torch.as_tensor(row)
        if row.shape[0] >= n_actions:
            out.append(row[:n_actions])
        else:
            pad = row.new_zeros((n_actions - row.shape[0], *row.shape[1:]))
            out.append(torch.cat([row, pad], dim=0))
    return torch.stack(out)


def take_teacher_values(experience) -> Optional[Dict[str, torch.Tensor]]:
    """Remove the teacher's values from ``experience.info`` (OpenRLHF would log them) and fit them to the batch."""
    info = getattr(experience, "info", None) or {}
    if LOG_PROBS_KEY not in info:
        return None
    n_actions = experience.action_mask.shape[1]
    out = {}
    for key in TEACHER_INFO_KEYS:
        if key in info:
            out[key] = _fit_rows(info.pop(key), n_actions)
    if out[LOG_PROBS_KEY].shape[0] != experience.action_mask.shape[0]:
        raise RuntimeError(f"teacher values for {out[LOG_PROBS_KEY].shape[0]} samples, batch has "
                           f"{experience.action_mask.shape[0]}")  # fmt: skip
    return out


def distill_config(args):
    from rlhf_ext.algorithms import DistillationConfig

    from .distill_cli import DEFAULTS

    node = setting(args, "rlhf_ext.distill")  # getattr, not setting(): a clamp given as none stays None
    return DistillationConfig(**{k: getattr(node, k, d) if node is not None else d for k, d in DEFAULTS.items()})


class _Step:
    def __init__(self, config, teacher: Dict[str, torch.Tensor]):
        self.config, self.teacher = config, teacher
        self.logits = None
        self.busy = False
        self.done = False
        self.metrics: Dict[str, torch.Tensor] = {}
        self.student_log_probs = None


def _combined_loss(trainer, state: _Step, module, args, kwargs, output):
    from openrlhf.models import aggregate_loss as openrlhf_aggregate

    from rlhf_ext.algorithms import combine_with_task_loss, distillation_token_loss, reverse_kl_k3

    config = state.config
    log_probs, old_log_probs = args[0], args[1]
    mask = kwargs.get("action_mask", args[3] if len(args) > 3 else None)
    device = log_probs.device
    teacher_lp = state.teacher[LOG_PROBS_KEY].to(device)
    logits = None
    if config.uses_topk:
        if state.logits is None:
            raise RuntimeError("forward_kl_topk: the actor's logits were not captured in this training step")
        logits = state.logits[:, :-1, :][:, -mask.shape[1]:, :]
    per_token, metrics = distillation_token_loss(
        config, mask, student_log_probs=log_probs, teacher_log_probs=teacher_lp, student_logits=logits,
        teacher_topk_ids=state.teacher.get(TOPK_IDS_KEY, torch.empty(0)).to(device) if logits is not None else None,
        teacher_topk_log_probs=(state.teacher[TOPK_LOG_PROBS_KEY].to(device) if logits is not None else None),
    )  # fmt: skip
    if config.uses_topk:  # the sampled tokens' reverse KL, logged in every mode
        _, kl_metrics = reverse_kl_k3(log_probs.detach(), teacher_lp, mask, loss_max_clamp=None)
        metrics.update({k: v for k, v in kl_metrics.items() if k.startswith("distill/reverse_kl")})
    if config.use_policy_gradient:
        state.busy = True
        saved = getattr(module, "last_metrics", None)
        try:
            term = module(log_probs, old_log_probs, -per_token.detach(), *args[3:], **kwargs)[0]
        finally:
            state.busy = False
            if saved is not None:
                module.last_metrics = saved
    else:
        mode = setting(trainer.args, "actor.loss_agg_mode", "token-mean")
        counts = {k: kwargs[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size") if k in kwargs}
        term = openrlhf_aggregate(per_token, mask.to(per_token.dtype), token_level_loss=mode != "seq-mean-token-mean",
                                  **counts)  # fmt: skip
    metrics["distill/loss"] = term.detach()
    if config.use_task_rewards:
        metrics["distill/task_loss"] = output[0].detach()
    state.metrics = metrics
    state.student_log_probs = log_probs.detach()
    return (combine_with_task_loss(output[0], term, config), *output[1:])


def _dump(trainer, experience, state: _Step) -> None:
    directory = setting(trainer.args, "rlhf_ext.distill.dump_dir")
    if not directory:
        return
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    count = trainer.__dict__.get("_rlhf_ext_distill_calls", 0)
    trainer.__dict__["_rlhf_ext_distill_calls"] = count + 1
    os.makedirs(directory, exist_ok=True)
    record: Dict[str, Any] = {
        "sequences": experience.sequences.detach().cpu(), "attention_mask": experience.attention_mask.detach().cpu(),
        "action_mask": experience.action_mask.detach().cpu(), "loss_mode": state.config.loss_mode,
        "teacher": {k: v.detach().cpu() for k, v in state.teacher.items()},
        "student_log_probs": None if state.student_log_probs is None else state.student_log_probs.float().cpu(),
        "old_log_probs": experience.action_log_probs.detach().float().cpu(),
        "metrics": {k: float(v) for k, v in state.metrics.items()}, "call": count, "rank": rank,
    }  # fmt: skip
    path = os.path.join(directory, f"rank{rank}_call{count:05d}.pt")
    torch.save(record, path + ".tmp")
    os.replace(path + ".tmp", path)


def make_training_step(original, module=None):
    """Take the teacher's values out of the experience; combine the distillation term into the actor loss."""

    @functools.wraps(original)
    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        teacher = take_teacher_values(experience)
        if teacher is None:
            return original(self, experience, kl_ctl, step, loss_batch_info)
        config = self.__dict__.get("_rlhf_ext_distill_config")
        if config is None:
            config = self.__dict__["_rlhf_ext_distill_config"] = distill_config(self.args)
        state = _Step(config, teacher)

        def on_actor(_module, _inputs, output):
            if config.uses_topk and isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
                state.logits = output[1]["logits"]

        def on_loss(loss_module, args, kwargs, output):
            if state.busy or state.done:
                return None
            state.done = True
            return _combined_loss(self, state, loss_module, args, kwargs, output)

        # registered before the guard's hooks (this wrapper is outside the guard's), so the guard checks the
        # combined loss
        handles = [self.actor.register_forward_hook(on_actor),
                   self.actor_loss_fn.register_forward_hook(on_loss, with_kwargs=True)]  # fmt: skip
        try:
            status = original(self, experience, kl_ctl, step, loss_batch_info)
        finally:
            for handle in handles:
                handle.remove()
            state.logits = None
        metrics, weights = status["metrics"], status["weights"]
        for key in REPORTED:
            if key in state.metrics:
                metrics[key] = state.metrics[key].detach().float().reshape(()).cpu()
                weights[key] = "token"
        _dump(self, experience, state)
        return status

    return training_step


__all__ = ["REPORTED", "distill_config", "make_training_step", "take_teacher_values"]
