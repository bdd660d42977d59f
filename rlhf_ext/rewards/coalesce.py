"""Coalesce concurrent per-sample calls into batch calls ("group commit").

OpenRLHF 0.11.2 calls the reward file's ``reward_func([query], [prompt], [label])`` once per sample,
each from an ``asyncio.to_thread`` worker thread. Scored one by one, every sample pays the whole
per-call cost (recovering the response, the weighted reward's bookkeeping, a round trip to a grader
worker process, a wake-up of that worker); on a small node that overhead ate most of the grader's
parallel speed-up. :class:`Coalescer` runs at most ``max_inflight`` batch calls at once; calls that
arrive while that many are running join the next batch, which starts the moment one finishes. No
timer: a call that arrives when fewer batches run starts at once (no added latency when calls are
rare), and under load the batch is whatever queued while the workers were busy.

The same idea as a database's group commit: callers that would each pay a fixed cost share one.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, List, Optional, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Batch:
    __slots__ = ("items", "results", "error", "done", "has_leader")

    def __init__(self) -> None:
        self.items: list = []
        self.results: Optional[list] = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self.has_leader = False


class Coalescer(Generic[T, R]):
    """``call(items)`` returns ``batch_fn(items)``'s results for ``items``, but concurrent calls share one
    ``batch_fn`` call. ``batch_fn`` takes a list and returns a list of the same length, in order.

    ``max_inflight``: batch calls running at once (e.g. the grader's worker count: one batch per worker
    keeps them all busy while the next batch gathers). ``max_batch``: a batch closes at this size.
    An exception from ``batch_fn`` is raised in every caller whose items were in that batch.
    """

    def __init__(self, batch_fn: Callable[[List[T]], Sequence[R]], max_inflight: int = 1, max_batch: int = 256):
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1:
            raise ValueError(f"max_inflight must be a positive integer, got {max_inflight!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.batch_fn = batch_fn
        self.max_inflight = max_inflight
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._inflight = 0
        self._forming: Optional[_Batch] = None
        self.stats = {"calls": 0, "batches": 0, "items": 0}

    def call(self, items: Sequence[T]) -> List[R]:
        items = list(items)
        with self._cond:
            self.stats["calls"] += 1
            if self._inflight < self.max_inflight and self._forming is None:
                self._inflight += 1
                batch, offset, lead = _Batch(), 0, True
                batch.items = items
            else:
                batch = self._forming
                if batch is None or len(batch.items) >= self.max_batch:
                    batch = self._forming = _Batch()
                offset = len(batch.items)
                batch.items.extend(items)
                lead = not batch.has_leader
                if lead:  # the first to join runs the batch when a slot frees; later joiners just wait
                    batch.has_leader = True
                    while self._inflight >= self.max_inflight:
                        self._cond.wait()
                    if self._forming is batch:
                        self._forming = None
                    self._inflight += 1
        if lead:
            self._run(batch)
        else:
            batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return batch.results[offset:offset + len(items)]

    def _run(self, batch: _Batch) -> None:
        try:
            with self._cond:
                self.stats["batches"] += 1
                self.stats["items"] += len(batch.items)
            results = list(self.batch_fn(batch.items))
            if len(results) != len(batch.items):
                raise ValueError(f"batch function returned {len(results)} results for {len(batch.items)} items")
            batch.results = results
        except BaseException as exc:  # every caller of this batch sees it
            batch.error = exc
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()
            batch.done.set()
