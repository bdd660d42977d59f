"""``--algo.kl.clip``: KL clamping wherever OpenRLHF computes KL, and the clipped fraction.

OpenRLHF computes per-token KL with ``openrlhf.models.utils.compute_approx_kl``, which clamps
every estimator to the fixed range [-10, 10]. It is called for the KL reward (in
``RemoteExperienceMaker.make_experience``) and for the KL loss (in
``ActorPPOTrainer.training_step``); both modules import it by name, so the patch replaces that
name in each. The replacement reads the run's setting from a context variable that the patched
``make_experience`` / ``training_step`` set from ``args``:

* no ``--algo.kl.clip``: OpenRLHF's function runs untouched (bit-identical), and the clamped
  tokens are read off its result (a value at +-10);
* ``--algo.kl.clip LO HI`` / ``none``: :func:`rlhf_ext.algorithms.kl_estimate` with that clamp
  (log ratio bounded to +-20 first so ``exp`` cannot overflow). With
  ``--algo.kl.unbiased_gradient`` the straight-through gradient of OpenRLHF's function is kept:
  only the forward value changes.

Either way the fraction of response tokens whose KL hit the clamp is logged as ``kl_clip_frac``.
"""

from __future__ import annotations

import contextvars
import functools
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from rlhf_ext.algorithms import kl_estimate

from .config import KL_CLIP_OPENRLHF_DEFAULT, OPENRLHF_KL_CLIP, kl_clip, step_metrics

KL_CLIP_FRAC_KEY = "kl_clip_frac"
LOG_RATIO_CLIP = 20.0
_NON_NEGATIVE = ("k2", "k3")  # OpenRLHF's estimators that are >= 0 by construction
RLHF_EXT_KL_ESTIMATORS = ("abs",)  # added to --algo.kl.estimator by the plugin
# KL as a loss only (--algo.kl.use_loss): k3 weighted by pi / pi_old (DeepSeek-V3.2; TRL's
# use_bias_correction_kl), which needs the old log-probs OpenRLHF passes only in the actor's KL loss
BIAS_CORRECTED_KL = "k3_bias_corrected"


@dataclass
class KLContext:
    clip: object  # KL_CLIP_OPENRLHF_DEFAULT, None or (lo, hi)
    flags: List[Optional[torch.Tensor]] = field(default_factory=list)  # per call: bool [B, T] "clamped"
    record: bool = True  # --rlhf_ext.step_metrics: compute the clamp flags at all


_context: contextvars.ContextVar[Optional[KLContext]] = contextvars.ContextVar("rlhf_ext_kl", default=None)


class kl_settings:
    """Context manager: KL calls inside use ``args``' clip setting and record clamp flags."""

    def __init__(self, args):
        self.context = KLContext(kl_clip(args), record=step_metrics(args))
        self._token = None

    def __enter__(self) -> KLContext:
        self._token = _context.set(self.context)
        return self.context

    def __exit__(self, *exc) -> None:
        _context.reset(self._token)


def _bound_flags(value: torch.Tensor, bounds, estimator: str) -> torch.Tensor:
    """Tokens whose KL sits at a clamp bound, read off the clamped value itself (no second KL pass).

    A value at the bound counts as clamped (an unclamped value exactly equal to the bound is the
    only case told apart differently, and it changes nothing); a NaN value is not counted. k2 and
    k3 are never negative, so a bound <= 0 cannot bind for them and is not compared.
    """
    with torch.no_grad():
        v = value.detach()
        lo, hi = bounds
        if estimator in _NON_NEGATIVE and lo <= 0:
            return v >= hi
        if lo == -hi:
            return v.abs() >= hi
        return (v <= lo) | (v >= hi)


def make_compute_approx_kl(original, module=None):
    @functools.wraps(original)
    def compute_approx_kl(log_probs, log_probs_base, log_probs_old=None, kl_estimator="k1", unbiased_gradient=False):
        ctx = _context.get()
        if kl_estimator == BIAS_CORRECTED_KL:
            return _bias_corrected(ctx, log_probs, log_probs_base, log_probs_old)
        if kl_estimator in RLHF_EXT_KL_ESTIMATORS:
            return _rlhf_ext_estimator(original, ctx, log_probs, log_probs_base, log_probs_old, kl_estimator,
                                       unbiased_gradient)
        if ctx is None or (ctx.clip == KL_CLIP_OPENRLHF_DEFAULT and not ctx.record):
            return original(log_probs, log_probs_base, log_probs_old, kl_estimator, unbiased_gradient)
        if ctx.clip == KL_CLIP_OPENRLHF_DEFAULT:
            value = original(log_probs, log_probs_base, log_probs_old, kl_estimator, unbiased_gradient)
            ctx.flags.append(_bound_flags(value, OPENRLHF_KL_CLIP, kl_estimator))
            return value
        raw, _ = kl_estimate(
            log_probs.float(), log_probs_base.float(), kl_estimator, clip=None, log_ratio_clip=LOG_RATIO_CLIP
        )
        if ctx.clip is None:
            if ctx.record:
                ctx.flags.append(torch.zeros_like(raw, dtype=torch.bool))
            value = raw
        else:
            lo, hi = ctx.clip
            if ctx.record:
                with torch.no_grad():
                    ctx.flags.append((raw < lo) | (raw > hi))
            value = raw.clamp(lo, hi)  # = kl_estimate(..., clip=ctx.clip), from the one KL pass
        if not unbiased_gradient:
            return value
        # OpenRLHF's unbiased variant returns value.detach() + g - g.detach(): keep its gradient
        # term g - g.detach() (zero-valued) and swap in our clamped value.
        straight_through = original(log_probs, log_probs_base, log_probs_old, kl_estimator, True)
        return value.detach() + (straight_through - straight_through.detach())

    return compute_approx_kl


