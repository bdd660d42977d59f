"""What the importance-ratio policy losses share: their convention, input preparation, log-ratio,
metric means and option checks. The losses themselves live by family:

* :mod:`.token_weight_losses`: the token ratio enters as a reshaped weight instead of a hard clip
  (CISPO's clipped stop-gradient weight, SAPO's sigmoid gate);
* :mod:`.sequence_losses`: one ratio per sequence (GMPO's geometric mean, LUSPO's length-scaled GSPO,
  VESPO's Gamma-shaped weight of the sequence ratio);
* :mod:`.covariance_losses`: tokens selected by the covariance of advantage and log-probability
  (Clip-Cov, KL-Cov);
* :mod:`.dppo_losses`: a trust region on the probability instead of the ratio (DPPO, TV or binary KL).

Same convention as :mod:`.ppo_losses`: ``fn(log_probs, old_log_probs, advantages, mask,
**options) -> (per_token_loss[B, T], metrics)``, reduced separately by
:func:`rlhf_ext.algorithms.aggregate_loss`. Options are named after verl 0.9.1's actor config keys
(``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``, ``tau_pos``, ``tau_neg``, and
``policy_loss.clip_cov_ratio`` / ``clip_cov_lb`` / ``clip_cov_ub`` / ``kl_cov_ratio`` /
``ppo_kl_coef``) and TRL 1.16's (``vespo_k_pos`` ...), so the host glue passes them through by name.

Losses whose reference is ``-w * A * log pi`` with a stop-gradient weight ``w`` (CISPO, DPPO,
VESPO) are written ``-w * A * exp(log pi - sg(log pi))``: the same gradient ``-w A grad log pi``,
but the value is the weighted advantage ``-w A`` (on-policy ``-A``, the scale of PPO's loss)
instead of a number that moves with the log-probabilities themselves.

Padding (``mask`` false) may hold NaN/Inf: inputs are zeroed there with ``torch.where`` before
any arithmetic, so the loss and its gradient are 0 on padding and finite elsewhere.

Cost (issue 22's goal: no more than OpenRLHF's own PPO loss): each loss computes its value and its
derivative with respect to ``log pi`` without a graph and attaches the derivative with
:func:`.linearised.with_derivative` (backward is one product instead of a node per operation), and
combines masks and flags as 0/1 floats (:mod:`.float_flags`) instead of ``torch.where`` and booleans.
Where the derivative is that of a ``min`` / ``max`` of a clipped and an unclipped branch, it is the
unclipped branch's where that branch is kept, ties included (a tie means the clip is inactive, and
autograd's half-and-half split then sums to the same).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from .checks import check_token_inputs_finite
from .float_flags import flag, float_mask

Metrics = Dict[str, torch.Tensor]


def prepare_inputs(log_probs, old_log_probs, advantages, mask):
    """Check the inputs and zero them on the padding; returns the boolean mask, the zeroed
    log-probs (with their graph), old log-probs and advantages (detached), the 0/1 float mask and the
    token count (float32, or float64 for float64 inputs). A loss whose every term carries the (zeroed)
    advantage as a factor, the others finite there, is then 0 on the padding without another mask; its
    gradient there is 0 through the zeroing of ``log_probs``.

    Inputs finite everywhere (the usual case) are multiplied by the 0/1 mask: ``x * 1 = x`` and
    ``x * 0 = 0`` exactly, the gradient is passed or zeroed the same way, at a fraction of a ``where``'s
    cost. A NaN/Inf anywhere (padding may hold them) takes ``torch.where``, since ``NaN * 0`` is NaN."""
    maskb, finite = check_token_inputs_finite(mask, log_probs=log_probs, old_log_probs=old_log_probs,
                                              advantages=advantages)
    dtype = log_probs.dtype
    m = float_mask(maskb, dtype)
    old_log_probs, advantages = old_log_probs.detach().to(dtype), advantages.detach().to(dtype)
    if finite:
        lp, old, adv = log_probs * m, old_log_probs * m, advantages * m
    else:
        zero = log_probs.new_zeros(())
        lp, old, adv = (torch.where(maskb, log_probs, zero), torch.where(maskb, old_log_probs, zero),
                        torch.where(maskb, advantages, zero))
    # the count in float32 at least: exact up to 2^24 tokens, where a 16-bit sum would round it
    return maskb, lp, old, adv, m, m.sum(dtype=torch.float64 if dtype == torch.float64 else torch.float32)


def clamped_log_ratio(lp, old, log_ratio_clip, in_range: bool = True):
    """``(log_ratio, in_range)``: ``log pi - log pi_old`` (detached) clamped to ``+-log_ratio_clip``, and the
    derivative of the clamp (1 inside, ties included as autograd's ``clamp``; 0 outside) as a 0/1 float,
    or ``None`` without a clip or when not asked for (``in_range=False``)."""
    log_ratio = lp.detach() - old
    if log_ratio_clip is None:
        return log_ratio, None
    clamped = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    # |x| <= c exactly where the clamp left x as it was (NaN: neither), without computing |x|
    return clamped, (flag(torch.eq, clamped, log_ratio) if in_range else None)


def times_flag(x: torch.Tensor, factor: Optional[torch.Tensor]) -> torch.Tensor:
    return x if factor is None else x * factor


def token_frac(flags: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Fraction of the ``count`` response tokens where the 0/1 ``flags`` (0 on the padding) are 1 (summed in
    the count's dtype: a 16-bit sum would round counts above 256)."""
    return (flags.sum(dtype=count.dtype) / count).detach()


def token_mean(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean over the ``count`` response tokens of ``x``, 0 on the padding."""
    return (x.detach().sum() / count).detach()


def check_bounds(loss: str, low, high, *, low_optional: bool = False, below_one: bool = True):
    """Check a clip range given as ``clip_ratio_low`` (in ``[0, 1)``, or ``[0, inf)`` for a log-space bound;
    None allowed with ``low_optional``) and ``clip_ratio_high`` (``>= 0``)."""
    if low is None and not low_optional:
        raise ValueError(f"{loss}: clip_ratio_low is required")
    if low is not None and not (0 <= low < 1 if below_one else low >= 0):
        raise ValueError(f"{loss}: clip_ratio_low must be in {'[0, 1)' if below_one else '[0, inf)'}, got {low!r}")
    if high is None or not high >= 0:
        raise ValueError(f"{loss}: clip_ratio_high must be >= 0, got {high!r}")


def check_positive(loss: str, **values):
    """Check that each named option is a finite number > 0."""
    for key, value in values.items():
        if value is None or not value > 0 or not math.isfinite(value):
            raise ValueError(f"{loss}: {key} must be a finite number > 0, got {value!r}")


__all__ = ["Metrics", "check_bounds", "check_positive", "clamped_log_ratio", "prepare_inputs", "times_flag",
           "token_frac", "token_mean"]
