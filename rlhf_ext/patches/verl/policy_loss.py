"""rlhf_ext's policy losses under verl's policy-loss calling convention.

verl's actor (``verl.workers.utils.losses`` / ``dp_actor``) looks the loss up with
``get_policy_loss_fn(actor.policy_loss.loss_mode)`` and calls ``fn(old_log_prob, log_prob,
advantages, response_mask, loss_agg_mode, config=<actor config>, rollout_is_weights=None)``,
expecting ``(scalar loss, {metric: float})``. This adapter:

1. hands the loss verl's actor settings under verl's own names, for the options the loss has
   (every rlhf_ext loss names its options after verl's keys): ``clip_ratio_low`` /
   ``clip_ratio_high`` (falling back to ``clip_ratio``), ``clip_ratio_c`` (also as ``dual_clip``,
   PPO's name for it, to the losses whose verl counterpart applies it, :data:`VERL_DUAL_CLIP`: verl's
   actor always sets the key, default 3, and its ``gspo`` has no dual clip), ``tau_pos`` / ``tau_neg`` from the actor config, ``clip_cov_ratio`` /
   ``clip_cov_lb`` / ``clip_cov_ub`` / ``kl_cov_ratio`` / ``ppo_kl_coef`` / ``dro_beta``
   from ``actor.policy_loss`` (options verl has no key for, e.g. VESPO's ``vespo_k_pos``, keep their
   defaults);
2. computes the per-token loss with the rlhf_ext function (formulas and papers in
   :mod:`rlhf_ext.algorithms.ppo_losses`) on the rows that have tokens (verl's rollout-correction
   rejection empties whole rows of ``response_mask``; they contribute zero), multiplied by verl's
   rollout-correction weights when given, as verl's own losses do;
3. reduces it as verl's own loss of that algorithm does where that one ignores ``loss_agg_mode``
   (``gmpo`` / ``geo_mean``: the mean of the rows' losses; ``sapo``: ``seq-mean-token-mean``;
   :data:`.names.VERL_FIXED_REDUCTION`), unless ``RLHF_EXT_VERL_RLHF_EXT_DEFAULTS`` is set; otherwise
   with verl's own ``agg_loss`` and the actor's ``global_batch_info`` (data-parallel
   size, global token and sequence counts) and ``loss_scale_factor``, so every verl aggregation
   mode (``token-mean``, ``token-sum``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
   ``seq-mean-token-sum-norm``) means exactly what it means for verl's losses;
4. reports the loss's metrics as ``actor/<metric>`` floats (``ppo_kl`` as verl's ``actor/ppo_kl``);
5. with ``RLHF_EXT_VERL_OFF_POLICY_MASK_THRESHOLD`` (:mod:`.startup`), zeroes the per-token loss of
   the sequences DeepSeek-V3.2's off-policy mask drops (arXiv 2512.02556): negative mean advantage
   and mean KL from ``old_log_prob`` (the policy that sampled) above the threshold; the
   aggregation's counts stay those of the full response mask (TRL's convention).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from rlhf_ext.algorithms import accepted_options

from .names import VERL_FIXED_REDUCTION, named_for_verl, rlhf_ext_defaults
from .startup import off_policy_threshold

# verl keys passed under their own name to the losses that have an option of that name.
_ACTOR_KEYS = ("clip_ratio_c", "tau_pos", "tau_neg")
_POLICY_LOSS_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")


def _get(config: Any, key: str, default=None):
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, default) if getter is not None else getattr(config, key, default)
    return default if value is None else value


# the rlhf_ext losses whose verl counterpart (vanilla, bypass_mode's ppo_clip) applies clip_ratio_c as a dual clip
VERL_DUAL_CLIP = ("ppo", "bypass_mode")


def loss_options(config: Any, loss: Callable) -> Dict[str, Any]:
    """The rlhf_ext loss options that verl's actor config determines."""
    clip = _get(config, "clip_ratio")
    dual = getattr(loss, "__name__", None) in VERL_DUAL_CLIP
    settings = {"clip_ratio_low": _get(config, "clip_ratio_low", clip),
                "clip_ratio_high": _get(config, "clip_ratio_high", clip),
                "dual_clip": _get(config, "clip_ratio_c") if dual else None}  # PPO's name for verl's clip_ratio_c
    settings.update({key: _get(config, key) for key in _ACTOR_KEYS})
    policy_loss = _get(config, "policy_loss")
    settings.update({key: _get(policy_loss, key) for key in _POLICY_LOSS_KEYS})
    return {key: float(value) for key, value in accepted_options(loss, settings).items() if value is not None}


