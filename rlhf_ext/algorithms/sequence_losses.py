"""Policy losses on one importance ratio per sequence: GMPO (geometric mean of the clipped token ratios;
verl's ``geo_mean``), LUSPO (GSPO's loss scaled by the sequence length) and VESPO (a Gamma-shaped,
stop-gradient weight of the product of the token ratios). GSPO itself is in :mod:`.ppo_losses`.

Convention, padding and cost: :mod:`.ratio_common`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .float_flags import flag
from .linearised import with_derivative
from .loss_options import check_clip_range
from .metric_requests import metric_wanted
from .ppo_losses import zero_padded_mean
from .ratio_caps import check_caps
from .ratio_common import Metrics, check_bounds, check_positive, prepare_inputs, token_frac, token_mean
from .registry import register_policy_loss


@register_policy_loss("gmpo")
@register_policy_loss("geo_mean")
def gmpo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """GMPO: geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673); verl's
    ``geo_mean`` (also registered under that name).

    Per sequence, ``L_i = -A_i exp(mean_t l_t)`` with the token log-ratio clipped in log space,
    pessimistically as PPO: ``l_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -clip_ratio_low,
    clip_ratio_high))``, ``d_t = log pi_t - log pi_old_t``; ``A_i`` is the mean advantage of the
    sequence (outcome advantages). The geometric mean is less sensitive to one outlier ratio than
    GRPO's arithmetic mean. Clip bounds are log-ratios: the paper's ``(e^-0.4, e^0.4)`` is
    ``clip_ratio_low = clip_ratio_high = 0.4``.

    Token form (as :func:`.ppo_losses.gspo`): every token carries
    ``-A_i exp(sg(mean l) + l_t - sg(l_t))``, whose value is ``L_i``; reduced with
    ``seq-mean-token-mean`` the value and gradient are the sequence objective's (verl's
    ``compute_policy_loss_geo_mean``, which ignores the mode and averages over sequences). Other
    modes weight the sequences by length. ``log_ratio_clip`` bounds ``d_t`` first (verl: none) so a
    huge ratio with ``A < 0`` cannot overflow.

    Metrics: ``clip_frac_high`` (``d_t`` clipped, ``A > 0``), ``clip_frac_low`` (clipped, ``A < 0``),
    ``ppo_kl``, ``seq_ratio_mean``.
    """
    check_bounds("gmpo", clip_ratio_low, clip_ratio_high, below_one=False)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        raw = lp.detach() - old
        d = raw if log_ratio_clip is None else raw.clamp(-log_ratio_clip, log_ratio_clip)
        sgn = torch.sign(adv)
        d_clamped = d.clamp(-clip_ratio_low, clip_ratio_high)
        l_tok = sgn * torch.min(sgn * d, sgn * d_clamped)
        lengths = m.sum(dim=1, keepdim=True)
        # l_tok is exactly 0 on the padding (zeroed inputs: d = 0, sgn = 0), so no mask before the sum
        seq_log_ratio = l_tok.sum(dim=1, keepdim=True) / lengths
        seq_adv = adv.sum(dim=1, keepdim=True) / lengths
        seq_loss = -seq_adv * torch.exp(seq_log_ratio)  # [B, 1]: -A_i exp(mean_t l_t)
        # d l_t / d log pi_t is 1 where the min kept the unclipped log-ratio and the outer clip did not bind,
        # i.e. where l_t equals the raw log-ratio (ties included: the clip is then inactive), and A_t != 0
        # (sgn = 0 makes l_t constant); l_t never equals a raw log-ratio beyond the outer clip
        keeps_grad = flag(torch.eq, l_tok, raw) * sgn.abs()
    # token form: every token carries -A_i exp(sg(mean l) + l_t - sg(l_t)), value -A_i exp(mean l) (0 on the
    # padding: the 0/1 mask), derivative -A_i exp(mean l) dl_t/dlog pi_t
    loss = with_derivative(seq_loss * m, lp, seq_loss * keeps_grad)
    metrics: Metrics = {}
    if metric_wanted("clip_frac_high") or metric_wanted("clip_frac_low"):
        clipped = flag(torch.ne, d, d_clamped)  # 0 on the padding (d = 0 there)
        if metric_wanted("clip_frac_high"):
            metrics["clip_frac_high"] = token_frac(clipped * flag(torch.gt, adv, 0.0), count)
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = token_frac(clipped * flag(torch.lt, adv, 0.0), count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(d, count, negate=True)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = torch.exp(seq_log_ratio).mean()
    return loss, metrics


@register_policy_loss("luspo")
def luspo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: Optional[float] = 4e-4,
    log_ratio_clip: Optional[float] = 10.0,
    dual_clip: Optional[float] = None,
    delta: Optional[float] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """LUSPO: length-unbiased sequence policy optimisation (arXiv 2602.05261; TRL 1.16
    ``loss_type="luspo"``).

    GSPO (:func:`.ppo_losses.gspo`, sequence ratio ``s_i``, clip ``clip_ratio_low`` /
    ``clip_ratio_high``) with each sequence's loss multiplied by its length ``|y_i|``: GSPO's
    per-sequence mean gives a long answer's tokens less weight each, a bias against long
    correct answers that the scaling removes. The per-token loss is ``|y_i|`` times GSPO's, so
    reduced with ``seq-mean-token-mean`` (GSPO's mode) it is TRL's
    ``(1/B) sum_i |y_i| L_i``, value and gradient. (Plain ``gspo`` with ``seq-mean-token-sum``
    is the same objective.) ``dual_clip`` / ``delta`` cap ``s_i`` as in GSPO (:mod:`.ratio_caps`; TRL 1.16's
    luspo applies ``delta``).

    Metrics: GSPO's (``clip_frac_low``, ``clip_frac_high``, ``seq_ratio_mean``, ``ppo_kl``; ``dual_clip_frac`` /
    ``delta_clip_frac`` with the caps).
    """
    clip_ratio_high = check_clip_range(clip_ratio_low, clip_ratio_high, "gspo")  # gspo's checks and messages
    check_caps("luspo", dual_clip, delta)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        # gspo's sequence ratio s_i = exp(clip(mean_t log rho_t)) ([B, 1]: the value of every token's s)
        token_log_ratio = lp.detach() - old  # 0 on the padding
        lengths = m.sum(dim=1, keepdim=True)
        seq_log_ratio = token_log_ratio.sum(dim=1, keepdim=True) / lengths
        if log_ratio_clip is not None:
            seq_log_ratio = seq_log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
        s = torch.exp(seq_log_ratio)
        surr = (s if delta is None else s.clamp(max=delta)) * adv
        surr_clipped = s.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * adv
        value = -torch.minimum(surr, surr_clipped)
        # token form s_it = exp(log pi_t - sg(log pi_t) + sg(log s_i)): d s_it / d log pi_t = s_i; the min keeps
        # the unclipped branch where surr <= surr_clipped (ties: the clip is inactive); times |y_i|
        coef = (-adv * s).mul_(flag(torch.le, surr, surr_clipped))
        if delta is not None:  # beyond delta the unclipped branch is the constant delta * A
            coef.mul_(flag(torch.le, s, delta))
        if dual_clip is not None:  # A < 0 capped at -c A (constant: no gradient)
            cap = -dual_clip * adv
            dual_active = flag(torch.lt, adv, 0.0) * flag(torch.gt, value, cap)
            value = torch.where(dual_active.bool(), cap, value)
            coef.mul_(1.0 - dual_active)
        value = value * lengths
        coef.mul_(lengths)
    loss = with_derivative(value, lp, coef)  # gspo's loss is 0 on the padding (A = 0), so is its multiple
    metrics: Metrics = {}
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = token_frac(flag(torch.lt, adv, 0.0) * flag(torch.lt, s, 1.0 - clip_ratio_low), count)
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = token_frac(flag(torch.gt, adv, 0.0) * flag(torch.gt, s, 1.0 + clip_ratio_high),
                                               count)
    if dual_clip is not None:
        metrics["dual_clip_frac"] = token_frac(dual_active * m, count)
    if delta is not None:
        metrics["delta_clip_frac"] = token_frac(flag(torch.gt, s, delta) * m, count)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = s.mean()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(token_log_ratio, count, negate=True)
    return loss, metrics


@register_policy_loss("vespo")
def vespo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> Tuple[torch.Tensor, Metrics]:
    """VESPO: variational sequence-level soft policy optimisation (arXiv 2602.10693; TRL 1.16
    ``loss_type="vespo"``, ``GRPOTrainer.get_gamma_weights``).

    A smooth Gamma-shaped weight of the sequence IS ratio ``w_i = prod_t rho_t`` (the product, not
    GSPO's geometric mean) replaces clipping: ``phi(w) = e^lambda w^k e^(-lambda w)`` (``phi(1) =
    1``, maximal at ``w = k / lambda``, vanishing for ``w -> 0`` and ``w -> inf``), detached;
    ``L = -phi(w_i) A log pi``. ``k`` and ``lambda`` take the ``_pos`` values where ``A >= 0``, the
    ``_neg`` values otherwise (TRL's defaults 2 / 3 and 3 / 2). As TRL: token log-ratios clamped
    to +-20, ``log w`` to ``[log 1e-8, 20]``, ``lambda`` at least 1e-4, a non-finite ``phi`` is 0.
    Value ``-phi A`` (:mod:`.ratio_common`), gradient = TRL's; TRL reduces it as ``token-mean``.

    Options: TRL's names. Metrics: ``phi_mean`` (token-weighted), ``seq_ratio_mean``, ``ppo_kl``.
    """
    for key, value in (("vespo_k_pos", vespo_k_pos), ("vespo_k_neg", vespo_k_neg)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"vespo: {key} must be a finite number >= 0, got {value!r}")
    check_positive("vespo", vespo_lambda_pos=vespo_lambda_pos, vespo_lambda_neg=vespo_lambda_neg)
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        log_ratio = (lp.detach() - old).clamp(-20.0, 20.0)  # 0 on the padding: no mask before the sum
        log_w = log_ratio.sum(dim=1, keepdim=True).clamp(math.log(1e-8), 20.0)
        w = torch.exp(log_w)
        nonneg = flag(torch.ge, adv, 0.0)
        neg = 1.0 - nonneg
        # the _pos value where A >= 0, else the _neg one: 1 * x + 0 * y is exact, as torch.where picks
        k = (nonneg * vespo_k_pos).add_(neg, alpha=vespo_k_neg)
        lam = (nonneg * vespo_lambda_pos).add_(neg, alpha=vespo_lambda_neg).clamp_(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * w).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        coef = -phi * adv
    loss = with_derivative(coef, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("phi_mean"):
        metrics["phi_mean"] = token_mean(phi * m, count)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = w.mean()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see prepare_inputs)


__all__ = ["gmpo", "luspo", "vespo"]
