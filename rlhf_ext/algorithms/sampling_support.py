"""Log-probabilities on the support a top-k / top-p sampler actually drew from.

vLLM's ``logprobs_mode="processed_logprobs"`` (what OpenRLHF and TRL request for importance
sampling) reports ``log`` of the *truncated, renormalised* distribution: after temperature,
top-k keeps the ``k`` largest logits (ties at the k-th value kept), then top-p drops the least
likely tokens whose cumulative mass stays at or below ``1 - p`` (at least one token kept), and
the survivors are renormalised. A trainer that takes a full-vocabulary log-softmax gets, for
every sampled token (which is always in the support),

    log pi_train(y) - log pi_rollout(y) = log S,    S = kept probability mass at that position,

independent of the token: every importance ratio is scaled by ``S <= 1`` -- a shift that is not a
policy mismatch (huggingface/trl#6789; prime-rl and TRL fix it by replaying the truncation on the
trainer side). :func:`truncated_log_probs` is that replay, given the trainer's logits;
:func:`kept_log_mass` is ``log S``. Semantics follow vLLM 0.32's ``apply_top_k_top_p_pytorch``
(tested against it in tests/test_sampling_support.py).
"""

from __future__ import annotations

from typing import Optional

import torch


def _truncated_logits(logits: torch.Tensor, temperature: float, top_k: Optional[int], top_p: Optional[float]):
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and top_k != -1 and not (isinstance(top_k, int) and top_k > 0):
        raise ValueError(f"top_k must be a positive integer (or -1 / None: off), got {top_k!r}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    x = logits.float() / temperature
    neg_inf = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
    vocab = x.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = torch.where(x < kth, neg_inf, x)
    if top_p is not None and top_p < 1:
        ascending, order = x.sort(dim=-1)
        mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)  # mass of this token and all less likely ones
        drop = mass_below <= 1 - top_p
        drop[..., -1] = False  # the most likely token always stays
        drop = torch.zeros_like(drop).scatter(-1, order, drop)
        x = torch.where(drop, neg_inf, x)
    return x


def truncated_log_probs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
) -> torch.Tensor:
    """``log`` of the sampler's truncated, renormalised probability of ``tokens`` (``[..., vocab]`` logits,
    ``[...]`` token ids), in float32: the trainer-side counterpart of vLLM's ``processed_logprobs``.
    A token outside the support gets ``-inf`` (the sampler could not have drawn it)."""
    x = _truncated_logits(logits, temperature, top_k, top_p)
    return x.log_softmax(dim=-1).gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def kept_log_mass(
    logits: torch.Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None
) -> torch.Tensor:
    """``log S`` per position: the log of the full distribution's mass that the truncation keeps (<= 0)."""
    full = (logits.float() / temperature).log_softmax(dim=-1)
    kept = torch.isfinite(_truncated_logits(logits, temperature, top_k, top_p))
    return torch.where(kept, full, torch.tensor(float("-inf"), device=full.device)).logsumexp(dim=-1)
