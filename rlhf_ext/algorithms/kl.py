"""Per-token estimators of KL(pi || pi_ref) from samples of pi, and KL clipping.

Schulman, "Approximating KL Divergence" (2020, joschu.net/blog/kl-approx.html), with
``lr = log pi - log pi_ref`` per token:

* k1 = ``lr`` (unbiased, high variance, can be negative);
* k2 = ``lr^2 / 2`` (biased, low variance);
* k3 = ``exp(-lr) - 1 + lr`` (unbiased, low variance, always >= 0).

Frameworks clamp differently: OpenRLHF clamps every estimator to [-10, 10], verl and
MindSpeed-RL clamp the log ratio to [-20, 20] and k3 to [-10, 10], TRL does not clamp.
:func:`kl_estimate` makes both clamps explicit and reports how often they bind.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .checks import check_finite
from .registry import get_kl_estimator, register_kl_estimator


def _shapes(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> None:
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"shape mismatch: log_probs {tuple(log_probs.shape)} vs ref_log_probs {tuple(ref_log_probs.shape)}"
        )


@register_kl_estimator("k1")
def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``k1 = log pi - log pi_ref``."""
    _shapes(log_probs, ref_log_probs)
    return log_probs - ref_log_probs


@register_kl_estimator("k2")
def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``k2 = (log pi - log pi_ref)^2 / 2``."""
    _shapes(log_probs, ref_log_probs)
    return 0.5 * (log_probs - ref_log_probs) ** 2


@register_kl_estimator("k3")
def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``k3 = exp(-lr) - 1 + lr`` with ``lr = log pi - log pi_ref`` ("low_var_kl" in verl)."""
    _shapes(log_probs, ref_log_probs)
    lr = log_probs - ref_log_probs
    return torch.exp(-lr) - 1.0 + lr


@register_kl_estimator("abs")
def abs_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """``|log pi - log pi_ref|`` (verl's and MindSpeed-RL's ``abs``): ``|k1|``, >= 0, biased."""
    _shapes(log_probs, ref_log_probs)
    return (log_probs - ref_log_probs).abs()


