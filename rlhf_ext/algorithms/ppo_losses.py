"""Per-token policy-gradient losses: PPO's clipped surrogate (with clip-higher and dual clip), GSPO,
the plain policy gradient without a ratio (``pg``) and the unclipped-ratio surrogate (``noclip``).

Each loss is ``fn(log_probs, old_log_probs, advantages, mask, **options) -> (per_token_loss,
metrics)`` with ``[B, T]`` tensors. The reduction to a scalar is separate
(:func:`rlhf_ext.algorithms.aggregate_loss`), so every loss works with every aggregation mode.
Metrics are detached 0-dim tensors averaged over the tokens in ``mask``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from .checks import check_token_inputs, check_token_inputs_finite
from .loss_options import accepts_old_clip_names, check_clip_range
from .metric_requests import metric_wanted
from .ppo_closed_form import fast_path_applies, ppo_closed_form
from .ratio_caps import check_caps
from .registry import register_policy_loss

Metrics = Dict[str, torch.Tensor]


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero outside ``mask``; torch.where because padding may hold NaN/Inf and NaN * 0 is NaN."""
    return torch.where(mask, x, x.new_zeros(()))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, count: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; ``count``: ``mask.sum()`` when the caller already has it."""
    return (_masked(x, mask).sum() / (mask.sum() if count is None else count)).detach()


def _masked_frac(flag: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Fraction of the ``mask`` tokens (``count`` of them) where the boolean ``flag`` holds: the value of
    ``_masked_mean(flag.float(), mask, count)``, counted on the booleans (no float copy, no ``where``)."""
    return ((flag & mask).sum() / count).detach()


def zero_padded_mean(x: torch.Tensor, count: torch.Tensor, *, negate: bool = False) -> torch.Tensor:
    """Mean over the ``count`` response tokens of ``x`` (of ``-x`` with ``negate``), ``x`` being already 0 on
    the padding: a plain sum, no ``where``. Negating the sum gives the sum of the negated values exactly
    (rounding to nearest is symmetric in sign), without a pass to negate every token."""
    total = x.detach().sum()
    return ((-total if negate else total) / count).detach()


