"""Input checks shared by the algorithms: bad input raises a ``ValueError`` naming the problem.

A silent NaN in an advantage or a loss corrupts a whole training run without a trace, so every
public function validates what it is given before computing.

Inside a run guarded by the non-finite guard (``--rlhf_ext.guard stop|warn``) the finiteness
checks must not pre-empt it: the guard writes the incident record and stops with its own exit
code, which a ``ValueError`` from deep inside the loss would turn into a plain crash. The guard
runs the training step under :func:`deferred_finite_checks`; there :func:`check_finite` records
what it found (name, counts, first index) instead of raising, the NaN flows on into the loss
the guard inspects, and the guard names the first finding in its incident. Direct calls, and
runs with ``--rlhf_ext.guard off``, still raise.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from .float_flags import rows_all_nonempty

_deferral = threading.local()


@contextlib.contextmanager
def deferred_finite_checks() -> Iterator[List[Dict[str, object]]]:
    """Within the block, :func:`check_finite` appends its findings to the yielded list instead of raising.

    Each finding: ``{"name", "nan_count", "inf_count", "first_index"}``. Only the NaN/Inf checks are
    deferred; shape, type and empty-input checks still raise. Nested blocks each collect their own.
    """
    findings: List[Dict[str, object]] = []
    outer = getattr(_deferral, "findings", None)
    _deferral.findings = findings
    try:
        yield findings
    finally:
        _deferral.findings = outer


def as_float_tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x, dtype=torch.float32)
        except Exception as exc:
            raise ValueError(f"{name} must be a tensor or a nested list of numbers: {exc}") from exc
    if x.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float32)
    return x


def check_finite(x: torch.Tensor, name: str, mask: Optional[torch.Tensor] = None) -> None:
    """Raise if ``x`` (restricted to ``mask`` when given) holds NaN or Inf."""
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask.bool()
    if bool(bad.any()):
        n_nan = int((torch.isnan(x) & bad).sum())
        n_inf = int(bad.sum()) - n_nan
        where = tuple(int(i) for i in bad.nonzero()[0])
        findings = getattr(_deferral, "findings", None)
        if findings is not None:
            findings.append({"name": name, "nan_count": n_nan, "inf_count": n_inf, "first_index": list(where)})
            return
        raise ValueError(
            f"{name} contains {n_nan} NaN and {n_inf} Inf value(s) (first at index {where})"
        )


def check_scores(scores, *, min_group_size: int = 1, estimator: str = "estimator") -> torch.Tensor:
    """Validate outcome scores laid out ``[P prompts, N samples]`` and return them as floats."""
    scores = as_float_tensor(scores, "scores")
    if scores.dim() != 2:
        raise ValueError(
            f"{estimator}: scores must have shape [num_prompts, samples_per_prompt], "
            f"got shape {tuple(scores.shape)}"
        )
    if scores.numel() == 0:
        raise ValueError(f"{estimator}: scores is empty (shape {tuple(scores.shape)})")
    check_finite(scores, f"{estimator}: scores")
    if scores.shape[1] < min_group_size:
        raise ValueError(
            f"{estimator} is a group estimator and needs at least {min_group_size} samples per "
            f"prompt, got groups of {scores.shape[1]} (set n_samples_per_prompt >= {min_group_size})"
        )
    return scores


def check_binary(scores: torch.Tensor, estimator: str) -> None:
    ok = (scores == 0) | (scores == 1)
    if getattr(_deferral, "findings", None) is not None:
        ok = ok | ~torch.isfinite(scores)  # a NaN/Inf is check_finite's finding, left to the guard
    if not bool(ok.all()):
        bad = scores[~ok]
        raise ValueError(
            f"{estimator} needs binary (0/1) rewards; got {bad.numel()} other value(s), "
            f"e.g. {bad[:5].tolist()} (use the correctness score, not a shaped reward)"
        )


def check_token_inputs(mask, **tensors) -> torch.Tensor:
    """Check ``[B, T]`` tensors share ``mask``'s shape, are finite on it, and each row has a token."""
    return check_token_inputs_finite(mask, **tensors)[0]


def check_token_shapes(mask, **tensors) -> torch.Tensor:
    """The type and shape part of :func:`check_token_inputs` (no values read); returns the boolean mask."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"mask must be a tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape [batch, tokens], got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.shape != mask.shape:
            raise ValueError(
                f"shape mismatch: {name} has shape {tuple(t.shape)} but mask has {tuple(mask.shape)}"
            )
    if mask.numel() == 0:
        raise ValueError(f"empty batch: mask has shape {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask.bool()


def check_token_inputs_finite(mask, **tensors) -> Tuple[torch.Tensor, bool]:
    """:func:`check_token_inputs`, also telling whether the tensors are finite everywhere, padding
    included (then a product with the 0/1 mask zeroes the padding exactly, no ``where`` needed)."""
    maskb = check_token_shapes(mask, **tensors)
    # One host-device synchronisation for the common case: every row has a token and every input is
    # finite everywhere. A sum is finite only if each of its terms is (NaN and +-Inf propagate; Inf -
    # Inf is NaN), so a finite total proves there is nothing to report; a non-finite one (a NaN in the
    # padding, an overflowing sum) takes the exact per-input checks below, which decide as before. The
    # total is divided by 1 when every row has a token and by 0 otherwise (then Inf or NaN), so one number
    # read on the host decides both.
    rows_ok = rows_all_nonempty(maskb)
    total = None
    for t in tensors.values():
        if t.is_complex():  # not covered by the real-valued sum: the exact checks below
            total = None
            break
        if t.is_floating_point():
            # 16-bit floats summed in float32: 32k log-probabilities overflow float16's range
            part = t.detach().sum(dtype=torch.float32) if t.element_size() < 4 else t.detach().sum()
            total = part if total is None else total + part
    if total is not None and math.isfinite((total / rows_ok).item()):
        return maskb, True
    empty_rows = (~maskb.any(dim=1)).nonzero().flatten()
    if empty_rows.numel():
        raise ValueError(
            f"mask has {empty_rows.numel()} row(s) with no tokens (rows {empty_rows[:8].tolist()}); "
            f"every sequence needs at least one response token"
        )
    for name, t in tensors.items():
        check_finite(t.detach(), name, maskb)
    return maskb, False
