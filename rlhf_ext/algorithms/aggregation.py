"""Loss aggregation: how per-token losses ``[B, T]`` become one scalar (verl's mode names).

The choice changes what the gradient means: per-sequence means weight short answers' tokens
more than long answers' (the length bias Dr.GRPO removes), a global token mean weights every
token equally (DAPO's token-level loss).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .checks import check_token_inputs_finite, check_token_shapes
from .float_flags import float_mask, rows_all_nonempty

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")


def _positive(value, name: str) -> float:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = float(value)
    if not value > 0:
        raise ValueError(f"aggregate_loss: {name} must be > 0, got {value!r}")
    return value


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: Optional[float] = None,
    num_seqs: Optional[float] = None,
    max_len: Optional[float] = None,
) -> torch.Tensor:
    """Reduce ``per_token_loss`` over the tokens in ``mask``.

    Modes (B sequences, ``|y_i|`` response tokens of sequence i):

    * ``token-mean``: ``sum(mask L) / num_tokens`` -- DAPO's token-level loss (arXiv 2503.14476);
    * ``seq-mean-token-mean``: ``(1/num_seqs) sum_i (1/|y_i|) sum_t L_it`` -- original GRPO;
    * ``seq-mean-token-sum``: ``(1/num_seqs) sum_i sum_t L_it``;
    * ``seq-mean-token-sum-norm``: ``sum(mask L) / (max_len * num_seqs)`` -- Dr.GRPO's constant
      normaliser (arXiv 2503.20783), with ``max_len`` the generation budget (max response length);
    * ``token-sum``: ``sum(mask L)``, no normaliser (verl's ``token-sum``): the gradient grows with
      the number of tokens, so the learning rate must be sized for the batch's token count. Under
      data parallelism hosts average gradients over ranks, so a rank's sum is the global sum / dp
      size (verl multiplies by ``dp_size`` to undo that; the caller does it here).

    ``num_tokens``, ``num_seqs`` default to this batch's counts and ``max_len`` to ``T``. Pass the
    *global* counts (over all gradient-accumulation micro-batches and data-parallel ranks) so the
    micro-batch losses sum to the loss of the whole batch.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose from {', '.join(LOSS_AGG_MODES)}")
    maskb = check_token_shapes(mask, per_token_loss=per_token_loss)
    # The common case in one pass and one host-device synchronisation: the loss times the 0/1 mask, the
    # sum it is reduced to anyway, and that sum read on the host -- finite only if every product is, i.e.
    # the loss is finite everywhere (NaN * 0 and Inf * 0 are NaN), so the product equals torch.where's
    # choice (x * 1 = x, x * 0 = 0) and passes or zeroes the gradient the same way. The sum is divided by 1
    # (0 when a row has no token) and by each count given as a tensor being > 0 (1, else 0), so the same
    # number also vouches for those. Anything else takes the exact checks and torch.where, as before.
    dtype = per_token_loss.dtype
    m = float_mask(maskb, dtype)
    masked = per_token_loss * m
    row_sums = masked.sum(dim=1) if mode == "seq-mean-token-mean" else None
    total = row_sums.sum() if row_sums is not None else masked.sum()
    probe = total / rows_all_nonempty(maskb)
    counts = {}
    for name, value in (("num_tokens", num_tokens), ("num_seqs", num_seqs), ("max_len", max_len)):
        if isinstance(value, torch.Tensor):
            value = value.detach().to(dtype)
            probe = probe / (value > 0)
        else:
            value = _positive(value, name)
        counts[name] = value
    if not math.isfinite(probe.item()):
        maskb, finite = check_token_inputs_finite(mask, per_token_loss=per_token_loss)  # raises on bad input
        if not finite:  # NaN/Inf on the padding only
            masked = torch.where(maskb, per_token_loss, per_token_loss.new_zeros(()))
            row_sums = masked.sum(dim=1) if mode == "seq-mean-token-mean" else None
            total = row_sums.sum() if row_sums is not None else masked.sum()
        counts = {"num_tokens": _positive(num_tokens, "num_tokens"), "num_seqs": _positive(num_seqs, "num_seqs"),
                  "max_len": _positive(max_len, "max_len")}
    num_tokens, num_seqs, max_len = counts["num_tokens"], counts["num_seqs"], counts["max_len"]
    if num_seqs is None:
        num_seqs = float(per_token_loss.shape[0])

    if mode == "token-mean":
        return total / (num_tokens if num_tokens is not None else m.sum())
    if mode == "seq-mean-token-mean":
        return (row_sums / m.sum(dim=1)).sum() / num_seqs
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-sum":
        return total / num_seqs
    if max_len is None:
        max_len = float(per_token_loss.shape[1])
    return total / (max_len * num_seqs)
