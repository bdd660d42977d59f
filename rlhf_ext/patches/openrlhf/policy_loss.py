"""Every registered policy loss and all four loss-aggregation modes inside OpenRLHF's actor.

``ActorPPOTrainer`` (in ``openrlhf.trainer.ray.ppo_actor``) builds ``PolicyLoss(...)`` with
``token_level_loss = (loss_agg_mode == "token-mean")``, so OpenRLHF itself knows two modes and
two losses. The patch replaces the name ``PolicyLoss`` in that module with a subclass that
``ActorPPOTrainer.__init__`` (wrapped) configures from ``args``:

* OpenRLHF's losses (``ppo``, ``gspo``) with OpenRLHF's modes run OpenRLHF's ``forward`` untouched;
* OpenRLHF's losses with ``seq-mean-token-sum`` / ``seq-mean-token-sum-norm`` / ``token-sum`` still
  compute the per-token loss in OpenRLHF's ``forward`` (dual clip, IS correction included) and only
  change the denominator: the three modes are ``sum(mask * L)`` over a constant -- the global number
  of sequences, ``max_len`` times it (Dr.GRPO, arXiv 2503.20783), or 1 (verl's ``token-sum``) --
  which OpenRLHF's token-mean branch ``sum(mask * L) / batch_num_tokens * dp_size`` computes when
  handed that constant;
* any other registered loss comes from :mod:`rlhf_ext.algorithms` and is reduced by
  :func:`rlhf_ext.algorithms.aggregate_loss` with OpenRLHF's global counts.

``--rlhf_ext.top_entropy_quantile`` / ``mask_truncated_completions`` / ``off_policy_mask_threshold``
zero the policy loss of the tokens they drop (:mod:`.loss_masks`).

Metrics from the registered loss functions (``clip_frac_low``, ``clip_frac_high``, ...) are
added to the actor's training status by the wrapped ``ActorPPOTrainer.training_step``, which
also applies ``--algo.kl.clip`` to the KL loss.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional

import torch

from rlhf_ext.algorithms import (LOSS_AGG_MODES, accepted_options, aggregate_loss, get_policy_loss, only_metrics,
                                 openrlhf_correction, ppo_clip_fractions)

from .config import OPENRLHF_POLICY_LOSSES, loss_agg_max_len, loss_agg_mode, policy_loss_options, step_metrics
from . import loss_masks, staleness
from .kl import KL_CLIP_FRAC_KEY, clipped_fraction, kl_settings
from .updates import record_micro_batch
from .rollout_correction import METRIC_PREFIX as ROLLOUT_METRIC_PREFIX
from .rollout_correction import configure as configure_rollout_correction, corrected_loss

# the correction's metrics are logged whatever --rlhf_ext.step_metrics says; the decoupled objective's pass
# this filter too, but with step metrics off it computes none (it reads only_metrics, as the losses do)
STALENESS_METRIC_PREFIXES = (ROLLOUT_METRIC_PREFIX, "decoupled/")
SUM_MODES = ("seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")
# what forward returns to OpenRLHF whatever --rlhf_ext.step_metrics says: its clip_ratio (the sum of the
# two clip fractions) and ppo_kl; with step_metrics off a registered loss computes only these
HOST_METRICS = ("clip_frac_low", "clip_frac_high", "ppo_kl")


# OpenRLHF's flags as the loss options they set; a loss taking ``**kwargs`` (and forwarding them, e.g. to
# ``ppo``) gets those ``ppo`` takes, the others (DPPO's IS-weight cap) only a loss that names them
FORWARDED_TO_PPO = ("clip_ratio_low", "clip_ratio_high", "dual_clip")


def flag_options(fn, clip_low, clip_high, dual_clip) -> Dict[str, object]:
    """The options OpenRLHF's flags give the registered loss ``fn`` (each loss takes those it has):
    ``--actor.eps_clip_low_high`` / ``--actor.eps_clip`` as ``clip_ratio_low`` / ``clip_ratio_high``,
    ``--actor.dual_clip`` as ``dual_clip`` and ``clip_ratio_c`` (DPPO's IS-weight cap, verl's key for both)."""
    options: Dict[str, object] = {"clip_ratio_low": clip_low, "clip_ratio_high": clip_high}
    if dual_clip is not None:
        options["dual_clip"] = dual_clip
        options["clip_ratio_c"] = dual_clip
    return accepted_options(fn, options, forwarded=FORWARDED_TO_PPO)


def make_policy_loss_class(base, module=None):
    """Subclass of OpenRLHF's ``PolicyLoss`` (same constructor) that knows every loss and mode."""

    class RlhfExtPolicyLoss(base):
        __doc__ = (base.__doc__ or "") + "\n    (extended by rlhf_ext: registered losses, four aggregation modes)"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_agg_mode: Optional[str] = None  # None: OpenRLHF's own token_level_loss choice
            self.loss_agg_max_len: Optional[int] = None
            self.loss_options: Dict[str, object] = {}
            self.last_metrics: Dict[str, torch.Tensor] = {}
            # --rlhf_ext.step_metrics: the split clip fractions of OpenRLHF's losses, a registered loss's own metrics
            self.side_metrics = True
            self._registered_fn = None
            self.rollout_correction = None  # (RolloutCorrection, bypass) for registered losses

        def configure(self, mode: str, *, max_len: Optional[int] = None, options: Optional[Dict] = None,
                      side_metrics: bool = True):
            """Select the aggregation ``mode`` (one of ``LOSS_AGG_MODES``) and the loss's extra options;
            ``side_metrics=False`` drops the split clip fractions of OpenRLHF's own losses and a registered
            loss's metrics beyond the ``clip_ratio`` and ``ppo_kl`` that ``forward`` returns to OpenRLHF."""
            self.side_metrics = bool(side_metrics)
            if mode not in LOSS_AGG_MODES:
                raise ValueError(f"unknown loss aggregation mode {mode!r}; choose from {', '.join(LOSS_AGG_MODES)}")
            if max_len is not None and not max_len > 0:
                raise ValueError(f"loss_agg_max_len must be > 0, got {max_len!r}")
            self.loss_agg_mode = mode
            self.loss_agg_max_len = max_len
            self.loss_options = dict(options or {})
            if self.policy_loss_type in OPENRLHF_POLICY_LOSSES:
                if self.loss_options:
                    raise ValueError(
                        f"--actor.policy_loss_option is for registered losses; OpenRLHF's {self.policy_loss_type!r} "
                        "takes its settings from --actor.eps_clip_low_high / --actor.dual_clip"
                    )
                if mode in SUM_MODES:
                    self.token_level_loss = True  # the sum branch; the denominator is passed in forward
                self._registered_fn = None
                return self
            self._registered_fn = get_policy_loss(self.policy_loss_type)
            if self.is_correction_level != "off":  # OpenRLHF's flags, same meaning (.rollout_correction)
                self.rollout_correction = (openrlhf_correction(
                    self.is_correction_level, self.is_correction_mode, self.is_correction_gating,
                    self.is_correction_threshold), False)
            self._call_kwargs = {**flag_options(self._registered_fn, self.clip_eps_low, self.clip_eps_high,
                                                self.dual_clip), **self.loss_options}
            return self

        def forward(
            self,
            log_probs,
            old_log_probs,
            advantages,
            action_mask=None,
            rollout_log_probs=None,
            dp_size=1,
            batch_num_tokens=None,
            global_batch_size=None,
        ):
            mode = self.loss_agg_mode
            if mode is None:
                return super().forward(
                    log_probs, old_log_probs, advantages, action_mask, rollout_log_probs,
                    dp_size, batch_num_tokens, global_batch_size,
                )  # fmt: skip
            if action_mask is None:
                action_mask = torch.ones_like(log_probs, dtype=torch.bool)
            token_keep = loss_masks.token_keep(self, log_probs, old_log_probs, rollout_log_probs, advantages,
                                               action_mask)
            if token_keep is not None and self._registered_fn is None:
                # ppo / gspo: a token's loss and gradient are 0 where its advantage is 0
                advantages = torch.where(token_keep, advantages, advantages.new_zeros(()))

            if self._registered_fn is None and mode not in SUM_MODES:
                # OpenRLHF's loss and mode: its forward as is, plus the split clip fractions
                out = super().forward(
                    log_probs, old_log_probs, advantages, action_mask, rollout_log_probs,
                    dp_size, batch_num_tokens, global_batch_size,
                )  # fmt: skip
                self.last_metrics = (self._side_metrics(log_probs, old_log_probs, advantages, action_mask, out[1])
                                     if self.side_metrics else {})
                return out

            # OpenRLHF's counts leave out empty sequences too; the row maxima of the uint8 view are several
            # times cheaper than a boolean any() on the CPU
            row_has = _row_has_tokens(action_mask)
            if global_batch_size is None:
                num_seqs, scale = row_has.sum().to(torch.float32), 1  # local counts, as OpenRLHF does then
            else:
                num_seqs, scale = global_batch_size, dp_size

            if self._registered_fn is None:
                denom = 1 if mode == "token-sum" else (
                    num_seqs * (self._max_len(action_mask) if mode == "seq-mean-token-sum-norm" else 1))
                out = super().forward(
                    log_probs, old_log_probs, advantages, action_mask, rollout_log_probs,
                    scale, denom, global_batch_size,
                )  # fmt: skip
                self.last_metrics = (self._side_metrics(log_probs, old_log_probs, advantages, action_mask, out[1])
                                     if self.side_metrics else {})
                return out

            fewest, most = torch.stack(row_has.aminmax()).tolist()  # one synchronisation: "every row", "any row"
            if not most:
                zero = (log_probs * 0).sum()
                self.last_metrics = {}
                return zero, zero.detach(), zero.detach(), None, None
            rows = (log_probs, old_log_probs, advantages, action_mask, token_keep, rollout_log_probs,
                    getattr(self, "pending_lag", None))
            if not fewest:  # every row has tokens (the usual case): the tensors as they are
                keep = row_has.bool()
                rows = tuple(None if t is None else t[keep] for t in rows)
            vllm_kl = filter_ratio = None
            with only_metrics(None if self.side_metrics else HOST_METRICS):
                if self.rollout_correction is not None:
                    per_token, metrics, vllm_kl, filter_ratio = corrected_loss(
                        self._registered_fn, self._call_kwargs, self.rollout_correction, *rows[:4], rows[5],
                    )  # fmt: skip
                elif getattr(self, "staleness", None) is not None and self.staleness.decoupled:
                    per_token, metrics = staleness.decoupled_loss(
                        self, self._registered_fn, self._call_kwargs, *rows[:4], rows[5], rows[6])
                else:
                    per_token, metrics = self._registered_fn(*rows[:4], **self._call_kwargs)
            if token_keep is not None:
                per_token = torch.where(rows[4], per_token, per_token.new_zeros(()))
            num_tokens = batch_num_tokens if global_batch_size is not None else None
            loss = aggregate_loss(
                per_token,
                rows[3],
                mode,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                max_len=self._max_len(action_mask),
            )
            if scale != 1:
                loss = loss * scale
            # step_metrics off: none of the loss's own metrics (the rollout correction's stay, as before)
            self.last_metrics = {k: v.detach() for k, v in metrics.items()
                                 if self.side_metrics or k.startswith(STALENESS_METRIC_PREFIXES)}
            fractions = [metrics[k] for k in ("clip_frac_low", "clip_frac_high") if k in metrics]
            clip_ratio = (fractions[0] + fractions[1] if len(fractions) == 2 else
                          fractions[0] if fractions else torch.zeros((), device=log_probs.device))
            ppo_kl = metrics.get("ppo_kl")
            if ppo_kl is None:  # a loss without the metric: OpenRLHF's own formula
                m = action_mask.to(log_probs.dtype)
                ppo_kl = ((old_log_probs - log_probs) * m).sum().detach() / m.sum()
            return loss, clip_ratio.detach(), ppo_kl.detach(), vllm_kl, filter_ratio

        def _max_len(self, action_mask) -> float:
            return float(self.loss_agg_max_len if self.loss_agg_max_len is not None else action_mask.shape[-1])

        def _side_metrics(
            self, log_probs, old_log_probs, advantages, action_mask, clip_ratio
        ) -> Dict[str, torch.Tensor]:
            """Low/high clip fractions for OpenRLHF's own losses (OpenRLHF reports only their sum).

            Plain PPO (the common case) takes :func:`rlhf_ext.algorithms.ppo_clip_fractions` with
            OpenRLHF's ``clip_ratio`` (the fraction clipped at either bound, over the same mask):
            the upper bound is counted, the lower is the rest; no second pass through the loss, no
            host-device synchronisation. Dual clip and GSPO take the registered function of the
            same name on the non-empty sequences.
            """
            if self.policy_loss_type == "ppo" and self.dual_clip is None:
                return ppo_clip_fractions(
                    log_probs, old_log_probs, advantages, action_mask, clip_ratio_low=self.clip_eps_low,
                    clip_ratio_high=self.clip_eps_high, clipped=clip_ratio,
                )  # fmt: skip
            keep = action_mask.bool().any(dim=-1)
            if not bool(keep.any()):
                return {}
            with torch.no_grad():
                fn = get_policy_loss(self.policy_loss_type)
                kwargs = {"clip_ratio_low": self.clip_eps_low, "clip_ratio_high": self.clip_eps_high}
                if self.dual_clip is not None and self.policy_loss_type == "ppo":
                    kwargs["dual_clip"] = self.dual_clip
                try:
                    _, metrics = fn(
                        log_probs[keep].detach(), old_log_probs[keep], advantages[keep], action_mask[keep], **kwargs
                    )
                except ValueError:  # non-finite inputs: OpenRLHF's loss shows the problem itself
                    nan = torch.full((), float("nan"))
                    return {"clip_frac_low": nan, "clip_frac_high": nan}
            return {k: v for k, v in metrics.items() if k.startswith(("clip_frac", "dual_clip"))}

    RlhfExtPolicyLoss.__name__ = RlhfExtPolicyLoss.__qualname__ = "PolicyLoss"
    RlhfExtPolicyLoss.__module__ = base.__module__
    return RlhfExtPolicyLoss


