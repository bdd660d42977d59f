"""GRPO and DAPO actor losses with rlhf_ext's policy losses and aggregation modes.

Seams: ``GRPOActorLossFunc`` / ``DAPOActorLossFunc`` (``models/loss/*_actor_loss_func.py``,
registered in ``LossFuncFactory`` as ``ray_grpo_actor`` / ``ray_dapo_actor``), methods
``add_loss_meta_info`` and ``compute_loss``. Options reach a loss only through the ``meta_info``
that ``Actor.get_loss_meta_func`` builds; the rlhf_ext settings ride in its ``kl_penalty`` entry
(:class:`.config.ConfiguredName`), which both losses receive.

With no rlhf_ext setting the original ``compute_loss`` runs, bit for bit. Otherwise:

* per-token loss from :func:`rlhf_ext.algorithms.get_policy_loss` -- ``ppo`` (clipped surrogate;
  DAPO's clip-higher when ``clip_higher_enable``, for the GRPO loss too), ``gspo`` (Zheng et al.
  2025, arXiv 2507.18071, sequence-level ratio; use clip ranges around 3e-4 / 4e-4) or any other
  registered loss (``cispo``, ``sapo``, ``gmpo``, ``clip_cov``, ...): the clip range goes to its
  ``clip_ratio_low``/``clip_ratio_high`` options (when it has them), the rest comes from
  ``rl_config.policy_loss_options``;
* reduced by :func:`rlhf_ext.algorithms.aggregate_loss` with ``loss_agg_mode`` (default: what the
  built-in loss does -- ``token-mean`` for GRPO and for DAPO with ``token_level_loss``, else
  ``seq-mean-token-mean``); ``seq-mean-token-sum-norm`` divides by ``loss_agg_max_len`` x sequences
  (Dr.GRPO, arXiv 2503.20783). Counts are the micro-batch's, as MindSpeed-RL's own losses use;
* GRPO adds ``kl_ctrl.value`` x the token-mean KL (``compute_kl_penalty`` with ``k1``/``k2``/``k3``
  and ``kl_clip``; ``k3_bias_corrected`` here, with ``old_log_prob``) and subtracts the entropy bonus,
  as the built-in loss does;
* ``top_entropy_quantile`` / ``off_policy_mask_threshold`` multiply the per-token policy loss by
  their mask before aggregation (counts from the full mask, as TRL does); the entropy is computed
  for the first even with ``entropy_coeff: 0``, and the second measures the KL from
  ``old_log_prob`` (the policy that sampled, in MindSpeed-RL's batch).
* ``adaptive_entropy`` (:mod:`.entropy_control`): the entropy is computed even at ``entropy_coeff: 0``, for
  the controller that steps the coefficient;
* on-policy distillation (``rl_config.distillation``, :mod:`.distillation`): the teacher's log-probs are the
  batch's ``ref_log_prob``; the distillation term replaces GRPO's KL-to-reference term;
* rollout correction (``rl_config.rollout_is`` / ``rollout_rs``, :mod:`.rollout_correction`):
  :func:`rlhf_ext.algorithms.rollout_correction` of ``old_log_prob`` against the batch's
  ``rollout_log_probs`` weights and masks the per-token terms after the token masks, before
  aggregation (bypass: the rollout log-probs are the ratio's behaviour policy); ``rollout_corr/*``
  metrics.

Metrics: MindSpeed-RL's (``actor/pg_loss``, ``actor/pg_clipfrac`` = low + high, ``actor/ppo_kl``,
``actor/kl_loss``, ``actor/entropy``) plus ``actor/clip_frac_low``, ``actor/clip_frac_high`` and, with
a KL loss, ``actor/kl_clip_frac`` -- the OpenRLHF side's names. The response mask is moved to the
device the log-probs are on instead of MindSpeed-RL's ``.npu()``, so this path runs on NPU, CUDA
and CPU alike.
"""

from __future__ import annotations

import functools

import torch

from .config import BIAS_CORRECTED_KL, RLHF_EXT_KL_PENALTIES, settings_of

SETTINGS_ATTR = "_rlhf_ext_settings"


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return torch.where(mask, x, x.new_zeros(())).sum() / m.sum().clamp(min=1.0)


def _uses_rlhf_ext(loss) -> bool:
    return bool(getattr(loss, SETTINGS_ATTR, None)) or str(getattr(loss, "kl_penalty", "")) in RLHF_EXT_KL_PENALTIES


def make_add_loss_meta_info(original, module):
    @functools.wraps(original)
    def add_loss_meta_info(self, meta_info):
        original(self, meta_info)
        if meta_info is None:
            return
        settings = settings_of(meta_info.get("kl_penalty"))
        setattr(self, SETTINGS_ATTR, settings)
        # The GRPO loss ignores these keys; with rlhf_ext settings it honours clip-higher as DAPO does.
        for key in ("clip_higher_enable", "clip_ratio_low", "clip_ratio_high"):
            if key in meta_info and not hasattr(self, key):
                setattr(self, key, meta_info[key])
        if "kl_penalty" in meta_info:
            self.kl_penalty = meta_info["kl_penalty"]

    return add_loss_meta_info


