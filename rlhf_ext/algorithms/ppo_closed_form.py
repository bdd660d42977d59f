""":func:`.ppo_losses.ppo` without autograd through its formula: the value from the same operations, the
gradient from a closed form that multiplies in the order autograd does, so both are bit for bit those of
the autograd version (``tests/test_stepcost_staleness_fast_paths.py`` compares them with ``torch.equal``).

Why: under the decoupled objective (``--rlhf_ext.decoupled_loss``), verl's ``bypass_mode`` and any rlhf_ext
rollout correction, OpenRLHF's ``ppo`` runs as rlhf_ext's; autograd through ``-min(r A, clip(r) A)`` runs a
backward node per operation (the ``minimum`` backward alone is two ``where`` passes and a comparison), which
made those rows 1.4-2x OpenRLHF's own loss (docs/benchmarks.md, issue 42).

The derivative autograd computes, traced through PyTorch's backward formulas (``derivatives.yaml``), for the
per-token loss ``where(mask, -min(a, b), 0)`` with ``a = min(r, delta) A``, ``b = clamp(r, 1 - low, 1 + high) A``,
``r = exp(clamp(l, +-c))``, ``l = log pi - log pi_old`` and upstream gradient ``g``:

* ``where`` and the dual clip's ``where`` pass ``g`` or 0; ``neg`` gives ``gm = -g``;
* ``minimum`` gives ``gm`` to the smaller branch, ``gm / 2`` to each on a tie, 0 to the larger; each branch
  multiplies by ``A`` and passes its clamp (``delta``'s, the clip's) or not;
* the two branches add at ``r``: ``(gm s_a A) f_a + (gm s_b A) f_b`` with ``s`` in {0, 1/2, 1} and ``f`` in
  {0, 1}. Since products with 0, 1/2 and 1 are exact (barring subnormals) and a sum of two equal halves is
  the whole, this equals ``gm (A w)`` with ``w = s_a f_a + s_b f_b`` in {0, 1/2, 1};
* ``exp`` multiplies by ``r``, the log-ratio clamp passes or not, ``sub`` passes to ``log pi``.

So ``d loss / d log pi = ((-g) (A w f)) r`` with ``f`` the product of the 0/1 factors (mask, not dual-clipped,
log-ratio in range), and since negation commutes with rounding this is ``-((g (A w f)) r)``, which the
backward computes in that order. Inside the clip range (the usual token) ``a == b``: a tie, ``w = 1``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .float_flags import flag, float_mask
from .metric_requests import metric_wanted

Metrics = Dict[str, torch.Tensor]


class _AttachGradient(torch.autograd.Function):
    """``value`` forward (computed without a graph); ``-((g * slope) * ratio)`` as ``log_probs``' gradient."""

    @staticmethod
    def forward(ctx, log_probs, value, slope, ratio):  # noqa: D102
        ctx.save_for_backward(slope, ratio)
        return value

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        slope, ratio = ctx.saved_tensors
        return torch.mul(grad, slope).mul_(ratio).neg_(), None, None, None


def fast_path_applies(log_probs, old_log_probs, advantages) -> bool:
    """The closed form covers one dtype throughout and a gradient for ``log_probs`` only (the hosts' case)."""
    return (log_probs.dtype == old_log_probs.dtype == advantages.dtype and log_probs.is_floating_point()
            and not old_log_probs.requires_grad and not advantages.requires_grad)


def ppo_closed_form(log_probs, old_log_probs, advantages, maskb, *, low: float, high: float,
                    dual_clip: Optional[float], log_ratio_clip: Optional[float],
                    delta: Optional[float]) -> Tuple[torch.Tensor, Metrics]:
    """:func:`.ppo_losses.ppo` on inputs checked and finite everywhere (padding included), same dtype."""
    with torch.no_grad():
        m = float_mask(maskb, log_probs.dtype)
        raw = log_probs.detach() - old_log_probs
        log_ratio = raw if log_ratio_clip is None else raw.clamp(-log_ratio_clip, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        capped = ratio if delta is None else ratio.clamp(max=delta)
        clipped_ratio = ratio.clamp(1.0 - low, 1.0 + high)
        surr = capped * advantages
        surr_clipped = clipped_ratio * advantages
        loss = -torch.min(surr, surr_clipped)
        # minimum's share of the gradient for the unclipped branch: 1 if smaller, 1/2 on a tie, else 0
        share = flag(torch.lt, surr, surr_clipped).add_(flag(torch.eq, surr, surr_clipped), alpha=0.5)
        in_clip = flag(torch.eq, clipped_ratio, ratio)  # the clip's clamp passes (ties included, NaN not)
        if delta is None:
            # s_a + (1 - s_a) f_b: 1 where the clip passes (then surr == surr_clipped, s_a = 1/2), else s_a
            w = torch.maximum(share, in_clip, out=share)
        else:
            w = (share * flag(torch.le, ratio, delta)).add_((1.0 - share).mul_(in_clip))
        factor = m
        metrics: Metrics = {}
        if dual_clip is not None:
            dual_bound = -dual_clip * advantages
            dual_active = flag(torch.lt, advantages, 0.0).mul_(flag(torch.gt, loss, dual_bound))
            loss = torch.where(dual_active.bool(), dual_bound, loss)
            factor = m * (1.0 - dual_active)
        if log_ratio_clip is not None:
            factor = factor * flag(torch.eq, log_ratio, raw)  # the log-ratio clamp passes
        value = loss * m
        slope = w.mul_(advantages).mul_(factor)
        count = maskb.sum()
        if metric_wanted("clip_frac_low"):  # the tokens in the mask: m folded into the advantage's sign flag
            metrics["clip_frac_low"] = _frac(flag(torch.lt, ratio, 1.0 - low), flag(torch.lt, advantages, 0.0).mul_(m),
                                             count)
        if metric_wanted("clip_frac_high"):
            metrics["clip_frac_high"] = _frac(flag(torch.gt, ratio, 1.0 + high),
                                              flag(torch.gt, advantages, 0.0).mul_(m), count)
        if delta is not None and metric_wanted("delta_clip_frac"):
            metrics["delta_clip_frac"] = _frac(flag(torch.gt, ratio, delta), m, count)
        if dual_clip is not None and metric_wanted("dual_clip_frac"):
            metrics["dual_clip_frac"] = _frac(dual_active, m, count)
        if metric_wanted("ppo_kl"):
            # sum(where(mask, -l, 0)) is -sum(l m): the same terms (zeros aside), rounding symmetric in sign
            metrics["ppo_kl"] = -(log_ratio * m).sum() / count
        if metric_wanted("ratio_mean"):
            metrics["ratio_mean"] = (ratio * m).sum() / count
    if torch.is_grad_enabled() and log_probs.requires_grad:
        value = _AttachGradient.apply(log_probs, value, slope, ratio)
    return value, metrics


def _frac(flags: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``_masked_mean(flag.float(), mask)``'s value: the number of tokens where both 0/1 tensors are 1 (a float32
    or float64 dot product of 0/1 values: exact below 2^24, as the boolean's float32 sum), over the integer token
    count, as float32."""
    if flags.dtype in (torch.float32, torch.float64):
        both = torch.dot(flags.reshape(-1), m.reshape(-1)).to(torch.float32)
    else:
        both = flags.mul_(m).sum(dtype=torch.float32)
    return both / count