@register_kl_estimator("k3+")
def k3_plus(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3's value with k2's gradient (verl's ``k3+``, ``core_algos.kl_penalty``), for KL as a loss.

    The expectation of k3 is KL(pi || pi_ref) but the expectation of its gradient is not the
    gradient of KL; k2's is (``E[lr grad log pi] = grad KL`` for on-policy samples). Straight
    through: ``k2 - k2.detach() + k3.detach()``. verl clamps the k3 value first (log ratio to
    +-20, value to [-10, 10]); :func:`kl_estimate` applies such clamps explicitly, to the value only.
    """
    _shapes(log_probs, ref_log_probs)
    backward = 0.5 * (log_probs - ref_log_probs).square()
    return backward - backward.detach() + k3(log_probs, ref_log_probs).detach()


k3_plus.gradient_of = k2  # kl_estimate: its clamps bound k3's value, the gradient stays k2's


def k3_bias_corrected(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 weighted by the importance ratio ``pi / pi_old`` (DeepSeek-V3.2, arXiv 2512.02556, Eq. for
    the unbiased KL estimate; TRL 1.16's ``use_bias_correction_kl``), for KL as a loss on samples
    drawn from ``pi_old``.

    ``KL_t = (pi / pi_old) * (pi_ref / pi - log(pi_ref / pi) - 1)``; the ratio is not detached (as
    in TRL), so its gradient is the unbiased gradient of KL(pi || pi_ref) when tokens come from
    ``pi_old``. With ``old_log_probs == log_probs.detach()`` the value is k3.
    """
    _shapes(log_probs, ref_log_probs)
    _shapes(log_probs, old_log_probs)
    return k3(log_probs, ref_log_probs) * torch.exp(log_probs - old_log_probs)


def parse_kl_clip(value, *, setting: str = "KL clip", form: str = "(lo, hi)", bounds: Tuple[str, str] = ("lo", "hi"),
                  split_text: bool = False) -> Optional[Tuple[float, float]]:
    """The one rule for a KL value-clamp setting, whichever host it comes from.

    ``None``, ``"none"`` (any case) or ``["none"]`` -> None (no clamp); two numbers (or numeric
    strings) with lo < hi -> ``(lo, hi)``. A string is one value unless ``split_text`` (an
    environment variable such as ``"-5,5"`` or ``"-5 5"``). A bad value raises ``ValueError``
    naming ``setting`` in the words its documentation uses (``form``: how to write it,
    ``bounds``: what the two numbers are called there).
    """
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == "none":
            return None
        parts = value.replace(",", " ").split() if split_text else [value]
        shown = repr(value)
    else:
        try:
            parts = list(value)
        except TypeError:
            raise ValueError(f"{setting} must be a pair {form} or 'none', got {value!r}") from None
        if len(parts) == 1 and str(parts[0]).strip().lower() == "none":
            return None
        shown = repr(" ".join(map(str, parts)))
    if len(parts) != 2:
        raise ValueError(f"{setting} must be a pair {form} or 'none', got {shown}")
    try:
        lo, hi = float(parts[0]), float(parts[1])
    except (TypeError, ValueError):
        raise ValueError(f"{setting} must be two numbers {form} or 'none', got {shown}") from None
    if not lo < hi:  # NaN fails this too
        raise ValueError(f"{setting} needs {bounds[0]} < {bounds[1]}, got {shown}")
    return lo, hi


def _check_clip(clip) -> Optional[Tuple[float, float]]:
    return parse_kl_clip(clip)


def kl_estimate(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    estimator: str = "k3",
    clip: Optional[Tuple[float, float]] = (-10.0, 10.0),
    log_ratio_clip: Optional[float] = 20.0,
    mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """KL per token with explicit clamps: ``clip(estimator(clamp(lr, +-log_ratio_clip)), lo, hi)``.

    ``clip=None`` (or ``"none"``) disables the value clamp; the default ``(-10, 10)`` matches
    OpenRLHF. ``log_ratio_clip`` bounds the log ratio before the estimator so k3's ``exp`` cannot
    overflow. Metrics (over ``mask`` when given, else every token): ``kl_clip_frac`` (fraction
    of tokens whose KL was clamped) and ``kl_log_ratio_clip_frac``.
    """
    fn = get_kl_estimator(estimator)
    _shapes(log_probs, ref_log_probs)
    bounds = _check_clip(clip)
    if log_ratio_clip is not None and not log_ratio_clip > 0:
        raise ValueError(f"log_ratio_clip must be > 0 or None, got {log_ratio_clip!r}")
    if mask is not None and mask.shape != log_probs.shape:
        raise ValueError(f"shape mismatch: mask {tuple(mask.shape)} vs log_probs {tuple(log_probs.shape)}")
    check_finite(log_probs.detach(), "log_probs", mask)
    check_finite(ref_log_probs.detach(), "ref_log_probs", mask)

    lr = log_probs - ref_log_probs
    lr_clipped = lr if log_ratio_clip is None else lr.clamp(-log_ratio_clip, log_ratio_clip)
    if log_ratio_clip is None:
        kl = fn(log_probs, ref_log_probs)
    else:
        # Re-express the clamped log ratio as a pair of log-probs so any registered estimator applies.
        kl = fn(ref_log_probs + lr_clipped, ref_log_probs)
    surrogate = getattr(fn, "gradient_of", None)
    if surrogate is not None:
        # A straight-through estimator (k3+): both clamps bound the value only; the gradient is the
        # surrogate's on the unclamped log ratio, as verl computes it. Adding the zero-valued
        # surrogate term (not subtracting the clamped difference) avoids float cancellation.
        grad_term = surrogate(log_probs, ref_log_probs)
        value = kl.detach() if bounds is None else kl.detach().clamp(bounds[0], bounds[1])
        kl_clipped = value + (grad_term - grad_term.detach())
    elif bounds is None:
        kl_clipped = kl
    else:
        kl_clipped = kl.clamp(bounds[0], bounds[1])

    weight = torch.ones_like(kl) if mask is None else mask.to(kl.dtype)
    denom = weight.sum().clamp(min=1.0)

    def frac(changed: torch.Tensor) -> torch.Tensor:
        return ((changed.to(kl.dtype) * weight).sum() / denom).detach()

    metrics = {
        "kl_clip_frac": frac(kl_clipped != kl),
        "kl_log_ratio_clip_frac": frac(lr_clipped != lr),
    }
    return kl_clipped, metrics
