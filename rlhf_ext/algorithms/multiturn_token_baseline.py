"""The optimal token baseline for multi-turn (tool-integrated) responses: verl 0.9.1's
``tir_optimal_token_baseline``.

In a multi-turn response the mask has holes (tool outputs and the next prompt are not the policy's
tokens), so the t-th position of two rows of one group are not the t-th *generated* token of each.
This estimator aligns the rows by their generated tokens before taking the per-step baseline.
"""

from __future__ import annotations

from typing import Optional

import torch

from .advantages import optimal_token_baseline


def _compact(x: torch.Tensor, maskb: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """Each row's masked entries, left-aligned in a ``[B, width]`` tensor (0 beyond the row's count)."""
    out = x.new_zeros((x.shape[0], width))
    rows = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(maskb)
    out[rows[maskb], positions[maskb]] = x[maskb]
    return out


def tir_optimal_token_baseline(token_rewards: torch.Tensor, mask: torch.Tensor, groups, old_log_probs: torch.Tensor,
                               sum_pi_squared: torch.Tensor, *, is_weights: Optional[torch.Tensor] = None,
                               handle_zero_tail: bool = True, eps: float = 1e-8):
    """Multi-turn optimal token baseline (arXiv 2602.07078; verl 0.9.1's
    ``compute_multi_turn_optimal_token_baseline_advantage``, ``tir_optimal_token_baseline``); returns
    ``(advantages, returns)``, both ``[B, T]``.

    :func:`.advantages.optimal_token_baseline` (reward-to-go ``G_t``, cumulative path variance ``W_t``,
    ``B = sum_i G W / (sum_i W + eps)`` within a prompt group, ``handle_zero_tail``), with step ``t``
    meaning each row's t-th *response* token (``mask`` true) instead of its t-th position: ``G`` and ``W``
    are taken along the full row (masked tokens add nothing), then each row's response tokens are
    left-aligned, the group baselines taken, and the advantages put back in place. Rows without a
    response token get 0 and belong to no group (a group of one other row then has no baseline). With a
    mask without holes this is :func:`.advantages.optimal_token_baseline` itself.
    """
    maskb = mask.bool()
    if maskb.shape != token_rewards.shape:
        raise ValueError(f"tir_optimal_token_baseline: mask {tuple(maskb.shape)} and token_rewards "
                         f"{tuple(token_rewards.shape)} differ")
    ids = list(groups)
    if len(ids) != maskb.shape[0]:
        raise ValueError(f"tir_optimal_token_baseline: {len(ids)} group ids for {maskb.shape[0]} rows")
    zero = token_rewards.new_zeros(())
    returns = torch.where(maskb, token_rewards, zero).flip(-1).cumsum(-1).flip(-1)
    advantages = torch.zeros_like(returns)
    keep = maskb.any(-1)
    if not bool(keep.any()):
        return advantages, returns
    rows = keep.nonzero().flatten()
    mk = maskb[rows]
    positions = mk.long().cumsum(-1) - 1
    width = int(mk.sum(-1).max())
    compact = [_compact(t[rows], mk, positions, width) for t in (token_rewards, old_log_probs, sum_pi_squared)]
    weights = None if is_weights is None else _compact(is_weights[rows], mk, positions, width)
    lengths = mk.sum(-1)
    compact_mask = torch.arange(width, device=mk.device)[None, :] < lengths[:, None]
    # rewards compacted whole: the reward-to-go of the t-th response token is the same sum either way
    adv, _ = optimal_token_baseline(compact[0], compact_mask, [ids[int(r)] for r in rows], compact[1], compact[2],
                                    is_weights=weights, handle_zero_tail=handle_zero_tail, eps=eps)
    part = torch.zeros_like(mk, dtype=advantages.dtype)
    part[mk] = adv[compact_mask].to(advantages.dtype)
    advantages[rows] = part
    return advantages, returns


__all__ = ["tir_optimal_token_baseline"]
