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
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from .checks import check_token_inputs_finite
from .metric_requests import metric_wanted
from .ppo_losses import _check_clip, _gspo, _masked, _masked_frac, _masked_mean, _zero_padded_mean
from .registry import register_policy_loss

Metrics = Dict[str, torch.Tensor]


def _prepare(log_probs, old_log_probs, advantages, mask):
    """Check the inputs and zero them on the padding. A loss whose every term carries the (zeroed)
    advantage as a factor, the others finite there, is then 0 on the padding without another
    ``where``; its gradient there is 0 through the zeroing of ``log_probs``.

    Inputs finite everywhere (the usual case) are multiplied by the 0/1 mask: ``x * 1 = x`` and
    ``x * 0 = 0`` exactly, the gradient is passed or zeroed the same way, at a fraction of a ``where``'s
    cost. A NaN/Inf anywhere (padding may hold them) takes ``torch.where``, since ``NaN * 0`` is NaN."""
    return _prepare_mask(log_probs, old_log_probs, advantages, mask)[:4]


def _prepare_mask(log_probs, old_log_probs, advantages, mask):
    """:func:`_prepare`, and the 0/1 float mask when the inputs were finite everywhere (else None)."""
    maskb, finite = check_token_inputs_finite(mask, log_probs=log_probs, old_log_probs=old_log_probs,
                                              advantages=advantages)
    dtype = log_probs.dtype
    if finite:
        m = maskb.to(dtype)
        return maskb, log_probs * m, old_log_probs.to(dtype) * m, advantages.to(dtype) * m, m
    zero = log_probs.new_zeros(())
    return (maskb, torch.where(maskb, log_probs, zero), torch.where(maskb, old_log_probs.to(dtype), zero),
            torch.where(maskb, advantages.to(dtype), zero), None)


def _score(log_probs: torch.Tensor) -> torch.Tensor:
    """1 in value, ``grad log pi`` in gradient: ``exp(log pi - sg(log pi))``, written ``1 + (log pi -
    sg(log pi))``, which has the same value (exactly 1) and derivative (exactly 1) without an ``exp``."""
    return (log_probs - log_probs.detach()) + 1.0


