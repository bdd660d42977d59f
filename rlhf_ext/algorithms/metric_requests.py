"""Which metrics a policy loss computes: all of them, unless the caller asks for fewer.

The registered losses return, beside the per-token loss, a dict of detached metrics (clip
fractions, ``ppo_kl``, ratio and gate means...). Each costs a few passes over the micro-batch, which
is what a host that does not log them (OpenRLHF with ``--rlhf_ext.step_metrics off``) should not
pay. Inside :func:`only_metrics` a loss computes just the named metrics (a loss that does not know
this module computes all, which is still correct); outside, every metric, as before.
"""

from __future__ import annotations

import contextlib
import threading
from typing import FrozenSet, Iterable, Iterator, Optional

_requests = threading.local()


@contextlib.contextmanager
def only_metrics(names: Optional[Iterable[str]]) -> Iterator[None]:
    """Within the block, losses compute only the metrics in ``names`` (``None``: all of them)."""
    outer = getattr(_requests, "names", None)
    _requests.names = None if names is None else frozenset(names)
    try:
        yield
    finally:
        _requests.names = outer


def metric_wanted(name: str) -> bool:
    """Whether the caller wants the metric ``name`` (always, outside :func:`only_metrics`)."""
    names: Optional[FrozenSet[str]] = getattr(_requests, "names", None)
    return names is None or name in names