def _row_has_tokens(action_mask: torch.Tensor) -> torch.Tensor:
    """``uint8 [B]``: 1 where the row has a response token, else 0."""
    m = action_mask if action_mask.dtype == torch.bool else action_mask != 0
    return m.view(torch.uint8).amax(dim=-1)


def configure_from_args(loss_fn, args) -> None:
    """Apply ``--actor.loss_agg_mode``, its ``max_len`` and ``--actor.policy_loss_option`` to ``loss_fn``."""
    if not hasattr(loss_fn, "configure"):
        return
    max_len, _ = loss_agg_max_len(args)
    loss_fn.configure(loss_agg_mode(args), max_len=max_len, options=policy_loss_options(args),
                      side_metrics=step_metrics(args))
    configure_rollout_correction(loss_fn, args, registered_call_kwargs)
    staleness.configure(loss_fn, args, registered_call_kwargs)


def registered_call_kwargs(loss_fn, fn) -> Dict[str, object]:
    """The options ``loss_fn``'s OpenRLHF settings (clip bounds, dual clip) give the registered loss ``fn``."""
    return flag_options(fn, loss_fn.clip_eps_low, loss_fn.clip_eps_high, loss_fn.dual_clip)


def make_trainer_init(original, module=None):
    @functools.wraps(original)
    def __init__(self, strategy, *args, **kwargs):
        original(self, strategy, *args, **kwargs)
        configure_from_args(self.actor_loss_fn, self.args)

    return __init__


def make_training_step(original, module=None):
    @functools.wraps(original)
    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        with kl_settings(self.args) as ctx, loss_masks.micro_batch(self, experience), \
                staleness.micro_batch(self, experience):
            status = original(self, experience, kl_ctl, step, loss_batch_info)
        record_micro_batch(self, experience, step)
        metrics, weights = status["metrics"], status["weights"]
        loss_metrics = dict(getattr(self.actor_loss_fn, "last_metrics", {}))
        loss_metrics.update(staleness.take_metrics(self.actor_loss_fn))  # M2PO's, whatever the loss
        for key, value in loss_metrics.items():
            if key not in metrics:
                metrics[key] = value.detach().float().reshape(())
                weights[key] = "token"
        if ctx.flags:
            frac = clipped_fraction(ctx.flags[-1], experience.action_mask, per_sample=False)
            if frac is not None:
                metrics[KL_CLIP_FRAC_KEY] = frac
                weights[KL_CLIP_FRAC_KEY] = "token"
        return status

    return training_step

