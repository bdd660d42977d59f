"""Which metrics a policy loss computes: all of them, unless the caller asks for fewer.

The registered losses return, beside the per-token loss, a dict of detached metrics (clip
fractions, ``ppo_kl``, ratio and gate means...). Each costs a few passes over the micro-batch, which
is what a host that does not log them (OpenRLHF with ``--rlhf_ext.step_metrics off``) should not
pay. Inside :func:`only_metrics` a loss computes just the named metrics (a loss that does not know
this module computes all, which is still correct); outside, every metric, as before.
"""

from __future__ import annotations

import threading
from typing import FrozenSet, Iterable, Optional

_requests = threading.local()


class only_metrics:  # noqa: N801 (used as a function: ``with only_metrics(names):``)
    """Within the block, losses compute only the metrics in ``names`` (``None``: all of them).

    A class rather than a ``contextlib`` generator: the OpenRLHF host enters it on every micro-batch,
    and this costs a fraction of a generator-based context manager."""

    __slots__ = ("_names", "_outer")

    def __init__(self, names: Optional[Iterable[str]]):
        self._names = None if names is None else frozenset(names)

    def __enter__(self) -> None:
        self._outer = getattr(_requests, "names", None)
        _requests.names = self._names

    def __exit__(self, *exc) -> None:
        _requests.names = self._outer


def metric_wanted(name: str) -> bool:
    """Whether the caller wants the metric ``name`` (always, outside :func:`only_metrics`)."""
    names: Optional[FrozenSet[str]] = getattr(_requests, "names", None)
    return names is None or name in names