def _log_ratio(lp, old, log_ratio_clip):
    log_ratio = lp - old
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    return log_ratio


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
    dropped (PPO's clip zeroes the gradient of clipped tokens). Written with :func:`_score`, the
    value is ``-sg(clip(rho)) A``, the gradient is verl's ``compute_policy_loss_cispo``'s.

    Options (verl keys): ``clip_ratio_low`` (None: no lower bound, as MiniMax-M1), ``clip_ratio_high``
    (default 4: weights capped at 5, ScaleRL's / TRL's ``epsilon_high=5.0`` for cispo, which TRL
    uses as the cap itself). ``log_ratio_clip`` bounds ``log rho`` before ``exp`` (verl: 20).

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` (weight clipped at either bound, whatever the
    sign of A), ``ppo_kl``, ``ratio_mean``.
    """
    _bounds("cispo", clip_ratio_low, clip_ratio_high, low_optional=True)
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    lower = None if clip_ratio_low is None else 1.0 - clip_ratio_low
    with torch.no_grad():  # the weight is detached: no graph for it
        log_ratio = _log_ratio(lp, old, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(min=lower, max=1.0 + clip_ratio_high)
    loss = -weight * adv * _score(lp)
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("clip_frac_low"):
        low_hit = (ratio < lower) if lower is not None else torch.zeros_like(maskb)
        metrics["clip_frac_low"] = _masked_frac(low_hit, maskb, count)
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _masked_frac(ratio > 1.0 + clip_ratio_high, maskb, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = _masked_mean(ratio, maskb, count)
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
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    log_ratio = _log_ratio(lp, old, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = -gate * adv
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ratio_mean"):
        metrics["ratio_mean"] = _masked_mean(ratio.detach(), maskb, count)
    if metric_wanted("gate_mean"):
        with torch.no_grad():
            s = torch.sigmoid(tau * (ratio - 1.0))
            slope = 4.0 * s * (1.0 - s) * ratio
        metrics["gate_mean"] = _masked_mean(slope, maskb, count)
    return loss, metrics  # 0 on the padding already (see _prepare)


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
    _bounds("gmpo", clip_ratio_low, clip_ratio_high, below_one=False)
    maskb, lp, old, adv, m = _prepare_mask(log_probs, old_log_probs, advantages, mask)
    d = _log_ratio(lp, old, log_ratio_clip)
    sgn = torch.sign(adv)
    d_clamped = d.clamp(-clip_ratio_low, clip_ratio_high)
    l_tok = sgn * torch.min(sgn * d, sgn * d_clamped)
    lengths = maskb.sum(dim=1, keepdim=True).to(lp.dtype)
    # l_tok is exactly 0 on the padding (zeroed inputs: d = 0, sgn = 0), so no mask before the sum
    seq_log_ratio = l_tok.sum(dim=1, keepdim=True) / lengths
    seq_adv = adv.sum(dim=1, keepdim=True) / lengths
    ratio_tok = torch.exp(seq_log_ratio.detach() + l_tok - l_tok.detach())
    loss = -seq_adv * ratio_tok
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("clip_frac_high") or metric_wanted("clip_frac_low"):
        clipped = (d != d_clamped).detach()
        if metric_wanted("clip_frac_high"):
            metrics["clip_frac_high"] = _masked_frac(clipped & (adv > 0), maskb, count)
        if metric_wanted("clip_frac_low"):
            metrics["clip_frac_low"] = _masked_frac(clipped & (adv < 0), maskb, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(d, count, negate=True)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = torch.exp(seq_log_ratio.detach()).mean()
    # the loss is -A_i s_i on the padding too (finite: computed from zeros); inputs finite everywhere make
    # every token finite, so the 0/1 mask zeroes it exactly; else torch.where (a NaN token's row is NaN)
    return (loss * m if m is not None else _masked(loss, maskb)), metrics


def _select_random(candidates: torch.Tensor, count: int, generator: Optional[torch.Generator],
                   seed: Optional[int]) -> torch.Tensor:
    """Up to ``count`` of the true positions of ``candidates`` ([N, 2] indices), chosen at random."""
    idx = torch.nonzero(candidates)
    if len(idx) == 0:
        return idx
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    # on the CPU, as verl's own clip_cov draws it: the same seed picks the same tokens on any device
    perm = torch.randperm(len(idx), generator=generator) if generator is not None else torch.randperm(len(idx))
    return idx[perm[: min(count, len(idx))].to(idx.device)]


@register_policy_loss("clip_cov")
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
    ``clip_frac_low`` / ``clip_frac_high`` (PPO's), ``ppo_kl``.
    """
    if clip_ratio_high is None:
        clip_ratio_high = clip_ratio_low
    _bounds("clip_cov", clip_ratio_low, clip_ratio_high)
    if not 0 < clip_cov_ratio <= 1:
        raise ValueError(f"clip_cov: clip_cov_ratio must be in (0, 1], got {clip_cov_ratio!r}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov: clip_cov_lb must be < clip_cov_ub, got {clip_cov_lb!r} / {clip_cov_ub!r}")
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    log_ratio = _log_ratio(lp, old, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    neg_adv = -adv
    loss1 = neg_adv * ratio
    loss2 = neg_adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        clipped = (loss2 > loss1) & maskb
        # the valid tokens in row-major order, as boolean indexing lists them, from one nonzero
        flat_valid = torch.nonzero(maskb.reshape(-1), as_tuple=True)[0]
        n_tokens = flat_valid.numel()
        lp_d = lp.detach()
        adv_mean = adv.reshape(-1).index_select(0, flat_valid).mean()
        cov = (adv - adv_mean) * (lp_d - lp_d.reshape(-1).index_select(0, flat_valid).mean())
        candidates = maskb & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        chosen = _select_random(candidates, max(int(clip_cov_ratio * n_tokens), 1), generator, seed)
    # detaching the chosen tokens multiplies them by 0, the others by 1: the same values and gradient
    # as a product with a keep-mask, written as a write of the chosen few instead of a pass over all
    loss = torch.maximum(loss1, loss2).index_put((chosen[:, 0], chosen[:, 1]), loss1.new_zeros(()))
    count = maskb.sum()
    ratio_d = ratio.detach()
    metrics: Metrics = {}
    if metric_wanted("cov_clip_frac"):
        keep = torch.ones_like(lp_d)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
        metrics["cov_clip_frac"] = _masked_mean((keep == 0).float(), maskb, count)
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = _masked_frac((ratio_d < 1.0 - clip_ratio_low) & (adv < 0), maskb, count)
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _masked_frac((ratio_d > 1.0 + clip_ratio_high) & (adv > 0), maskb, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
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
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    log_ratio = _log_ratio(lp, old, log_ratio_clip)
    loss = -adv * torch.exp(log_ratio)
    with torch.no_grad():
        flat_valid = torch.nonzero(maskb.reshape(-1), as_tuple=True)[0]
        # the valid tokens in row-major order, as boolean indexing lists them, from one nonzero
        a = adv.reshape(-1).index_select(0, flat_valid)
        p = lp.detach().reshape(-1).index_select(0, flat_valid)
        cov = (a - a.mean()) * (p - p.mean())
        k = max(1, int(len(cov) * kl_cov_ratio))
        top = flat_valid[torch.topk(cov, k, largest=True).indices]
    # the penalty on the k chosen tokens only (a gather and a write), not a pass over every token
    flat = loss.reshape(-1)
    penalty = ppo_kl_coef * log_ratio.reshape(-1).index_select(0, top).abs()
    loss = flat.index_put((top,), flat.index_select(0, top) + penalty).reshape(maskb.shape)
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("kl_cov_frac"):
        penalised = torch.zeros(maskb.numel(), dtype=torch.bool, device=maskb.device)
        penalised[top] = True
        metrics["kl_cov_frac"] = _masked_mean(penalised.reshape(maskb.shape).float(), maskb, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
    if metric_wanted("ppo_kl_abs"):
        metrics["ppo_kl_abs"] = _masked_mean(log_ratio.detach().abs(), maskb, count)
    return loss, metrics  # 0 on the padding already (see _prepare)


def _dppo(name, log_probs, old_log_probs, advantages, mask, low, high, clip_ratio_c, log_ratio_clip):
    if high is None:
        high = low
    _positive(name, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_ratio_c)
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():  # the weight and the region are detached: no graph for them
        log_ratio = _log_ratio(lp, old, log_ratio_clip)
        ratio = torch.exp(log_ratio)
        weight = ratio.clamp(max=clip_ratio_c)
        prob, old_prob = torch.exp(lp), torch.exp(old)
        if name == "dppo_tv":
            valid = torch.where(adv > 0, (prob - old_prob) <= high, (prob - old_prob) >= -low)
        else:
            # binary KL between Bernoulli(old_prob) and Bernoulli(prob); 1e-8 as verl
            bkl = old_prob * (old - lp.detach()) + (1 - old_prob) * torch.log(
                (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
            valid = torch.where(adv > 0, (bkl <= high) | (prob <= old_prob), (bkl <= low) | (prob >= old_prob))
        coef = -adv * weight * valid.to(lp.dtype)
    # (-A w valid) * score: the same product as -A * w * score * valid, reordered -- every factor but
    # the score is detached and the score is exactly 1, so value and gradient are the same
    loss = coef * _score(lp)
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _masked_frac(~valid & (adv > 0), maskb, count)
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = _masked_frac(~valid & (adv <= 0), maskb, count)
    if metric_wanted("is_trunc_frac"):
        metrics["is_trunc_frac"] = _masked_mean(((ratio > clip_ratio_c) & valid).float(), maskb, count)
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see _prepare)


@register_policy_loss("dppo_tv")
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
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    clip_ratio_high = _check_clip(clip_ratio_low, clip_ratio_high, "gspo")  # gspo's checks and messages
    per_token, metrics = _gspo(lp, old, adv, maskb, clip_ratio_low, clip_ratio_high, log_ratio_clip, zeroed=True)
    lengths = maskb.sum(dim=1, keepdim=True).to(per_token.dtype)
    return per_token * lengths, metrics  # gspo's loss is 0 on the padding, so is its multiple


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
    maskb, lp, old, adv = _prepare(log_probs, old_log_probs, advantages, mask)
    with torch.no_grad():
        log_ratio = (lp - old).clamp(-20.0, 20.0)
        log_w = _masked(log_ratio, maskb).sum(dim=1, keepdim=True).clamp(math.log(1e-8), 20.0)
        w = torch.exp(log_w)
        nonneg = adv >= 0
        k = torch.where(nonneg, adv.new_tensor(vespo_k_pos), adv.new_tensor(vespo_k_neg))
        lam = torch.where(nonneg, adv.new_tensor(vespo_lambda_pos), adv.new_tensor(vespo_lambda_neg)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    loss = -phi * adv * _score(lp)
    count = maskb.sum()
    metrics: Metrics = {}
    if metric_wanted("phi_mean"):
        metrics["phi_mean"] = _masked_mean(phi, maskb, count)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = w.mean()
    if metric_wanted("ppo_kl"):
        metrics["ppo_kl"] = _zero_padded_mean(log_ratio, count, negate=True)
    return loss, metrics  # 0 on the padding already (see _prepare)