def _clip_range(loss):
    if getattr(loss, "clip_higher_enable", False):
        return float(loss.clip_ratio_low), float(loss.clip_ratio_high)
    return float(loss.clip_ratio), float(loss.clip_ratio)


def token_keep(settings, log_probs, old_log_prob, advantages, mask, entropy):
    """The tokens that keep their policy loss under ``top_entropy_quantile`` / ``off_policy_mask_threshold``."""
    from rlhf_ext.algorithms import off_policy_sequence_mask, top_entropy_mask

    keep = None
    delta = settings.get("off_policy_mask_threshold")
    if delta is not None:
        m = mask.to(advantages.dtype)
        seq_adv = (torch.where(mask, advantages, advantages.new_zeros(())) * m).sum(-1) / m.sum(-1).clamp(min=1)
        keep = mask & off_policy_sequence_mask(seq_adv, log_probs.detach(), old_log_prob, mask, delta)[:, None]
    q = settings.get("top_entropy_quantile")
    if q is not None:
        if entropy is None:
            raise ValueError("rl_config.top_entropy_quantile: the actor returned no entropy")
        top = top_entropy_mask(entropy.detach(), mask, q)
        keep = top if keep is None else keep & top
    return keep


def policy_loss_and_options(loss, settings):
    """``(policy loss name, its options)`` from the rlhf_ext settings and MindSpeed-RL's clip keys."""
    from rlhf_ext.algorithms import accepted_options, get_policy_loss

    clip_low, clip_high = _clip_range(loss)
    loss_type = settings.get("policy_loss_type", "ppo")
    extra = {"log_ratio_clip": None} if loss_type == "ppo" else {}  # MindSpeed-RL's ppo does not clamp
    clip = {"clip_ratio_low": clip_low, "clip_ratio_high": clip_high}
    extra.update(accepted_options(get_policy_loss(loss_type), clip))
    extra.update(settings.get("policy_loss_options") or {})
    return loss_type, extra


def policy_terms(loss, log_probs, old_log_prob, advantages, mask, default_mode, entropy=None, batch=None):
    """``(aggregated policy loss, metrics)`` for the rlhf_ext settings of ``loss``.

    With rollout correction configured (``batch`` then holds ``rollout_log_probs``), the per-token
    terms are weighted and masked by :func:`rlhf_ext.algorithms.rollout_correction` of
    ``old_log_prob`` against the rollout log-probs, after the token masks and before aggregation;
    in bypass mode the rollout log-probs are the PPO ratio's behaviour policy and the weights use
    the current ``log pi``. The ``rollout_corr/*`` metrics join the loss's.
    """
    from rlhf_ext.algorithms import aggregate_loss, apply_rollout_correction, get_policy_loss, rollout_correction

    from .config import rollout_correction_of
    from .rollout_correction import rollout_log_probs_for

    settings = getattr(loss, SETTINGS_ATTR, None) or {}
    if old_log_prob is None:
        # skip_actor_log_prob: one update per rollout, so the current policy is the old one
        old_log_prob = log_probs.detach().clone()
    correction, bypass = rollout_correction_of(settings)
    if correction is not None:
        train = log_probs.detach() if bypass else old_log_prob
        rollout, no_rollout_share = rollout_log_probs_for(batch if batch is not None else {}, train, mask)
        if bypass:
            old_log_prob = rollout
    loss_type, extra = policy_loss_and_options(loss, settings)
    per_token, metrics = get_policy_loss(loss_type)(log_probs, old_log_prob, advantages, mask, **extra)
    keep = token_keep(settings, log_probs, old_log_prob, advantages, mask, entropy)
    if keep is not None:
        per_token = torch.where(keep, per_token, per_token.new_zeros(()))
    if correction is not None:
        result = rollout_correction(train, rollout, mask, correction)
        per_token = apply_rollout_correction(per_token, result)
        metrics = dict(metrics)
        metrics.update({"rollout_corr/" + key: value for key, value in result.metrics.items()})
        metrics["rollout_corr/no_rollout_log_prob_fraction"] = no_rollout_share.detach()
    mode = settings.get("loss_agg_mode", default_mode)
    pg = aggregate_loss(per_token, mask, mode, max_len=settings.get("loss_agg_max_len"))
    return pg, metrics


def _mask(batch, log_probs, generate_mask):
    if "response_mask" in batch:
        mask = batch["response_mask"]
    else:
        if "responses" not in batch:
            raise ValueError("The responses is None")
        mask = generate_mask(batch["responses"], batch["response_length"])
    return mask.to(log_probs.device).bool()