def _rlhf_ext_estimator(original, ctx, log_probs, log_probs_base, log_probs_old, kl_estimator, unbiased_gradient):
    """``--algo.kl.estimator abs`` (``|log pi - log pi_ref|``, verl's and MindSpeed-RL's ``abs``), clamped
    like OpenRLHF's estimators (its [-10, 10], or ``--algo.kl.clip``); with ``--algo.kl.unbiased_gradient``
    OpenRLHF's own straight-through gradient (identical for every estimator) replaces abs's."""
    clip = OPENRLHF_KL_CLIP if ctx is None or ctx.clip == KL_CLIP_OPENRLHF_DEFAULT else ctx.clip
    raw, _ = kl_estimate(log_probs.float(), log_probs_base.float(), kl_estimator, clip=None, log_ratio_clip=None)
    value = raw if clip is None else raw.clamp(clip[0], clip[1])
    if ctx is not None and ctx.record:
        with torch.no_grad():
            ctx.flags.append(torch.zeros_like(raw, dtype=torch.bool) if clip is None
                             else (raw < clip[0]) | (raw > clip[1]))
    if not unbiased_gradient:
        return value
    straight_through = original(log_probs, log_probs_base, log_probs_old, "k1", True)
    return value.detach() + (straight_through - straight_through.detach())


def _bias_corrected(ctx, log_probs, log_probs_base, log_probs_old):
    """``--algo.kl.estimator k3_bias_corrected``: ``(pi / pi_old) * k3``, value and gradient as TRL 1.16's
    ``use_bias_correction_kl``; k3 is computed on the log ratio bounded to +-20 (so ``exp`` cannot
    overflow) and clamped like OpenRLHF's estimators (its [-10, 10], or ``--algo.kl.clip``)."""
    from rlhf_ext.algorithms import k3_bias_corrected

    if log_probs_old is None:
        raise ValueError(f"--algo.kl.estimator {BIAS_CORRECTED_KL} is for KL as a loss (--algo.kl.use_loss): "
                         "it needs the old policy's log-probs, which the KL reward does not have")
    clip = OPENRLHF_KL_CLIP if ctx is None or ctx.clip == KL_CLIP_OPENRLHF_DEFAULT else ctx.clip
    lp, base = log_probs.float(), log_probs_base.float()
    bounded_base = lp - (lp - base).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    raw = k3_bias_corrected(lp, bounded_base, log_probs_old.float())
    value = raw if clip is None else raw.clamp(clip[0], clip[1])
    if ctx is not None and ctx.record:
        with torch.no_grad():
            ctx.flags.append(torch.zeros_like(raw, dtype=torch.bool) if clip is None
                             else (raw < clip[0]) | (raw > clip[1]))
    return value


def clipped_fraction(flags: Optional[torch.Tensor], action_mask: torch.Tensor, per_sample: bool) -> Optional[torch.Tensor]:
    """Fraction of response tokens flagged: per sample ``[B]`` or over the batch (0-dim)."""
    if flags is None or flags.shape != action_mask.shape:
        return None
    m = action_mask if action_mask.dtype == torch.bool else action_mask.bool()
    hits = flags & m
    if per_sample:
        return hits.sum(-1) / m.sum(-1).clamp(min=1).to(torch.float32)
    return hits.sum() / m.sum().clamp(min=1).to(torch.float32)


def make_make_experience(original, module=None):
    @functools.wraps(original)
    def make_experience(self, samples_list):
        with kl_settings(self.strategy.args) as ctx:
            experiences = original(self, samples_list)
        if len(ctx.flags) == len(experiences):
            for experience, flags in zip(experiences, ctx.flags):
                frac = clipped_fraction(flags, experience.action_mask, per_sample=True)
                if frac is not None:
                    experience.info[KL_CLIP_FRAC_KEY] = frac.to(experience.action_mask.device)
        return experiences

    return make_experience
