"""Numerical helpers of the report: moving averages, downsampling for display, window statistics.

All are pure numpy functions of 1-D arrays. Smoothing happens on the full-resolution series and
downsampling only afterwards, so what the page shows for a 10,000-step run is the moving average
of all 10,000 steps, thinned to what a screen can show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np


def _vector(values, who: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{who}: expected a 1-D sequence, got shape {x.shape}")
    return x


def moving_average(values, window: int) -> np.ndarray:
    """Trailing moving average over the last ``window`` entries, ignoring NaN.

    Entry ``i`` is the mean of the finite values among ``values[max(0, i - window + 1) : i + 1]``
    (the first ``window - 1`` entries average what exists so far), NaN when there is none. The
    window counts logged points, not steps: a metric logged every 10 steps with ``window=5``
    averages 50 steps. ``window=1`` returns the values themselves (NaN stays NaN).
    """
    x = _vector(values, "moving_average")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"moving_average: window must be a positive integer, got {window!r}")
    finite = np.isfinite(x)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, x, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    hi = np.arange(1, len(x) + 1)
    lo = np.maximum(hi - window, 0)
    n = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (sums[hi] - sums[lo]) / n
    out[n == 0] = np.nan
    return out


def minmax_downsample(x, y, max_points: int) -> Tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points of a line that keep its shape: in each of ``max_points // 2``
    equal index buckets, the minimum and the maximum, in x order.

    Spikes survive (a single NaN-adjacent 1e6 grad norm is still drawn), unlike stride sampling.
    The first and last points are always kept, so a run ends where it ends. Inputs must be finite
    and sorted by x; series short enough are returned unchanged.
    """
    x, y = _vector(x, "minmax_downsample"), _vector(y, "minmax_downsample")
    if x.shape != y.shape:
        raise ValueError(f"minmax_downsample: x has {len(x)} points but y has {len(y)}")
    if max_points < 4:
        raise ValueError(f"minmax_downsample: max_points must be >= 4, got {max_points}")
    n = len(x)
    if n <= max_points:
        return x, y
    # two slots for the end points, two per bucket
    buckets = (max_points - 2) // 2
    edges = np.linspace(1, n - 1, buckets + 1).astype(np.int64)
    keep = [0]
    for start, stop in zip(edges[:-1], edges[1:]):
        if stop <= start:
            continue
        seg = y[start:stop]
        a, b = start + int(np.argmin(seg)), start + int(np.argmax(seg))
        keep.extend(sorted({a, b}))
    keep.append(n - 1)
    idx = np.unique(np.asarray(keep, dtype=np.int64))
    return x[idx], y[idx]


def stride_downsample(x, y, max_points: int) -> Tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` evenly spaced points (first and last kept); for smooth curves such
    as moving averages, where min/max buckets would add jitter."""
    x, y = _vector(x, "stride_downsample"), _vector(y, "stride_downsample")
    if x.shape != y.shape:
        raise ValueError(f"stride_downsample: x has {len(x)} points but y has {len(y)}")
    if max_points < 2:
        raise ValueError(f"stride_downsample: max_points must be >= 2, got {max_points}")
    n = len(x)
    if n <= max_points:
        return x, y
    idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return x[idx], y[idx]


@dataclass(frozen=True)
class WindowStats:
    """Mean and spread of the last ``n`` logged values of a metric."""

    mean: float
    sd: float
    """Sample standard deviation (ddof=1) of the values: the step-to-step noise."""
    n: int
    first_step: int
    last_step: int

    @property
    def sem(self) -> float:
        """Standard error of :attr:`mean`, treating steps as independent (approximately true:
        each step draws a fresh batch, but the policy drifts between steps)."""
        return self.sd / np.sqrt(self.n) if self.n > 1 else float("nan")


def final_window(steps, values, k: int) -> Optional[WindowStats]:
    """Statistics of the last ``k`` finite values (fewer when fewer exist); None when none."""
    steps, values = _vector(steps, "final_window"), _vector(values, "final_window")
    finite = np.isfinite(values)
    s, v = steps[finite][-k:], values[finite][-k:]
    if not len(v):
        return None
    sd = float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
    return WindowStats(mean=float(v.mean()), sd=sd, n=len(v), first_step=int(s[0]), last_step=int(s[-1]))


def first_window(steps, values, k: int) -> Optional[WindowStats]:
    """Like :func:`final_window`, for the first ``k`` finite values."""
    steps, values = _vector(steps, "first_window"), _vector(values, "first_window")
    finite = np.isfinite(values)
    s, v = steps[finite][:k], values[finite][:k]
    if not len(v):
        return None
    sd = float(np.std(v, ddof=1)) if len(v) > 1 else float("nan")
    return WindowStats(mean=float(v.mean()), sd=sd, n=len(v), first_step=int(s[0]), last_step=int(s[-1]))


def difference_exceeds_noise(a: WindowStats, b: WindowStats, z: float = 2.0) -> Optional[bool]:
    """Whether ``|a.mean - b.mean|`` exceeds ``z`` standard errors of the difference (Welch's
    standard error ``sqrt(sd_a^2/n_a + sd_b^2/n_b)``, Welch 1947); None when either window has
    fewer than two values (no noise estimate)."""
    if a.n < 2 or b.n < 2:
        return None
    se = float(np.sqrt(a.sd**2 / a.n + b.sd**2 / b.n))
    diff = abs(a.mean - b.mean)
    if se == 0.0:
        return diff > 0.0
    return diff > z * se