def _finish(loss, module, batch, kwargs, pg_loss, metrics, ppo_extra):
    use_dynamic_bsz = kwargs.get("use_dynamic_bsz", False)
    actual = kwargs.get("actual_micro_batch_size", None)
    policy_loss = pg_loss * (batch["responses"].size(0) / actual) if use_dynamic_bsz else pg_loss
    zero = torch.zeros(())  # losses without a ratio clip report no clip fractions
    low, high = metrics.get("clip_frac_low", zero), metrics.get("clip_frac_high", zero)
    stats = {
        "actor/pg_loss": abs(pg_loss.detach().item()),
        "actor/pg_clipfrac": float(low + high),
        "actor/ppo_kl": float(metrics["ppo_kl"]),
        "actor/kl_loss": float(ppo_extra["kl_loss"]),
        "actor/entropy": float(ppo_extra["entropy"]),
        "actor/clip_frac_low": float(low),
        "actor/clip_frac_high": float(high),
    }
    if ppo_extra.get("kl_clip_frac") is not None:
        stats["actor/kl_clip_frac"] = float(ppo_extra["kl_clip_frac"])
    stats.update({key: float(value) for key, value in metrics.items() if key.startswith(("rollout_corr/", "distill/"))})
    return policy_loss, stats


def _make_compute_loss(original, module, with_kl: bool, default_mode):
    @functools.wraps(original)
    def compute_loss(self, output, batch, forward_only=False, non_loss_data=True, **kwargs):
        if forward_only or not _uses_rlhf_ext(self):
            return original(self, output, batch, forward_only, non_loss_data, **kwargs)
        settings = getattr(self, SETTINGS_ATTR, None) or {}
        needs_entropy = (self.entropy_coeff != 0 or settings.get("top_entropy_quantile") is not None
                         or bool(settings.get("adaptive_entropy")))  # its controller measures it at 0 too
        log_probs, entropy = self.compute_log_probs(
            output=output, batch=batch, skip_entropy=not needs_entropy, **kwargs)
        mask = _mask(batch, log_probs, module.generate_mask)
        old_log_prob = batch.get("old_log_prob")
        advantages = batch["advantages"]
        pg, metrics = policy_terms(self, log_probs, old_log_prob, advantages, mask, default_mode(self), entropy, batch)
        entropy_mean = _masked_mean(entropy, mask) if entropy is not None else pg.new_zeros(())
        extra = {"entropy": entropy_mean.detach(), "kl_loss": pg.new_zeros(()), "kl_clip_frac": None}
        pg_loss = pg
        distill = settings.get("distillation")
        if distill:
            # the teacher is in the reference slot: the distillation term replaces the KL-to-reference term
            from .distillation import config_of, distillation_loss

            loss_type, options = policy_loss_and_options(self, settings)
            pg_loss, distill_metrics = distillation_loss(
                config_of(settings), pg, log_probs, old_log_prob, mask, batch, loss_type, options,
                settings.get("loss_agg_mode", default_mode(self)), settings.get("loss_agg_max_len"))
            metrics = {**metrics, **distill_metrics}
        elif with_kl:
            from .kl import bias_corrected_kl, last_clipped

            if str(self.kl_penalty) == BIAS_CORRECTED_KL:
                old = old_log_prob if old_log_prob is not None else log_probs.detach()  # on-policy: ratio 1
                kl = bias_corrected_kl(log_probs, batch["ref_log_prob"], old, self.kl_penalty)
            else:
                kl = module.compute_kl_penalty(log_probs, batch["ref_log_prob"], self.kl_penalty)
            clipped = last_clipped()
            if clipped is not None and clipped.shape == mask.shape:
                extra["kl_clip_frac"] = _masked_mean(clipped.float(), mask).detach()
            kl_mean = _masked_mean(kl, mask)
            extra["kl_loss"] = kl_mean.detach()
            pg_loss = pg_loss + kl_mean * self.kl_ctrl.value
        pg_loss = pg_loss - self.entropy_coeff * entropy_mean
        module.MsProbe.save_data({"old_log_prob": old_log_prob, "log_prob": log_probs,
                                  "ref_log_prob": batch.get("ref_log_prob"), "advantages": advantages,
                                  "loss": pg_loss, "kl_loss": extra["kl_loss"]})
        return _finish(self, module, batch, kwargs, pg_loss, metrics, extra)

    return compute_loss


def make_grpo_compute_loss(original, module):
    return _make_compute_loss(original, module, with_kl=True, default_mode=lambda loss: "token-mean")


def make_dapo_compute_loss(original, module):
    return _make_compute_loss(
        original, module, with_kl=False,
        default_mode=lambda loss: "token-mean" if getattr(loss, "token_level_loss", True) else "seq-mean-token-mean")
