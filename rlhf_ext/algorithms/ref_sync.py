"""A reference model that follows the policy: periodic mix-up (TR-DPO, Gorbatovski et al. 2024,
arXiv 2404.09656; TRL 1.16's ``sync_ref_model`` / ``ref_model_mixup_alpha`` / ``ref_model_sync_steps``,
``trl/trainer/callbacks.py: SyncRefModelCallback``).

Every ``sync_steps`` optimizer steps (TRL: when ``global_step % ref_model_sync_steps == 0``), each
reference parameter becomes ``alpha * theta + (1 - alpha) * theta_ref`` (``alpha = 1``: a hard copy
of the policy). Framework-free: parameters in, parameters mixed in place.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Tuple

import torch


def check_settings(alpha: float, sync_steps: int) -> None:
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0 < alpha <= 1):
        raise ValueError(f"ref_model_mixup_alpha must be in (0, 1], got {alpha!r}")
    if not (isinstance(sync_steps, int) and sync_steps >= 1):
        raise ValueError(f"ref_model_sync_steps must be an integer >= 1, got {sync_steps!r}")


def sync_due(step: int, sync_steps: int) -> bool:
    """Whether the reference follows after optimizer step ``step`` (counted from 1), as TRL's callback."""
    return step >= 1 and step % sync_steps == 0


@torch.no_grad()
def mix_into_reference(reference: Iterable[Tuple[str, torch.Tensor]], policy: Mapping[str, torch.Tensor],
                       alpha: float) -> Dict[str, float]:
    """``ref <- alpha * policy + (1 - alpha) * ref`` for every named reference parameter (in place; the policy's
    tensor of the same name, any device/dtype). Returns ``{"params", "max_err", "max_err_ulp"}``: how many were
    mixed, the largest ``|ref_new - (alpha * policy + (1 - alpha) * ref_old)|`` (the mix in float64), and that
    error in units of the parameter dtype's rounding of the mix, ``eps * (alpha |policy| + (1 - alpha) |ref_old|)``
    (the in-place multiply and add round twice: at most ~2 when the reference holds the mix, in any dtype)."""
    check_settings(alpha, 1)
    reference = list(reference)
    missing = [name for name, _ in reference if name not in policy]
    if missing:
        raise ValueError(f"the policy has no parameter named {missing[0]!r} ({len(missing)} reference parameters "
                         "unmatched): reference and policy must be the same architecture")
    extra = set(policy) - {name for name, _ in reference}
    if extra:
        raise ValueError(f"the reference has no parameter named {sorted(extra)[0]!r} ({len(extra)} unmatched)")
    max_err = max_ulp = 0.0
    for name, ref in reference:
        src = policy[name]
        if src.shape != ref.shape:
            raise ValueError(f"parameter {name!r}: policy shape {tuple(src.shape)} != reference {tuple(ref.shape)}")
        src = src.to(device=ref.device)
        expected = alpha * src.double() + (1.0 - alpha) * ref.double()
        scale = (alpha * src.double().abs() + (1.0 - alpha) * ref.double().abs()) * torch.finfo(ref.dtype).eps
        ref.mul_(1.0 - alpha).add_(src.to(ref.dtype), alpha=alpha)
        if ref.numel():
            err = (ref.double() - expected).abs()
            max_err = max(max_err, float(err.max()))
            max_ulp = max(max_ulp, float((err / scale.clamp(min=torch.finfo(torch.float64).tiny)).max()))
    return {"params": float(len(reference)), "max_err": max_err, "max_err_ulp": max_ulp}


__all__ = ["check_settings", "mix_into_reference", "sync_due"]
