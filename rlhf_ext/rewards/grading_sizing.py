"""How many grading workers to start: :func:`default_workers`, capped by :func:`cgroup_cpu_limit`.

:class:`~rlhf_ext.rewards.grader.MathGrader` uses these for its default ``workers``.
"""

from __future__ import annotations

import math
import os
from typing import Optional


def default_workers() -> int:
    """min(usable CPUs, 8): math-verify is single-threaded CPU work.

    Usable CPUs: this process's CPU affinity, capped by a container's CPU quota (cgroup ``cpu.max``,
    or ``cpu.cfs_quota_us`` on cgroup v1), so a 4-CPU pod on a 128-core node starts 4 workers, not 8.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, min(cpus, 8))


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> Optional[float]:
    """CPUs this container may use per its cgroup quota (e.g. 2.5), or None when unlimited or unknown."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:  # cgroup v2: "<quota> <period>" or "max <period>"
            quota, _, period = f.read().strip().partition(" ")
        if quota != "max" and float(period) > 0 and float(quota) > 0:
            return float(quota) / float(period)
        return None
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = float(f.read().strip())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period_us = float(f.read().strip())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None
