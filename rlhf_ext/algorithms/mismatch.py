"""How far the rollout engine's token probabilities are from the trainer's, on the same tokens.

Inputs are, per sampled response token ``t``, the log-probability the rollout engine (vLLM)
reported when it sampled the token, ``log q_t``, and the one the training engine computes for the
same token in the same context with the same weights, ``log p_t``. With identical numerics they
are equal; in practice dtype, kernels (FP8, NPU) and batching make them differ, which turns
on-policy RL silently off-policy. Everything is over response tokens only, pooled over the batch.

Names (without the ``rollout_mismatch/`` prefix the OpenRLHF glue adds), with ``P = exp(log p)``,
``Q = exp(log q)``, ``d = log p - log q`` and ``rho = exp(clamp(d, -20, 20)) = P / Q``:

========================  ==================================================  =================================
``probs_diff_mean``       mean ``|P - Q|``                                    verl ``training/rollout_probs_diff_mean``
``probs_diff_max``        max ``|P - Q|``                                     verl ``..._max``
``probs_diff_std``        std of ``|P - Q|`` (Bessel's correction)            verl ``..._std`` (``torch.std``)
``probs_pearson_corr``    Pearson correlation of ``P`` and ``Q``              verl ``rollout_actor_probs_pearson_corr``
                                                                              (MiniMax-M1, arXiv 2506.13585)
``probs_corr_loss_1e4``   ``(1 - corr) * 1e4``: readable when corr ~ 0.9999
``logprobs_abs_diff_mean``  mean ``|d|``                                      TRL (mean ``|delta logp|``), slime
                                                                              ``train_rollout_logprob_abs_diff``
``logprobs_abs_diff_p99``   99th percentile of ``|d|`` (linear interpolation)
``logprobs_abs_diff_max``   max ``|d|``                                       TRL (max ``|delta logp|``)
``k1_kl``                 mean ``(-d)``: KL(q || p), plain estimator          verl ``rollout_corr/kl``, OpenRLHF
                                                                              ``vllm_kl``
``k3_kl``                 mean ``(rho - 1 - log rho)``: KL(q || p), k3        verl ``rollout_corr/k3_kl``
                                                                              (Schulman 2020, k3)
``chi2``                  mean ``rho^2`` - 1: chi^2(p || q)                   verl ``rollout_corr/chi2_token``
``ess``                   ``(sum rho)^2 / (n sum rho^2)`` in (0, 1]           verl ``rollout_is_eff_sample_size``
                                                                              (Kish's effective sample size)
``tokens``                number of response tokens compared
========================  ==================================================  =================================

``rho`` is the per-token importance ratio that truncated importance sampling (Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training") would use to correct
the mismatch (weight ``min(rho, C)``, ``C = 2``); ``chi2`` and ``ess`` say how much variance such
a correction would add. Reading guide (verl's docs): ``probs_diff_mean`` below 0.005 is normal,
above 0.01 points at a precision problem (bf16 ~0.004, FP8 rollouts ~0.015, verl PR #7519).

Undefined values are left out rather than reported as a number: ``probs_diff_std`` with fewer
than two tokens, the correlation when either side has zero variance. A NaN log-probability is an
error (it names how many); ``-inf`` (probability 0) is a legitimate, extreme value.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

LOG_RATIO_CLIP = 20.0  # verl's SAFETY_BOUND: exp(20) ~ 5e8 keeps rho and rho^2 finite in float64
DEFAULT_PROBS_DIFF_THRESHOLD = 0.005  # verl: mean |P - Q| below this is the normal range

MISMATCH_METRICS = (
    "probs_diff_mean",
    "probs_diff_max",
    "probs_diff_std",
    "probs_pearson_corr",
    "probs_corr_loss_1e4",
    "logprobs_abs_diff_mean",
    "logprobs_abs_diff_p99",
    "logprobs_abs_diff_max",
    "k1_kl",
    "k3_kl",
    "chi2",
    "ess",
    "tokens",
)


def _select(train_log_probs, rollout_log_probs, mask) -> "tuple[torch.Tensor, torch.Tensor]":
    p = torch.as_tensor(train_log_probs)
    q = torch.as_tensor(rollout_log_probs)
    if p.shape != q.shape:
        raise ValueError(
            f"shape mismatch: train_log_probs {tuple(p.shape)} vs rollout_log_probs {tuple(q.shape)}"
        )
    p = p.detach().to("cpu", torch.float64)
    q = q.detach().to("cpu", torch.float64)
    if mask is not None:
        m = torch.as_tensor(mask).detach().to("cpu")
        if m.shape != p.shape:
            raise ValueError(f"shape mismatch: mask {tuple(m.shape)} vs log-probs {tuple(p.shape)}")
        m = m.bool()
        p, q = p[m], q[m]
    return p.reshape(-1), q.reshape(-1)


def mismatch_stats(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    log_ratio_clip: float = LOG_RATIO_CLIP,
) -> Dict[str, float]:
    """Training-vs-rollout statistics over the tokens selected by ``mask`` (all when ``None``).

    ``train_log_probs`` and ``rollout_log_probs`` hold the log-probabilities of the *sampled*
    tokens (any shape, the same for both and for ``mask``). Computed in float64. Returns plain
    floats keyed by the names in :data:`MISMATCH_METRICS` (see the module docstring for each
    formula and its source); with no token selected, only ``{"tokens": 0.0}``.
    """
    if not log_ratio_clip > 0:
        raise ValueError(f"log_ratio_clip must be > 0, got {log_ratio_clip!r}")
    p_log, q_log = _select(train_log_probs, rollout_log_probs, mask)
    n = p_log.numel()
    if n == 0:
        return {"tokens": 0.0}
    nan_train, nan_rollout = int(torch.isnan(p_log).sum()), int(torch.isnan(q_log).sum())
    if nan_train or nan_rollout:
        raise ValueError(
            f"NaN log-probabilities among {n} response tokens: {nan_train} from training, {nan_rollout} from the rollout"
        )
    if bool((p_log == math.inf).any() | (q_log == math.inf).any()):
        raise ValueError("a log-probability of +inf is not a log-probability")

    P, Q = p_log.exp(), q_log.exp()
    abs_p = (P - Q).abs()
    stats: Dict[str, float] = {
        "probs_diff_mean": abs_p.mean().item(),
        "probs_diff_max": abs_p.max().item(),
    }
    if n > 1:
        stats["probs_diff_std"] = abs_p.std(unbiased=True).item()
        pc, qc = P - P.mean(), Q - Q.mean()
        denom = math.sqrt(float((pc * pc).sum()) * float((qc * qc).sum()))
        if denom > 0:
            corr = max(-1.0, min(1.0, float((pc * qc).sum()) / denom))
            stats["probs_pearson_corr"] = corr
            stats["probs_corr_loss_1e4"] = (1.0 - corr) * 1e4

    # log p - log q; both -inf (a token neither engine could sample) counts as agreement
    d = torch.where(p_log == q_log, torch.zeros_like(p_log), p_log - q_log)
    abs_d = d.abs()
    stats["logprobs_abs_diff_mean"] = abs_d.mean().item()
    stats["logprobs_abs_diff_p99"] = _quantile(abs_d, 0.99)
    stats["logprobs_abs_diff_max"] = abs_d.max().item()

    d_safe = d.clamp(-log_ratio_clip, log_ratio_clip)
    rho = d_safe.exp()
    stats["k1_kl"] = (-d_safe).mean().item()
    stats["k3_kl"] = (rho - 1.0 - d_safe).mean().item()
    stats["chi2"] = (rho * rho).mean().item() - 1.0
    stats["ess"] = (rho.sum() ** 2 / (n * (rho * rho).sum())).item()
    stats["tokens"] = float(n)
    return stats


def _quantile(values: torch.Tensor, q: float) -> float:
    """Linear-interpolation quantile (numpy's default) that tolerates +inf entries."""
    ordered, _ = torch.sort(values)
    pos = q * (ordered.numel() - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    a, b = float(ordered[lo]), float(ordered[hi])
    if lo == hi or a == b:
        return a
    return a + (b - a) * (pos - lo)


def exceeds_threshold(stats: Dict[str, float], threshold: float = DEFAULT_PROBS_DIFF_THRESHOLD) -> bool:
    """``probs_diff_mean`` above ``threshold`` (verl's normal range ends at 0.005)."""
    value = stats.get("probs_diff_mean")
    return value is not None and value > threshold
