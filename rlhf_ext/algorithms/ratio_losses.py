"""Policy losses that change how the importance ratio enters the gradient: CISPO (clipped,
stop-gradient IS weight), SAPO (soft sigmoid gate), GMPO (geometric mean of token ratios),
Clip-Cov / KL-Cov (covariance-selected tokens), DPPO (trust region on the probability, TV or
binary KL), LUSPO (length-scaled GSPO) and VESPO (Gamma-shaped sequence weight).

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
from typing import Dict, Optional, Tuple

import torch

from .checks import check_token_inputs_finite
from .float_flags import flag, float_mask
from .linearised import with_derivative
from .metric_requests import metric_wanted
from .loss_options import accepts_old_clip_names, check_clip_range
from .ppo_losses import zero_padded_mean
from .registry import register_policy_loss

Metrics = Dict[str, torch.Tensor]


def _prepare(log_probs, old_log_probs, advantages, mask):
    """Check the inputs and zero them on the padding; returns the boolean mask, the zeroed
    log-probs (with their graph), old log-probs and advantages (detached), the 0/1 float mask and the
    token count (float32, or float64 for float64 inputs). A loss whose every term carries the (zeroed) advantage as a factor, the others
    finite there, is then 0 on the padding without another mask; its gradient there is 0 through the
    zeroing of ``log_probs``.

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


def _log_ratio(lp, old, log_ratio_clip, in_range: bool = True):
    """``(log_ratio, in_range)``: ``log pi - log pi_old`` (detached) clamped to ``+-log_ratio_clip``, and the
    derivative of the clamp (1 inside, ties included as autograd's ``clamp``; 0 outside) as a 0/1 float,
    or ``None`` without a clip or when not asked for (``in_range=False``)."""
    log_ratio = lp.detach() - old
    if log_ratio_clip is None:
        return log_ratio, None
    clamped = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    # |x| <= c exactly where the clamp left x as it was (NaN: neither), without computing |x|
    return clamped, (flag(torch.eq, clamped, log_ratio) if in_range else None)


def _times(x: torch.Tensor, factor: Optional[torch.Tensor]) -> torch.Tensor:
    return x if factor is None else x * factor


