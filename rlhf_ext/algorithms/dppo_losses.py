"""DPPO (arXiv 2602.04879): the trust region is on the probability of the sampled token, not on the
importance ratio, measured as the total-variation difference ``pi - pi_old`` (``dppo_tv``) or as the
binary KL between ``Bern(pi_old)`` and ``Bern(pi)`` (``dppo_kl``); a truncated, stop-gradient ratio
weights the tokens inside the region.

Convention, padding and cost: :mod:`.ratio_common`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .float_flags import flag
from .linearised import with_derivative
from .metric_requests import metric_wanted
from .ppo_losses import zero_padded_mean
from .ratio_common import Metrics, check_positive, prepare_inputs, token_frac
from .registry import register_policy_loss


def _dppo(name, log_probs, old_log_probs, advantages, mask, low, high, clip_ratio_c, log_ratio_clip):
    if high is None:
        high = low
    check_positive(name, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_ratio_c)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():  # the weight and the region are detached: value and derivative are -A w valid
        lp_d = lp.detach()
        raw = lp_d - old
        log_ratio = raw if log_ratio_clip is None else raw.clamp(-log_ratio_clip, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(max=clip_ratio_c)
        prob, old_prob = torch.exp(lp_d), torch.exp(old)
        positive = flag(torch.gt, adv, 0.0)
        if name == "dppo_tv":
            diff = prob - old_prob
            inside_pos, inside_neg = flag(torch.le, diff, high), flag(torch.ge, diff, -low)
        else:
            # binary KL between Bernoulli(old_prob) and Bernoulli(prob); 1e-8 as verl
            # verl's old_prob (old - lp) + (1 - old_prob) log(...), with old - lp = -raw: negation, and adding a
            # negated term as a subtraction, are exact. The same operations in the same order, written in place
            # into the first temporary (a product commutes exactly): the same bits, fewer allocations.
            old_rest = 1 - old_prob
            bkl = (old_rest + 1e-8).div_((1.0 - prob).add_(1e-8)).log_().mul_(old_rest)
            bkl.sub_(torch.mul(old_prob, raw, out=old_rest))
            # "or" of 0/1 flags: their maximum
            inside_pos = flag(torch.le, bkl, high)
            torch.maximum(inside_pos, flag(torch.le, prob, old_prob), out=inside_pos)
            inside_neg = flag(torch.le, bkl, low)
            torch.maximum(inside_neg, flag(torch.ge, prob, old_prob), out=inside_neg)
        # the A > 0 region where A > 0, else the A <= 0 one: neg + pos (pos - neg), exact on 0/1 values (each
        # step is in {-1, 0, 1}), as torch.where picks
        valid = inside_pos.sub_(inside_neg).mul_(positive).add_(inside_neg)
        # -(A w valid): negation commutes with rounding, so this equals (-A) w valid bit for bit
        coef = torch.mul(adv, weight).mul_(valid).neg_()
    loss = with_derivative(coef, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("clip_frac_high") or metric_wanted("clip_frac_low"):
        # outside the region; 0 on the padding, where pi = pi_old = 1 and A = 0 lie inside the A <= 0 region
        outside = 1.0 - valid
        high_out = outside * positive
        if metric_wanted("clip_frac_high"):
            metrics["clip_frac_high"] = token_frac(high_out, count)
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = token_frac(outside.sub_(high_out), count)
    if metric_wanted("is_trunc_frac"):
        metrics["is_trunc_frac"] = token_frac((flag(torch.gt, ratio, clip_ratio_c) * valid).mul_(m), count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see prepare_inputs)


def _dppo_loss(name: str, doc: str):
    """The registered loss ``name`` (``dppo_tv`` / ``dppo_kl``): :func:`_dppo` with that region, behind the
    options both take (one signature for both: they differ only in the region)."""

    def loss(
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: Optional[float] = None,
        clip_ratio_c: float = 20.0,
        log_ratio_clip: Optional[float] = 20.0,
    ) -> Tuple[torch.Tensor, Metrics]:
        return _dppo(name, log_probs, old_log_probs, advantages, mask, clip_ratio_low, clip_ratio_high,
                     clip_ratio_c, log_ratio_clip)

    loss.__name__ = loss.__qualname__ = name
    loss.__doc__ = doc
    return register_policy_loss(name)(loss)


dppo_tv = _dppo_loss("dppo_tv", """DPPO-Binary-TV (arXiv 2602.04879): the trust region is on the
    probability difference ``pi - pi_old`` of the sampled token, not on the ratio (a ratio bound is
    loose for rare tokens and tight for likely ones).

    ``L = -A sg(min(rho, clip_ratio_c)) log pi`` on tokens inside the region, 0 outside: for
    ``A > 0`` a token counts while ``pi - pi_old <= clip_ratio_high``, for ``A <= 0`` while
    ``pi - pi_old >= -clip_ratio_low``. The truncated, detached ratio (TIS) replaces dual clip;
    the paper (Sec. 5.4) recommends a large cap: ``clip_ratio_c`` defaults to 20 (verl's code
    default when the key is absent; verl's ActorConfig sets 3.0 and the verl host passes it).
    Value ``-A sg(w) valid`` (see :mod:`.ratio_common`), gradient = verl's
    ``compute_policy_loss_dppo_tv``'s. ``clip_ratio_high`` defaults to ``clip_ratio_low``.

    Metrics: ``clip_frac_high`` / ``clip_frac_low`` (outside the region, ``A > 0`` / ``A <= 0``; their
    sum is verl's ``pg_clipfrac``), ``is_trunc_frac`` (verl's ``pg_clipfrac_lower``), ``ppo_kl``.
    """)


dppo_kl = _dppo_loss("dppo_kl", """DPPO-Binary-KL (arXiv 2602.04879): as :func:`dppo_tv`, with the
    region on the binary KL ``KL(Bern(pi_old) || Bern(pi)) = pi_old log(pi_old / pi) + (1 - pi_old)
    log((1 - pi_old) / (1 - pi))`` of the sampled token.

    A token with ``A > 0`` counts while that KL is ``<= clip_ratio_high`` or ``pi <= pi_old``
    (moving back is always allowed); with ``A <= 0`` while it is ``<= clip_ratio_low`` or
    ``pi >= pi_old``. Same truncated IS weight, options and metrics as :func:`dppo_tv`; gradient =
    verl's ``compute_policy_loss_dppo_kl``'s.
    """)


__all__ = ["dppo_kl", "dppo_tv"]
