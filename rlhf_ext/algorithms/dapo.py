"""DAPO's sampling and shaping helpers (Yu et al. 2025, arXiv 2503.14476)."""

from __future__ import annotations

import torch

from .checks import as_float_tensor, check_finite, check_scores


def zero_variance_groups(scores) -> torch.Tensor:
    """Dynamic sampling: ``BoolTensor[P]``, True for prompts whose N scores are all equal.

    Such groups have zero advantage under every group-relative estimator and only dilute the
    batch; DAPO drops them and samples more prompts until the batch is full.
    """
    scores = check_scores(scores, min_group_size=1, estimator="zero_variance_groups")
    return scores.max(dim=1).values == scores.min(dim=1).values


def overlong_penalty(lengths, max_len: int, buffer_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, per response (lengths in tokens).

    With ``L_max = max_len`` and ``L_c = buffer_len``::

        0                                  if len <= L_max - L_c
        ((L_max - L_c) - len) / L_c        if L_max - L_c < len <= L_max
        -1                                 if len > L_max

    multiplied by ``factor``. The penalty is added to the task reward.
    """
    lengths = as_float_tensor(lengths, "lengths")
    check_finite(lengths, "lengths")
    if not (isinstance(max_len, (int, float)) and max_len > 0):
        raise ValueError(f"overlong_penalty: max_len must be > 0, got {max_len!r}")
    if not (isinstance(buffer_len, (int, float)) and 0 < buffer_len <= max_len):
        raise ValueError(f"overlong_penalty: buffer_len must be in (0, max_len={max_len}], got {buffer_len!r}")
    if bool((lengths < 0).any()):
        raise ValueError("overlong_penalty: lengths must be >= 0")
    expected = max_len - buffer_len
    penalty = ((expected - lengths) / buffer_len).clamp(min=-1.0, max=0.0)
    return penalty * factor