def global_batch_kwargs(config: Any) -> Dict[str, Any]:
    """``agg_loss`` keyword arguments from the actor config (global counts, dp size, norm constant)."""
    kwargs = dict(_get(config, "global_batch_info", {}) or {})
    scale = _get(config, "loss_scale_factor")
    if scale is not None:
        kwargs["loss_scale_factor"] = scale
    return kwargs


def _off_policy_masked(per_token, log_prob, old_log_prob, advantages, mask, threshold):
    from rlhf_ext.algorithms import off_policy_sequence_mask

    rows = mask.any(dim=-1)
    m = mask.to(advantages.dtype)
    seq_adv = (torch.where(mask, advantages, advantages.new_zeros(())) * m).sum(-1) / m.sum(-1).clamp(min=1)
    keep = torch.ones_like(rows)
    if bool(rows.any()):
        keep[rows] = off_policy_sequence_mask(seq_adv[rows], log_prob[rows].detach(), old_log_prob[rows], mask[rows],
                                              threshold)
    return torch.where(keep[:, None], per_token, per_token.new_zeros(()))


def make_verl_policy_loss(name: str, loss: Callable, agg_loss: Callable) -> Callable:
    """verl-convention wrapper of the rlhf_ext loss ``name``; ``agg_loss`` is verl's ``core_algos.agg_loss``."""

    def verl_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                         response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Optional[Any] = None,
                         rollout_is_weights: Optional[torch.Tensor] = None):
        options = loss_options(config, loss)
        mask = response_mask.bool()
        # verl's rollout-correction rejection can empty whole rows of the mask; the loss sees the
        # others, and an emptied row contributes a zero term (verl's own losses: masked out)
        keep = mask.any(dim=-1)
        try:
            if bool(keep.all()):
                per_token, metrics = loss(log_prob, old_log_prob, advantages, mask, **options)
            elif bool(keep.any()):
                part, metrics = loss(log_prob[keep], old_log_prob[keep], advantages[keep], mask[keep], **options)
                per_token = (log_prob * 0).index_put((keep.nonzero(as_tuple=True)[0],), part)
            else:
                per_token, metrics = log_prob * 0, {}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"policy loss 'rlhf_ext_{name}' failed (options from the actor config: "
                             f"{options}): {exc}") from exc
        if rollout_is_weights is not None:
            per_token = per_token * rollout_is_weights
        threshold = off_policy_threshold()
        if threshold is not None:
            per_token = _off_policy_masked(per_token, log_prob, old_log_prob, advantages, response_mask.bool(),
                                           threshold)
        fixed = None if rlhf_ext_defaults() else VERL_FIXED_REDUCTION.get(name)
        if fixed == "row-mean":  # verl's geo_mean: torch.mean of the rows' losses, every row counted
            m = response_mask.to(per_token.dtype)
            pg_loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
        else:
            pg_loss = agg_loss(loss_mat=per_token, loss_mask=response_mask, loss_agg_mode=fixed or loss_agg_mode,
                               **global_batch_kwargs(config))
        out = {f"actor/{key}": float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)
               for key, value in metrics.items()}
        return pg_loss, out

    return named_for_verl(verl_policy_loss, name, "policy loss", __name__, loss)
