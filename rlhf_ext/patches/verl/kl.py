"""``RLHF_EXT_VERL_KL_CLIP``: a configurable clamp for verl's per-token KL penalties.

verl 0.9 computes every KL penalty -- in the reward (``algorithm.use_kl_in_reward``, driver) and
in the loss (``actor.use_kl_loss``, actor workers), plain and straight-through (``k3+``) -- in
``core_algos.kl_penalty_forward(logprob, ref_logprob, kl_penalty)``, which hard-codes the clamp:
``low_var_kl``/``k3`` bounds the log ratio to +-20 and the value to [-10, 10]; ``kl``/``k1``,
``abs``, ``mse``/``k2`` are not clamped. verl has no setting for it and no registry for KL
estimators, so this is a patch, applied only when the variable is set:

* ``RLHF_EXT_VERL_KL_CLIP=LO,HI``: every estimator's value is clamped to [LO, HI]; for ``k3`` this
  replaces verl's [-10, 10] (the +-20 log-ratio bound stays: it keeps ``exp`` finite);
* ``RLHF_EXT_VERL_KL_CLIP=none``: no value clamp for any estimator (log ratio still bounded for k3).

The patch replaces the name ``kl_penalty_forward`` in ``core_algos``; every caller reaches it
through ``core_algos.kl_penalty``, which looks it up there at call time (checked at patch time,
see :data:`rlhf_ext.patches.verl.KL_PATCH`). Formulas: Schulman, "Approximating KL Divergence"
(2020); :mod:`rlhf_ext.algorithms.kl`.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from rlhf_ext.algorithms.kl import k1, k2, k3

LOG_RATIO_CLIP = 20.0  # verl's own bound on the log ratio before exp (core_algos.kl_penalty_forward)

_K1, _K2, _K3 = ("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")


def clipped_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str,
               bounds: Optional[Tuple[float, float]]) -> torch.Tensor:
    """verl's KL penalty ``kl_penalty`` (forward value) with the value clamp ``bounds`` (None: no clamp)."""
    if kl_penalty in _K1:
        kl = k1(logprob, ref_logprob)
    elif kl_penalty == "abs":
        kl = (logprob - ref_logprob).abs()
    elif kl_penalty in _K2:
        kl = k2(logprob, ref_logprob)
    elif kl_penalty in _K3:
        log_ratio = (logprob - ref_logprob).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)
        kl = k3(ref_logprob + log_ratio, ref_logprob).contiguous()
    else:
        raise NotImplementedError(
            f"KL penalty {kl_penalty!r} is not supported with {__name__.rsplit('.', 1)[0]}'s KL clamp; "
            f"use one of kl/k1, abs, mse/k2, low_var_kl/k3"
        )
    return kl if bounds is None else kl.clamp(bounds[0], bounds[1])


def make_kl_penalty_forward(original, bounds: Optional[Tuple[float, float]]):
    """Replacement for ``core_algos.kl_penalty_forward`` with the clamp ``bounds``."""

    @functools.wraps(original)
    def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
        if kl_penalty == "full":  # verl's own message for what it does not implement
            return original(logprob, ref_logprob, kl_penalty)
        return clipped_kl(logprob, ref_logprob, kl_penalty, bounds)

    kl_penalty_forward.rlhf_ext_kl_clip = bounds
    return kl_penalty_forward