@register_policy_loss("ppo")
@accepts_old_clip_names
def ppo(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: Optional[float] = None,
    dual_clip: Optional[float] = None,
    log_ratio_clip: Optional[float] = 20.0,
    delta: Optional[float] = None,
) -> Tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347) with DAPO's clip-higher
    (Yu et al. 2025, arXiv 2503.14476) and dual clip (Ye et al. 2020, arXiv 1912.09729).

    ``rho = exp(clamp(log pi - log pi_old, +-log_ratio_clip))``;
    ``L = max(-A rho, -A clip(rho, 1 - clip_ratio_low, 1 + clip_ratio_high))``; with
    ``dual_clip = c > 1``, for ``A < 0`` the loss is further capped at ``-c A``, so one token with a
    huge ratio cannot dominate the update. With ``delta > 1`` (TRL's two-sided clip, INTELLECT-2) the
    unclipped branch's ratio is ``min(rho, delta)`` (:mod:`.ratio_caps`). ``clip_ratio_high`` defaults to ``clip_ratio_low``
    (symmetric PPO); DAPO uses 0.2 / 0.28. The clip options are verl's keys; the old names
    ``eps_low`` / ``eps_high`` are accepted for one release (DeprecationWarning).

    Metrics: ``clip_frac_low`` (tokens where the lower bound binds: ``rho < 1 - clip_ratio_low`` and
    ``A < 0``), ``clip_frac_high`` (``rho > 1 + clip_ratio_high`` and ``A > 0``), ``dual_clip_frac``,
    ``delta_clip_frac`` (tokens whose ratio is above ``delta``), ``ppo_kl`` (mean of
    ``log pi_old - log pi``, the k1 estimate of KL(pi_old || pi)), and ``ratio_mean``; inside
    :func:`rlhf_ext.algorithms.only_metrics`, only those asked for.

    Inputs finite everywhere and of one dtype (the hosts' case) take :mod:`.ppo_closed_form`: the same loss,
    gradient and metrics bit for bit, without autograd through the formula (issue 42's loss cost).
    """
    clip_ratio_high = check_clip_range(clip_ratio_low, clip_ratio_high, "ppo")
    check_caps("ppo", dual_clip, delta)
    maskb, finite = check_token_inputs_finite(mask, log_probs=log_probs, old_log_probs=old_log_probs,
                                              advantages=advantages)
    if finite and fast_path_applies(log_probs, old_log_probs, advantages):
        # the same values and gradient, bit for bit, without autograd through the formula (.ppo_closed_form)
        return ppo_closed_form(log_probs, old_log_probs, advantages, maskb, low=clip_ratio_low,
                               high=clip_ratio_high, dual_clip=dual_clip, log_ratio_clip=log_ratio_clip, delta=delta)
    return _ppo_autograd(log_probs, old_log_probs, advantages, maskb, clip_ratio_low, clip_ratio_high, dual_clip,
                         log_ratio_clip, delta)


def _ppo_autograd(log_probs, old_log_probs, advantages, maskb, clip_ratio_low, clip_ratio_high, dual_clip,
                  log_ratio_clip, delta):
    """:func:`ppo` through autograd: non-finite padding, mixed dtypes, a gradient for the old log-probs or the
    advantages; the reference its closed form is compared with."""
    log_ratio = log_probs - old_log_probs
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    surr = (ratio if delta is None else ratio.clamp(max=delta)) * advantages
    surr_clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * advantages
    loss = -torch.min(surr, surr_clipped)

    metrics: Metrics = {
        "clip_frac_low": _masked_mean(((ratio < 1.0 - clip_ratio_low) & (advantages < 0)).float(), maskb),
        "clip_frac_high": _masked_mean(((ratio > 1.0 + clip_ratio_high) & (advantages > 0)).float(), maskb),
    }
    if delta is not None:
        metrics["delta_clip_frac"] = _masked_mean((ratio > delta).float(), maskb)
    if dual_clip is not None:
        dual_bound = -dual_clip * advantages
        dual_active = (advantages < 0) & (loss > dual_bound)
        loss = torch.where(dual_active, dual_bound, loss)
        metrics["dual_clip_frac"] = _masked_mean(dual_active.float(), maskb)
    metrics["ppo_kl"] = _masked_mean(-log_ratio, maskb)
    metrics["ratio_mean"] = _masked_mean(ratio, maskb)
    return _masked(loss, maskb), {key: value for key, value in metrics.items() if metric_wanted(key)}


@accepts_old_clip_names
def ppo_clip_fractions(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: Optional[float] = None,
    clipped: Optional[torch.Tensor] = None,
) -> Metrics:
    """:func:`ppo`'s ``clip_frac_low`` and ``clip_frac_high`` alone, for a loss computed elsewhere.

    For a training loop that already ran a PPO loss (e.g. OpenRLHF's, which reports only the sum
    of the two) and wants the split per bound: ``rho < 1 - clip_ratio_low`` with ``A < 0``, and
    ``rho > 1 + clip_ratio_high`` with ``A > 0``, as fractions of the tokens in ``mask``. Compared in log
    space (``log rho < log(1 - clip_ratio_low)``), so no ``exp`` and no second pass through the loss; a
    token whose ratio lies within float rounding of a bound may be counted differently than
    :func:`ppo` counts it. No input checks and no host-device synchronisation: it runs in every
    micro-batch, after the loss has seen the same tensors. An empty ``mask`` gives 0.

    ``clipped``: the fraction of the ``mask`` tokens clipped at either bound, when the caller has it
    (OpenRLHF's ``clip_ratio``); then only the upper bound is counted and ``clip_frac_low`` is
    ``clipped - clip_frac_high`` (kept within ``[0, clipped]``), which halves the work.
    """
    clip_ratio_high = check_clip_range(clip_ratio_low, clip_ratio_high, "ppo_clip_fractions")
    with torch.no_grad():
        maskb = mask if mask.dtype == torch.bool else mask.bool()
        log_ratio = log_probs.detach() - old_log_probs
        tokens = maskb.sum().clamp(min=1).to(torch.float32)
        high = ((log_ratio > math.log1p(clip_ratio_high)) & (advantages > 0) & maskb).sum() / tokens
        if clipped is not None:
            clipped = clipped.detach().to(high.dtype)
            high = torch.minimum(high, clipped)
            return {"clip_frac_low": clipped - high, "clip_frac_high": high}
        low = ((log_ratio < math.log1p(-clip_ratio_low)) & (advantages < 0) & maskb).sum() / tokens
        return {"clip_frac_low": low, "clip_frac_high": high}


@register_policy_loss("gspo")
@accepts_old_clip_names
def gspo(
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
    """GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071).

    The importance ratio is per sequence, length-normalised:
    ``s_i = exp(mean_t (log pi_t - log pi_old_t))`` over the response tokens of sequence i.
    It is computed in the token form ``log s_{i,t} = log pi_t - sg(log pi_t) + sg(log s_i)``
    (sg = stop-gradient): every token's value equals ``s_i``, and when the per-token losses are
    averaged within each sequence (``seq-mean-token-mean``, GSPO's aggregation) the gradient is
    exactly that of the sequence objective ``-A_i s_i``. Loss per token:
    ``max(-A s, -A clip(s, 1 - clip_ratio_low, 1 + clip_ratio_high))``; the paper's ranges are about
    3e-4 / 4e-4. ``log_ratio_clip`` bounds ``log s_i`` before ``exp`` to avoid overflow.
    ``dual_clip`` / ``delta`` (:mod:`.ratio_caps`) act on ``s_i`` as :func:`ppo`'s on the token ratio; TRL 1.16
    applies ``delta`` so with ``importance_sampling_level="sequence"``. verl's ``gspo`` has no dual clip,
    so on verl ``clip_ratio_c`` does not reach this loss.

    Metrics: ``clip_frac_low`` / ``clip_frac_high`` as in :func:`ppo` but on the sequence ratio
    (token-weighted), ``seq_ratio_mean``, ``ppo_kl``; ``dual_clip_frac`` / ``delta_clip_frac`` with the caps.
    """
    clip_ratio_high = check_clip_range(clip_ratio_low, clip_ratio_high, "gspo")
    check_caps("gspo", dual_clip, delta)
    maskb = check_token_inputs(mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    return _gspo(log_probs, old_log_probs, advantages, maskb, clip_ratio_low, clip_ratio_high, log_ratio_clip,
                 dual_clip=dual_clip, delta=delta)


def _gspo(log_probs, old_log_probs, advantages, maskb, low, high, log_ratio_clip, zeroed=False, dual_clip=None,
          delta=None):
    """:func:`gspo` on inputs already checked (``maskb`` boolean). ``zeroed``: the inputs are 0 on the
    padding, so are the token log-ratios and the loss (a product with ``A = 0``): no ``where`` needed."""
    token_log_ratio = log_probs - old_log_probs
    if not zeroed:
        token_log_ratio = _masked(token_log_ratio, maskb)
    seq_log_ratio = token_log_ratio.sum(dim=1, keepdim=True) / maskb.sum(dim=1, keepdim=True)
    if log_ratio_clip is not None:
        seq_log_ratio = seq_log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    log_s = log_probs - log_probs.detach() + seq_log_ratio.detach()
    s = torch.exp(log_s)
    surr = (s if delta is None else s.clamp(max=delta)) * advantages
    surr_clipped = s.clamp(1.0 - low, 1.0 + high) * advantages
    loss = -torch.min(surr, surr_clipped)

    s_val = s.detach()
    count = maskb.sum()
    metrics: Metrics = {}
    if dual_clip is not None:
        dual_bound = -dual_clip * advantages
        dual_active = (advantages < 0) & (loss > dual_bound)
        loss = torch.where(dual_active, dual_bound, loss)
        metrics["dual_clip_frac"] = _masked_frac(dual_active, maskb, count)
    if delta is not None:
        metrics["delta_clip_frac"] = _masked_frac(s_val > delta, maskb, count)
    if metric_wanted("clip_frac_low"):
        metrics["clip_frac_low"] = _masked_frac((s_val < 1.0 - low) & (advantages < 0), maskb, count)
    if metric_wanted("clip_frac_high"):
        metrics["clip_frac_high"] = _masked_frac((s_val > 1.0 + high) & (advantages > 0), maskb, count)
    if metric_wanted("seq_ratio_mean"):
        metrics["seq_ratio_mean"] = torch.exp(seq_log_ratio.detach()).mean()
    if metric_wanted("ppo_kl"):
        # the masked token log-ratio is the same number on every response token (0 on padding)
        metrics["ppo_kl"] = zero_padded_mean(token_log_ratio, count, negate=True)
    return (loss if zeroed else _masked(loss, maskb)), metrics


def _ratio_metrics(log_ratio: torch.Tensor, maskb: torch.Tensor) -> Metrics:
    return {
        "ppo_kl": _masked_mean(-log_ratio.detach(), maskb),
        "ratio_mean": _masked_mean(torch.exp(log_ratio.detach()), maskb),
        "ratio_max": torch.where(maskb, torch.exp(log_ratio.detach()), log_ratio.new_full((), float("-inf"))).max(),
    }


@register_policy_loss("pg")
@register_policy_loss("gpg")
def pg(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """Plain policy gradient without an importance ratio: ``L = -A log pi`` (REINFORCE, Williams
    1992; the score-function estimator ``grad J = E[A grad log pi]``).

    On-policy (``pi = pi_old``) its gradient equals that of the ratio losses: ``grad(-A pi/pi_old)
    = -A (pi/pi_old) grad log pi = -A grad log pi``. After the first optimizer step on a rollout
    batch the data is off-policy and this loss ignores it (no correction, no clipping): the
    "naive" off-policy baseline. With the ``rft`` advantage (0/1) it is the log-likelihood of the
    accepted samples, i.e. rejection-sampling fine-tuning.

    Also registered as ``gpg``: verl 0.9.1's ``compute_policy_loss_gpg`` (GPG, arXiv 2504.02546; the
    loss of its ``gpg`` estimator's advantages) is this ``-A log pi``, value and gradient
    (tests/verl_env/test_verl_new_losses_parity.py).

    ``old_log_probs`` only feeds the metrics: ``ppo_kl`` (k1 estimate of KL(pi_old || pi)),
    ``ratio_mean`` and ``ratio_max`` of ``pi / pi_old`` (``log_ratio_clip`` bounds the log-ratio
    before ``exp`` in the metrics) -- how far off-policy the update has drifted.
    """
    maskb = check_token_inputs(mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    loss = -advantages * log_probs
    log_ratio = (log_probs - old_log_probs).detach()
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    return _masked(loss, maskb), _ratio_metrics(log_ratio, maskb)


@register_policy_loss("noclip")
def noclip(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    log_ratio_clip: Optional[float] = 20.0,
) -> Tuple[torch.Tensor, Metrics]:
    """Importance-sampled policy gradient with the unclipped token ratio: ``L = -A rho``,
    ``rho = pi / pi_old`` (the surrogate of TRPO/PPO before clipping; Schulman et al. 2015,
    arXiv 1502.05477; 2017, arXiv 1707.06347).

    ``grad L = -A rho grad log pi``: on-policy (``rho = 1``) the same gradient as :func:`pg`;
    off-policy the ratio corrects for the data being sampled from ``pi_old``, with nothing
    bounding its variance (PPO's clip is what this variant leaves out). ``log_ratio_clip``
    (default 20, as :func:`ppo`) only bounds ``log rho`` before ``exp`` so a token cannot overflow
    to Inf; within that range the ratio is not clipped (beyond it the token's gradient is 0).

    Metrics: ``ppo_kl``, ``ratio_mean``, ``ratio_max``.
    """
    maskb = check_token_inputs(mask, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages)
    log_ratio = log_probs - old_log_probs
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    loss = -advantages * torch.exp(log_ratio)
    return _masked(loss, maskb), _ratio_metrics(log_ratio, maskb)