def _frac(flags: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Fraction of the ``count`` response tokens where the 0/1 ``flags`` (0 on the padding) are 1 (summed in
    the count's dtype: a 16-bit sum would round counts above 256)."""
    return (flags.sum(dtype=count.dtype) / count).detach()


def _mean(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean over the ``count`` response tokens of ``x``, 0 on the padding."""
    return (x.detach().sum() / count).detach()


def _bounds(loss: str, low, high, *, low_optional: bool = False, below_one: bool = True):
    if low is None and not low_optional:
        raise ValueError(f"{loss}: clip_ratio_low is required")
    if low is not None and not (0 <= low < 1 if below_one else low >= 0):
        raise ValueError(f"{loss}: clip_ratio_low must be in {'[0, 1)' if below_one else '[0, inf)'}, got {low!r}")
    if high is None or not high >= 0:
        raise ValueError(f"{loss}: clip_ratio_high must be >= 0, got {high!r}")


def _positive(loss: str, **values):
    for key, value in values.items():
        if value is None or not value > 0 or not math.isfinite(value):
            raise ValueError(f"{loss}: {key} must be a finite number > 0, got {value!r}")


@register_policy_loss("cispo")
@accepts_old_clip_names
def cispo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: Optional[float] = None,
    clip_ratio_high: float = 4.0,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """CISPO: clipped IS-weight policy optimisation (MiniMax-M1, arXiv 2506.13585).

    ``L = -sg(clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)) A log pi``: the importance
    weight is clipped and detached, the gradient always flows through ``log pi``, so no token is
    dropped (PPO's clip zeroes the gradient of clipped tokens). Written ``-sg(clip(rho)) A exp(log pi -
    sg(log pi))`` (module docstring), the value is ``-sg(clip(rho)) A``, the gradient is verl's
    ``compute_policy_loss_cispo``'s.

    Options (verl keys): ``clip_ratio_low`` (None: no lower bound, as MiniMax-M1), ``clip_ratio_high``
    (default 4: weights capped at 5, ScaleRL's / TRL's ``epsilon_high=5.0`` for cispo, which TRL
    uses as the cap itself). ``log_ratio_clip`` bounds ``log rho`` before ``exp`` (verl: 20).

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` (weight clipped at either bound, whatever the
    sign of A), ``ppo_kl``, ``ratio_mean``.
    """
    _bounds("cispo", clip_ratio_low, clip_ratio_high, low_optional=True)
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
    lower = None if clip_ratio_low is None else 1.0 - clip_ratio_low
    with torch.no_grad():  # the weight is detached: value and derivative are -w A
        log_ratio, _ = _log_ratio(lp, old, log_ratio_clip, in_range=False)
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(min=lower, max=1.0 + clip_ratio_high)
        coef = -weight * adv
    loss = with_derivative(coef, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = (_frac(flag(torch.lt, ratio, lower) * m, count) if lower is not None
                                    else count.new_zeros(()))
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _frac(flag(torch.gt, ratio, 1.0 + clip_ratio_high) * m, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = _mean(ratio * m, count)
    return loss, metrics  # 0 on the padding already (see _prepare)


@register_policy_loss("sapo")
def sapo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """SAPO: soft adaptive policy optimisation (Gao et al. 2025, arXiv 2511.20347).

    The hard clip is replaced by a sigmoid gate: ``L = -f_tau(rho) A`` with
    ``f_tau(r) = (4 / tau) sigmoid(tau (r - 1))``, ``tau = tau_pos`` where ``A > 0`` else
    ``tau_neg``. ``f'(1) = 1``: on-policy the gradient is the policy gradient; far from 1 the gate
    flattens, so the update fades smoothly instead of being cut. ``tau_neg > tau_pos`` damps
    negative updates faster (the paper's asymmetry; defaults 1.0 / 1.05 as verl and TRL).

    Aggregation: verl's ``compute_policy_loss_sapo`` and TRL always reduce with
    ``seq-mean-token-mean`` (the paper's), whatever mode is configured. Here the per-token loss is
    reduced with the configured mode like every other loss; choose ``seq-mean-token-mean`` for the
    paper's objective (on verl, ``rlhf_ext_sapo`` with that mode equals verl's ``sapo``).

    Options: ``tau_pos``, ``tau_neg`` (verl ``actor.tau_pos``/``tau_neg``; TRL
    ``sapo_temperature_pos/neg``), ``log_ratio_clip`` (verl: 20). Metrics: ``ppo_kl``,
    ``ratio_mean``, ``gate_mean`` (mean ``f'(rho) = 4 s (1 - s) rho``: 1 on-policy).
    """
    _positive("sapo", tau_pos=tau_pos, tau_neg=tau_neg)
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        log_ratio, in_range = _log_ratio(lp, old, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        positive = flag(torch.gt, adv, 0.0)
        # tau_pos where A > 0, else tau_neg: 1 * tau + 0 * tau' is exact, as torch.where would pick
        tau = (positive * tau_pos).add_(1.0 - positive, alpha=tau_neg)
        s = torch.sigmoid(tau * (ratio - 1.0))
        gate = s * tau.reciprocal().mul_(4.0)
        value = -gate * adv
        # d/dlog pi of -(4 / tau) sigmoid(tau (rho - 1)) A = -4 A s (1 - s) rho, times the clamp's derivative
        slope = (s * (1.0 - s)).mul_(ratio).mul_(4.0)
        coef = _times(-adv * slope, in_range)
    loss = with_derivative(value, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = _mean(ratio * m, count)
    if metric_wanted("gate_mean"):
        metrics["gate_mean"] = _mean(slope * m, count)
    return loss, metrics  # 0 on the padding already (see _prepare)


@register_policy_loss("gmpo")
@register_policy_loss("geo_mean")
@accepts_old_clip_names
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
    _bounds("gmpo", clip_ratio_low, clip_ratio_high, below_one=False)
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
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
            metrics["clip_frac_high"] = _frac(clipped * flag(torch.gt, adv, 0.0), count)
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = _frac(clipped * flag(torch.lt, adv, 0.0), count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(d, count, negate=True)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = torch.exp(seq_log_ratio).mean()
    return loss, metrics


def _select_random(candidates: torch.Tensor, count: int, generator: Optional[torch.Generator],
                   seed: Optional[int]) -> torch.Tensor:
    """Up to ``count`` of the true positions of the 1-D boolean ``candidates``, chosen at random: the
    positions in ascending order (row-major for a flattened ``[B, T]``, as ``nonzero`` of the 2-D mask
    lists them), a random permutation of that list, its first ``count``."""
    idx = torch.nonzero(candidates, as_tuple=True)[0]
    if len(idx) == 0:
        return idx
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    # on the CPU, as verl's own clip_cov draws it: the same seed picks the same tokens on any device
    perm = torch.randperm(len(idx), generator=generator) if generator is not None else torch.randperm(len(idx))
    return idx[perm[: min(count, len(idx))].to(idx.device)]


@register_policy_loss("clip_cov")
@accepts_old_clip_names
def clip_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: Optional[float] = None,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: Optional[torch.Generator] = None,
    seed: Optional[int] = None,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    PPO's clipped surrogate (``clip_ratio_low`` / ``clip_ratio_high``, high defaults to low), and
    among the tokens PPO did not clip, those whose centred covariance
    ``cov_t = (A_t - mean A) (log pi_t - mean log pi)`` (means over the batch's tokens) lies in
    ``(clip_cov_lb, clip_cov_ub)``, ``max(1, int(clip_cov_ratio * tokens))`` of them chosen at
    random lose their gradient (their loss is set to 0, as verl's ``compute_policy_loss_clip_cov``
    does). The high-covariance tokens are what drives the entropy collapse the paper measures.

    Randomness: ``generator`` (a ``torch.Generator`` on the CPU, advanced by each call) or ``seed``
    (a fresh generator per call: the same inputs pick the same tokens); neither draws from torch's
    global generator, as verl does, reproducible under ``torch.manual_seed`` (verl's trainer seeds
    it). With the same seed the choice equals verl's.

    Options (verl keys): ``clip_ratio_low/high``, ``policy_loss.clip_cov_ratio`` (0.0002),
    ``clip_cov_lb`` (1.0), ``clip_cov_ub`` (5.0). Metrics: ``cov_clip_frac`` (tokens detached),
    ``clip_frac_low`` / ``clip_frac_high`` (tokens whose loss PPO's clip set, ``A < 0`` / ``A > 0``),
    ``ppo_kl``.
    """
    if clip_ratio_high is None:
        clip_ratio_high = clip_ratio_low
    _bounds("clip_cov", clip_ratio_low, clip_ratio_high)
    if not 0 < clip_cov_ratio <= 1:
        raise ValueError(f"clip_cov: clip_cov_ratio must be in (0, 1], got {clip_cov_ratio!r}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov: clip_cov_lb must be < clip_cov_ub, got {clip_cov_lb!r} / {clip_cov_ub!r}")
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
    n_tokens = int(count)  # the host needs the number to draw
    with torch.no_grad():
        log_ratio, in_range = _log_ratio(lp, old, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        neg_adv = -adv
        loss1 = neg_adv * ratio
        loss2 = neg_adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
        value = torch.maximum(loss1, loss2).contiguous()
        clipped = flag(torch.gt, loss2, loss1)  # verl's clip_by_origin (0 on the padding: both losses 0 there)
        kept = m - clipped  # response tokens PPO did not clip (1), the others (0)
        # verl's means over the response tokens (sums of the zeroed inputs over the count)
        lp_d = lp.detach()
        cov = (adv - adv.sum() / count).mul_(lp_d - lp_d.sum() / count)
        candidates = flag(torch.gt, cov, clip_cov_lb).mul_(flag(torch.lt, cov, clip_cov_ub)).mul_(kept)
        chosen = _select_random(candidates.view(-1).bool(), max(int(clip_cov_ratio * n_tokens), 1), generator, seed)
        # the derivative where the max kept -A rho (not clipped): -A rho, times the outer clamp's derivative
        coef = _times(loss1 * kept, in_range)
        # the chosen tokens are detached (verl multiplies them by 0): value and derivative 0 there, written
        # into the few positions instead of a product over every token
        value.view(-1).index_fill_(0, chosen, 0.0)
        coef.view(-1).index_fill_(0, chosen, 0.0)
    loss = with_derivative(value, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("cov_clip_frac"):
        metrics["cov_clip_frac"] = (count.new_tensor(float(len(chosen))) / count).detach()
    if metric_wanted("clip_frac_low") or metric_wanted("clip_frac_high"):
        # the tokens the clip bound (as OpenRLHF's clip_ratio counts them), split by the sign of A: the upper
        # bound binds only where A > 0, the lower only where A < 0 (counts of 0/1 floats: exact)
        high = (clipped * flag(torch.gt, adv, 0.0)).sum(dtype=count.dtype)
        if metric_wanted("clip_frac_high"):
            metrics["clip_frac_high"] = (high / count).detach()
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = ((clipped.sum(dtype=count.dtype) - high) / count).detach()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see _prepare)


@register_policy_loss("kl_cov")
def kl_cov(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617).

    The unclipped surrogate ``-A rho`` on every token, plus ``ppo_kl_coef * |log pi - log pi_old|``
    on the ``max(1, int(kl_cov_ratio * tokens))`` tokens with the largest centred covariance
    ``(A_t - mean A) (log pi_t - mean log pi)`` (top-k, deterministic): the KL penalty holds back
    exactly the tokens whose updates collapse entropy, as verl's ``compute_policy_loss_kl_cov``.

    Options (verl ``policy_loss.`` keys): ``kl_cov_ratio`` (0.0002), ``ppo_kl_coef`` (0.1, verl's
    config default; the paper's runs use 1). ``log_ratio_clip`` bounds ``log rho`` (verl: none).
    Metrics: ``kl_cov_frac`` (penalised tokens), ``ppo_kl``, ``ppo_kl_abs`` (verl's ``ppo_kl``).
    """
    if not 0 < kl_cov_ratio <= 1:
        raise ValueError(f"kl_cov: kl_cov_ratio must be in (0, 1], got {kl_cov_ratio!r}")
    if not ppo_kl_coef >= 0:
        raise ValueError(f"kl_cov: ppo_kl_coef must be >= 0, got {ppo_kl_coef!r}")
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
    k = max(1, int(int(count) * kl_cov_ratio))  # the host needs the number for topk
    with torch.no_grad():
        log_ratio, in_range = _log_ratio(lp, old, log_ratio_clip)
        value = (-adv * torch.exp(log_ratio)).contiguous()
        coef = _times(value, in_range).contiguous()  # d/dlog pi of -A rho
        # the covariance over the response tokens (means: sums of the zeroed inputs over the count); the
        # padding is pushed to -inf by subtracting 1/m - 1 (0 on a token, +inf on the padding, exactly), so
        # topk over every position picks the k largest response tokens, as topk over them alone does
        lp_d = lp.detach()
        cov = (adv - adv.sum() / count) * (lp_d - lp_d.sum() / count)
        cov -= m.reciprocal().sub_(1.0)
        top = torch.topk(cov.reshape(-1), k, largest=True).indices
        # the penalty ppo_kl_coef |log rho| on the k chosen tokens only (a gather and a write each)
        lr_top = log_ratio.reshape(-1).index_select(0, top)
        flat_value, flat_coef = value.view(-1), coef.view(-1)
        flat_value.index_copy_(0, top, flat_value.index_select(0, top) + ppo_kl_coef * lr_top.abs())
        penalty_slope = ppo_kl_coef * torch.sign(lr_top)
        if in_range is not None:
            penalty_slope = penalty_slope * in_range.reshape(-1).index_select(0, top)
        flat_coef.index_copy_(0, top, flat_coef.index_select(0, top) + penalty_slope)
    loss = with_derivative(value, lp, coef)
    metrics: Metrics = {}
    if metric_wanted("kl_cov_frac"):
        metrics["kl_cov_frac"] = (count.new_tensor(float(k)) / count).detach()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ppo_kl_abs"):
        metrics["ppo_kl_abs"] = _mean(log_ratio.abs(), count)
    return loss, metrics  # 0 on the padding already (see _prepare)


def _dppo(name, log_probs, old_log_probs, advantages, mask, low, high, clip_ratio_c, log_ratio_clip):
    if high is None:
        high = low
    _positive(name, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_ratio_c)
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
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
            metrics["clip_frac_high"] = _frac(high_out, count)
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = _frac(outside.sub_(high_out), count)
    if metric_wanted("is_trunc_frac"):
        metrics["is_trunc_frac"] = _frac((flag(torch.gt, ratio, clip_ratio_c) * valid).mul_(m), count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see _prepare)


@register_policy_loss("dppo_tv")
@accepts_old_clip_names
def dppo_tv(
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
    """DPPO-Binary-TV (arXiv 2602.04879): the trust region is on the probability difference
    ``pi - pi_old`` of the sampled token, not on the ratio (a ratio bound is loose for rare tokens
    and tight for likely ones).

    ``L = -A sg(min(rho, clip_ratio_c)) log pi`` on tokens inside the region, 0 outside: for
    ``A > 0`` a token counts while ``pi - pi_old <= clip_ratio_high``, for ``A <= 0`` while
    ``pi - pi_old >= -clip_ratio_low``. The truncated, detached ratio (TIS) replaces dual clip;
    the paper (Sec. 5.4) recommends a large cap: ``clip_ratio_c`` defaults to 20 (verl's code
    default when the key is absent; verl's ActorConfig sets 3.0 and the verl host passes it).
    Value ``-A sg(w) valid`` (see the module docstring), gradient = verl's
    ``compute_policy_loss_dppo_tv``'s. ``clip_ratio_high`` defaults to ``clip_ratio_low``.

    Metrics: ``clip_frac_high`` / ``clip_frac_low`` (outside the region, ``A > 0`` / ``A <= 0``; their
    sum is verl's ``pg_clipfrac``), ``is_trunc_frac`` (verl's ``pg_clipfrac_lower``), ``ppo_kl``.
    """
    return _dppo("dppo_tv", log_probs, old_log_probs, advantages, mask, clip_ratio_low, clip_ratio_high,
                 clip_ratio_c, log_ratio_clip)


@register_policy_loss("dppo_kl")
@accepts_old_clip_names
def dppo_kl(
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
    """DPPO-Binary-KL (arXiv 2602.04879): as :func:`dppo_tv`, with the region on the binary KL
    ``KL(Bern(pi_old) || Bern(pi)) = pi_old log(pi_old / pi) + (1 - pi_old) log((1 - pi_old) /
    (1 - pi))`` of the sampled token.

    A token with ``A > 0`` counts while that KL is ``<= clip_ratio_high`` or ``pi <= pi_old``
    (moving back is always allowed); with ``A <= 0`` while it is ``<= clip_ratio_low`` or
    ``pi >= pi_old``. Same truncated IS weight, options and metrics as :func:`dppo_tv`; gradient =
    verl's ``compute_policy_loss_dppo_kl``'s.
    """
    return _dppo("dppo_kl", log_probs, old_log_probs, advantages, mask, clip_ratio_low, clip_ratio_high,
                 clip_ratio_c, log_ratio_clip)


@register_policy_loss("luspo")
@accepts_old_clip_names
def luspo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: Optional[float] = 4e-4,
    log_ratio_clip: Optional[float] = 10.0,
) -> Tuple[torch.Tensor, Metrics]:
    """LUSPO: length-unbiased sequence policy optimisation (arXiv 2602.05261; TRL 1.16
    ``loss_type="luspo"``).

    GSPO (:func:`.ppo_losses.gspo`, sequence ratio ``s_i``, clip ``clip_ratio_low`` /
    ``clip_ratio_high``) with each sequence's loss multiplied by its length ``|y_i|``: GSPO's
    per-sequence mean gives a long answer's tokens less weight each, a bias against long
    correct answers that the scaling removes. The per-token loss is ``|y_i|`` times GSPO's, so
    reduced with ``seq-mean-token-mean`` (GSPO's mode) it is TRL's
    ``(1/B) sum_i |y_i| L_i``, value and gradient. (Plain ``gspo`` with ``seq-mean-token-sum``
    is the same objective.)

    Metrics: GSPO's (``clip_frac_low``, ``clip_frac_high``, ``seq_ratio_mean``, ``ppo_kl``).
    """
    clip_ratio_high = check_clip_range(clip_ratio_low, clip_ratio_high, "gspo")  # gspo's checks and messages
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        # gspo's sequence ratio s_i = exp(clip(mean_t log rho_t)) ([B, 1]: the value of every token's s)
        token_log_ratio = lp.detach() - old  # 0 on the padding
        lengths = m.sum(dim=1, keepdim=True)
        seq_log_ratio = token_log_ratio.sum(dim=1, keepdim=True) / lengths
        if log_ratio_clip is not None:
            seq_log_ratio = seq_log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
        s = torch.exp(seq_log_ratio)
        surr = s * adv
        surr_clipped = s.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * adv
        value = -torch.minimum(surr, surr_clipped) * lengths
        # token form s_it = exp(log pi_t - sg(log pi_t) + sg(log s_i)): d s_it / d log pi_t = s_i; the min keeps
        # the unclipped branch where surr <= surr_clipped (ties: the clip is inactive); times |y_i|
        coef = (-adv * s).mul_(flag(torch.le, surr, surr_clipped)).mul_(lengths)
    loss = with_derivative(value, lp, coef)  # gspo's loss is 0 on the padding (A = 0), so is its multiple
    metrics: Metrics = {}
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = _frac(flag(torch.lt, adv, 0.0) * flag(torch.lt, s, 1.0 - clip_ratio_low), count)
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _frac(flag(torch.gt, adv, 0.0) * flag(torch.gt, s, 1.0 + clip_ratio_high), count)
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
    Value ``-phi A`` (module docstring), gradient = TRL's; TRL reduces it as ``token-mean``.

    Options: TRL's names. Metrics: ``phi_mean`` (token-weighted), ``seq_ratio_mean``, ``ppo_kl``.
    """
    for key, value in (("vespo_k_pos", vespo_k_pos), ("vespo_k_neg", vespo_k_neg)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"vespo: {key} must be a finite number >= 0, got {value!r}")
    _positive("vespo", vespo_lambda_pos=vespo_lambda_pos, vespo_lambda_neg=vespo_lambda_neg)
    maskb, lp, old, adv, m, count = _prepare(log_probs, old_log_probs, advantages, mask)
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
        metrics["phi_mean"] = _mean(phi * m, count)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = w.mean()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see _prepare)
