"""Policy losses that single out the tokens with a large covariance between advantage and
log-probability, the tokens whose updates collapse the entropy (Cui et al. 2025, "The Entropy
Mechanism of RL for Reasoning LMs", arXiv 2505.22617): Clip-Cov (a random few of them lose their
gradient) and KL-Cov (the top few get a KL penalty).

Convention, padding and cost: :mod:`.ratio_common`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .float_flags import flag
from .linearised import with_derivative
from .metric_requests import metric_wanted
from .ppo_losses import zero_padded_mean
from .ratio_common import Metrics, check_bounds, clamped_log_ratio, prepare_inputs, times_flag, token_mean
from .registry import register_policy_loss


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
    check_bounds("clip_cov", clip_ratio_low, clip_ratio_high)
    if not 0 < clip_cov_ratio <= 1:
        raise ValueError(f"clip_cov: clip_cov_ratio must be in (0, 1], got {clip_cov_ratio!r}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov: clip_cov_lb must be < clip_cov_ub, got {clip_cov_lb!r} / {clip_cov_ub!r}")
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    n_tokens = int(count)  # the host needs the number to draw
    with torch.no_grad():
        log_ratio, in_range = clamped_log_ratio(lp, old, log_ratio_clip)
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
        coef = times_flag(loss1 * kept, in_range)
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
    return loss, metrics  # 0 on the padding already (see prepare_inputs)


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
    maskb, lp, old, adv, m, count = prepare_inputs(log_probs, old_log_probs, advantages, mask)
    k = max(1, int(int(count) * kl_cov_ratio))  # the host needs the number for topk
    with torch.no_grad():
        log_ratio, in_range = clamped_log_ratio(lp, old, log_ratio_clip)
        value = (-adv * torch.exp(log_ratio)).contiguous()
        coef = times_flag(value, in_range).contiguous()  # d/dlog pi of -A rho
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
        metrics["ppo_kl_abs"] = token_mean(log_ratio.abs(), count)
    return loss, metrics  # 0 on the padding already (see prepare_inputs)


__all__ = ["clip_cov", "kl_cov"]
