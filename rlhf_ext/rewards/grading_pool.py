"""The grader's worker pool: math-verify in killable worker processes, with a hard per-sample time limit.

:class:`GradingPool` is what :class:`~rlhf_ext.rewards.grader.MathGrader` runs on: worker processes,
the dispatcher thread that feeds them, time limits, restarts and housekeeping. The grading API (the
options, gold preparation, the exact fast path, ``grade`` / ``grade_batch``) is the grader's.

Why a pool of worker processes, and not math-verify in the caller:

* math-verify's timeouts use SIGALRM, which only works in a main thread: OpenRLHF calls
  ``reward_func`` from ``asyncio.to_thread`` workers, where ``parse`` raises ``ValueError``.
* With those timeouts off, one answer such as ``\\boxed{9^{9^{9^{9}}}}`` can compute forever
  (math-verify issue #65), and a signal cannot interrupt work done inside one C call anyway.

So each sample runs in the main thread of a worker process (math-verify's own timeouts work there,
keeping its verdicts), and a dispatcher thread in the caller's process kills and replaces any worker
whose sample overruns ``timeout`` seconds. That sample is scored wrong with ``timeout=True``; the
other workers keep going, so one hostile sample delays no other sample by more than the limit.
A spare worker is kept warm so a replacement is instant.

Every submitted sample resolves exactly once, and no wait inside the pool is unbounded: see the
invariant at the top of :mod:`.grading_dispatcher` (live copies, requeue on worker loss, a once-a-second
check, a stall limit), and :meth:`GradingPool.wait`.

Workers are fresh interpreters started with ``subprocess`` (see :mod:`.grading_worker`), talk JSON
over pipes, die with their parent, and are started lazily on first use and stopped by
:meth:`GradingPool.close` or at interpreter exit.

This module holds the pool's caller side (options, state, ``start`` / ``submit`` / ``wait`` /
``close``, closing at exit); the rest lives by name:

* :mod:`.grading_dispatcher`: the dispatcher thread (its loop, replies, time limits, recovery);
* :mod:`.grading_scheduler`: which queued sample goes to which worker;
* :mod:`.grading_worker_handle`: a worker process as the dispatcher sees it, its start and kill;
* :mod:`.grading_records`: :class:`GradeResult` and the submitted-sample record ``_Task``;
* :mod:`.grading_sizing`: :func:`default_workers` and :func:`cgroup_cpu_limit`.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from .extraction import extract_answer
from .grading_dispatcher import _STALL_MARGIN_S, _Dispatcher
from .grading_records import GradeResult, _Task
from .grading_scheduler import _Scheduler
from .grading_worker_handle import _Worker


# How long a caller waits on the dispatcher between checks that it is still alive.
_CALLER_POLL_S = 1.0

_LIVE_POOLS: "weakref.WeakSet[GradingPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception:
            pass


class GradingPool(_Dispatcher, _Scheduler):
    """Worker processes grading prepared samples, each within ``timeout`` seconds; one future per sample.

    ``workers`` samples are graded at once, ``spare_workers`` idle processes are kept warm to replace a
    killed worker at once; ``memory_limit_mb``, ``require_anchor`` and ``test_slow_parse`` are passed
    to each worker (:mod:`.grading_worker`). :class:`~rlhf_ext.rewards.grader.MathGrader` checks these
    options and is the way to use the pool. Thread-safe; a forked child starts afresh; future
    callbacks run on the dispatcher thread.
    """

    def __init__(self, timeout: float, workers: int, *, spare_workers: int, memory_limit_mb: int,
                 require_anchor: bool, test_slow_parse: bool):
        self.timeout = float(timeout)
        # A sample running longer than this is "slow": it stops counting against `workers` (the spare
        # may start another one) and samples queued behind it in its worker's pipe are sent elsewhere.
        self._slow_after = max(0.2, min(1.0, self.timeout / 5))
        self.workers = workers
        self.spare_workers = spare_workers
        self.memory_limit_mb = memory_limit_mb
        self.require_anchor = require_anchor
        self.test_slow_parse = bool(test_slow_parse)
        self._stall_after = self.timeout + _STALL_MARGIN_S
        self._init_state()
        _LIVE_POOLS.add(self)

    # --- state ---------------------------------------------------------------------------------

    def _init_state(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: Deque[_Task] = deque()
        self._pending: Dict[int, _Task] = {}  # submitted, future not resolved yet
        self._last_progress = time.monotonic()  # a sample finished or started on a worker
        self._next_id = 0
        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._closed = False
        self._broken: Optional[str] = None
        self._wake_r, self._wake_w = None, None
        self._wake_pending = False
        self._workers: List[_Worker] = []
        self._start_failures = 0
        self._bad_golds: "OrderedDict[str, str]" = OrderedDict()
        self._gold_owner: "OrderedDict[str, _Worker]" = OrderedDict()  # the worker that has a gold cached
        self._stats = {"submitted": 0, "completed": 0, "timeouts": 0, "errors": 0, "workers_started": 0,
                       "workers_replaced": 0, "lost_requeued": 0, "stalled": 0, "fast_path": 0}

    def _check_process(self) -> None:
        # After fork() the child has this object but not its thread or workers: start afresh there.
        if self._pid != os.getpid():
            self._init_state()

    @property
    def pid(self) -> int:
        """The process whose pool this is (a forked child's copy starts afresh on first use)."""
        return self._pid

    @property
    def state(self) -> str:
        return "closed" if self._closed else ("running" if self._thread else "not started")

    def _extract(self, response) -> Optional[str]:
        """The vote key of a response answered without a worker (an error, a timeout), by this grader's rules."""
        return _safe_extract(response, self.require_anchor)

    # --- public API ----------------------------------------------------------------------------

    def start(self, wait_ready: bool = True, timeout: float = 120.0) -> "GradingPool":
        """Start the pool now instead of on first use; with ``wait_ready``, block until workers can grade."""
        self._check_process()
        with self._lock:
            if self._closed:
                raise RuntimeError("MathGrader is closed")
            self._ensure_thread()
        if wait_ready:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if self._broken:
                    raise RuntimeError(self._broken)
                if sum(1 for w in list(self._workers) if w.ready) >= self.workers:
                    break
                time.sleep(0.02)
        return self

    def wait(self, future: "Future[GradeResult]") -> GradeResult:
        """The result of a future from :meth:`submit`, waiting in bounded steps.

        ``future.result()`` works too; this also answers the future with an error if the
        dispatcher thread is gone while it is pending, so a caller can never wait forever.
        """
        while True:
            try:
                return future.result(timeout=_CALLER_POLL_S)
            except FutureTimeout:
                pass
            thread = self._thread
            if thread is not None and not thread.is_alive() and not future.done():
                # the dispatcher resolves everything pending when it exits; this covers a future it
                # could not see (it never should), after one more poll for its final answers
                try:
                    return future.result(timeout=_CALLER_POLL_S)
                except FutureTimeout:
                    result = GradeResult(False, None, False, False, self._broken or "grader dispatcher stopped")
                    try:
                        future.set_result(result)
                    except Exception:  # resolved meanwhile
                        pass
                    return future.result()

    def close(self, wait: bool = True) -> None:
        """Stop the workers; samples not yet graded resolve as errors. Idempotent."""
        if self._pid != os.getpid():
            return
        with self._lock:
            if self._closed:
                return
            self._closing = True
            self._closed = True
            thread = self._thread
            self._poke()
        if thread is not None and wait and thread is not threading.current_thread():
            thread.join(timeout=30)
        elif thread is None:
            self._fail_all("grader closed")
        _LIVE_POOLS.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> Dict[str, int]:
        """Counters: submitted, completed, timeouts, errors, workers_started, workers_replaced, fast_path
        (samples decided without a worker), queued, alive."""
        out = dict(self._stats)
        out["queued"] = len(self._queue)
        out["alive"] = sum(1 for w in list(self._workers) if w.proc.poll() is None)
        return out

    # --- submission ----------------------------------------------------------------------------

    def count_decided(self) -> bool:
        """Count one sample the fast path decided, as :meth:`submit` with ``direct`` counts it, and say
        True; False (nothing counted) when it must go through :meth:`submit`: a closed or broken pool,
        or this object in a forked child."""
        if self._pid != os.getpid():
            return False
        with self._lock:
            if self._closed or self._broken:
                return False
            stats = self._stats
            stats["submitted"] += 1
            stats["fast_path"] += 1
            stats["completed"] += 1
        return True

    def submit(self, prepared: Sequence[Tuple[str, Optional[str], Optional[GradeResult]]],
               direct: bool = False) -> list:
        """``prepared``: ``(response, gold_text, verdict)`` per sample, ``gold_text`` the gold's answer
        (None: it states none), ``verdict`` the fast path's (None: a worker grades it). One future per
        sample; with ``direct``, a sample with a verdict gets its :class:`GradeResult` itself instead
        (a future costs a lock and a condition)."""
        self._check_process()
        futures: List[Future] = []
        immediate = []  # (future, response, error): answered here, without a worker
        decided = []  # (future, GradeResult): the fast path's verdicts
        queued = False
        with self._lock:
            if self._closed:
                raise RuntimeError("MathGrader is closed")
            for response, gold_text, verdict in prepared:
                if direct and verdict is not None and not self._broken:
                    futures.append(verdict)
                    self._stats["submitted"] += 1
                    self._stats["fast_path"] += 1
                    self._stats["completed"] += 1
                    continue
                fut: Future = Future()
                futures.append(fut)
                self._stats["submitted"] += 1
                if self._broken:
                    immediate.append((fut, response, self._broken))
                    continue
                if gold_text is None:
                    immediate.append((fut, response, "the gold states no answer"))
                    continue
                if verdict is not None:
                    decided.append((fut, verdict))
                    continue
                bad = self._bad_golds.get(gold_text)
                if bad is not None:
                    immediate.append((fut, response, bad))
                    continue
                if not self._pending:
                    self._last_progress = time.monotonic()  # the stall clock counts from new work
                task = _Task(self._next_id, response, gold_text, fut)
                task.queued = True
                self._queue.append(task)
                self._pending[task.id] = task
                self._next_id += 1
                queued = True
            if queued:
                self._ensure_thread()
                if self._worker_may_starve():
                    self._poke()
            self._stats["completed"] += len(immediate) + len(decided)
            self._stats["errors"] += len(immediate)
            self._stats["fast_path"] += len(decided)
        for fut, response, why in immediate:
            fut.set_running_or_notify_cancel()
            fut.set_result(GradeResult(False, self._extract(response), False, False, why))
        for fut, verdict in decided:
            fut.set_running_or_notify_cancel()
            fut.set_result(verdict)
        return futures

    def _ensure_thread(self) -> None:  # caller holds self._lock
        if self._thread is None:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_w, False)
            self._thread = threading.Thread(target=self._run, name="rlhf-ext-grader", daemon=True)
            self._thread.start()

    def _poke(self) -> None:  # caller holds self._lock
        if self._wake_w is not None and not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass


def _safe_extract(response, require_anchor: bool = True) -> Optional[str]:
    try:
        return extract_answer(response, require_anchor=require_anchor) if isinstance(response, str) else None
    except Exception:
        return None

