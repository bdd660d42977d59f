"""SimPO (and the SFT term) inside OpenRLHF's DPO trainer (``openrlhf.trainer.dpo_trainer``).

OpenRLHF 0.11's ``DPOTrainer`` builds ``DPOLoss(beta, label_smoothing, ipo)`` in ``__init__``,
feeds it the *summed* response log-probs of the policy and of the reference model, and adds
``nll_loss_coef`` x the chosen responses' mean-token NLL. SimPO (arXiv 2405.14734) needs the
*mean* token log-prob and no reference model, so with ``--model.loss_type simpo``:

* ``DPOTrainer.__init__`` (wrapped) swaps ``self.loss_fn`` for :class:`SimPOLoss`, which has the
  same call contract as ``DPOLoss`` (four log-prob tensors in; loss, chosen and rejected rewards out);
* ``DPOTrainer._get_batch_logps`` (wrapped) returns the per-sequence mean in place of the sum, so
  the trainer's ``chosen_logps`` are length-normalised; the NLL term, computed from the means
  already, is unchanged;
* ``DPOTrainer.concatenated_forward`` (wrapped) skips the reference model's forward pass (SimPO
  is reference-free; its outputs would be ignored);
* ``DPOTrainer.save_logs_and_checkpoints`` (wrapped) adds ``margin`` (chosen minus rejected
  reward) to every logged step, and for SimPO the mean token log-probs of both sides.

``dpo`` and ``ipo`` keep OpenRLHF's own loss untouched (``ipo`` just sets ``--model.ipo_enable``).
The math is :func:`rlhf_ext.algorithms.simpo_loss`.
"""

from __future__ import annotations

import functools
from typing import Dict

import torch

from rlhf_ext.algorithms import simpo_loss

LOSS_TYPES = ("dpo", "ipo", "simpo")
DEFAULT_SIMPO_BETA = 2.0  # SimPO paper's range is 2-10 (DPO's 0.1 is far too weak for it)
DEFAULT_SIMPO_GAMMA = 1.0  # gamma / beta = 0.5 at beta 2, the paper's recommended ratio


class SimPOLoss(torch.nn.Module):
    """``DPOLoss``'s contract with SimPO's formula; reference log-probs are accepted and ignored."""

    def __init__(self, beta: float, gamma: float, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.beta, self.gamma, self.label_smoothing = float(beta), float(gamma), float(label_smoothing)
        self.last_metrics: Dict[str, float] = {}

    def forward(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps=None,
                reference_rejected_logps=None):
        losses, metrics = simpo_loss(policy_chosen_logps, policy_rejected_logps, beta=self.beta, gamma=self.gamma,
                                     label_smoothing=self.label_smoothing)
        self.last_metrics = {
            "chosen_avg_logp": float(policy_chosen_logps.detach().float().mean()),
            "rejected_avg_logp": float(policy_rejected_logps.detach().float().mean()),
        }
        return losses.mean(), metrics["chosen_reward"], metrics["rejected_reward"]


def loss_type(args) -> str:
    model = getattr(args, "model", None)
    value = getattr(model, "loss_type", None)
    if value is None:
        return "ipo" if getattr(model, "ipo_enable", False) else "dpo"
    if value not in LOSS_TYPES:
        raise ValueError(f"--model.loss_type must be one of {', '.join(LOSS_TYPES)}, got {value!r}")
    return value


def is_simpo(trainer) -> bool:
    return getattr(trainer, "_rlhf_ext_loss_type", "dpo") == "simpo"


def configure_trainer(trainer) -> None:
    kind = loss_type(trainer.args)
    trainer._rlhf_ext_loss_type = kind
    if kind == "simpo":
        model_args = trainer.args.model
        gamma = getattr(model_args, "simpo_gamma", None)
        trainer.loss_fn = SimPOLoss(
            trainer.beta,
            DEFAULT_SIMPO_GAMMA if gamma is None else gamma,
            getattr(model_args, "label_smoothing", 0.0),
        )


def make_trainer_init(original, module=None):
    @functools.wraps(original)
    def __init__(self, model, ref_model, strategy, *args, **kwargs):
        original(self, model, ref_model, strategy, *args, **kwargs)
        configure_trainer(self)

    return __init__


def make_get_batch_logps(original, module=None):
    @functools.wraps(original)
    def _get_batch_logps(self, per_token_logps, attention_mask, prompt_id_lens):
        sums, means = original(self, per_token_logps, attention_mask, prompt_id_lens)
        if is_simpo(self):
            return means, means  # SimPO's reward is the length-normalised log-likelihood
        return sums, means

    return _get_batch_logps


def make_concatenated_forward(original, module=None):
    @functools.wraps(original)
    def concatenated_forward(self, model, chosen_ids, c_mask, reject_ids, r_mask, prompt_id_lens):
        if is_simpo(self) and model is self.ref_model:
            zeros = torch.zeros(chosen_ids.shape[0], device=chosen_ids.device)
            return zeros, zeros.clone(), [], zeros.new_zeros(())
        return original(self, model, chosen_ids, c_mask, reject_ids, r_mask, prompt_id_lens)

    return concatenated_forward


def make_save_logs(original, module=None):
    @functools.wraps(original)
    def save_logs_and_checkpoints(self, args, global_step, step_bar, logs_dict=None, client_states=None):
        if logs_dict is not None and "chosen_reward" in logs_dict and "reject_reward" in logs_dict:
            logs_dict["margin"] = logs_dict["chosen_reward"] - logs_dict["reject_reward"]
            for key, value in getattr(self.loss_fn, "last_metrics", {}).items():
                logs_dict.setdefault(key, value)
        return original(self, args, global_step, step_bar, logs_dict, client_states)

    return save_logs_and_checkpoints
