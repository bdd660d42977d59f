"""The grading pool's dispatcher thread: its loop, the workers' replies, time limits and recovery.

``_Dispatcher`` is a part of :class:`~rlhf_ext.rewards.grading_pool.GradingPool` (a base class; the
state it reads is the pool's). Its thread keeps the workers started (:mod:`.grading_worker_handle`),
hands queued samples out each round (``_dispatch``, :mod:`.grading_scheduler`), reads verdicts,
kills a worker whose sample overruns the time limit, replaces dead or stuck workers, and answers
each sample's future exactly once (:meth:`~_Dispatcher._resolve`).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import time
from collections import deque
from typing import Optional

from .grading_records import GradeResult, _Task
from .grading_worker_handle import _START_TIMEOUT_S, _Worker, _kill, _start_worker

logger = logging.getLogger(__name__)

# This many workers in a row dying before "ready" means they cannot start (broken install).
_MAX_START_FAILURES = 3
_BAD_GOLD_MEMORY = 4096
# The dispatcher never sleeps longer than this: each wake-up checks that every pending sample is
# queued or on a live worker (a bookkeeping slip must cost a second, never a hang).
_HOUSEKEEPING_S = 1.0
# With samples pending and none finishing or starting for this long beyond the time limit, the pool
# is wedged (a bug, not a slow sample: every sample on a worker ends by its deadline, and a new
# worker is ready or replaced within _START_TIMEOUT_S): pending samples then resolve as errors.
_STALL_MARGIN_S = _START_TIMEOUT_S + 30.0


class _Dispatcher:
    """The pool's dispatcher thread: the part of :class:`~rlhf_ext.rewards.grading_pool.GradingPool`
    that runs on it (see the module's docstring)."""

    # Invariant: every pending sample (``self._pending``) has a live copy -- in the queue or in a
    # worker's pipe -- until its future is answered, and it is answered exactly once (``_resolve``
    # ignores later copies). Every wait below is bounded; ``_housekeeping`` checks the invariant
    # once a second and requeues a sample found without a live copy, and a pool that makes no
    # progress at all for longer than a sample can take answers its pending samples with an error.

    def _run(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            self._loop()
        except BaseException as exc:  # never leave callers waiting on futures that cannot resolve
            logger.exception("rlhf_ext grader dispatcher crashed")
            self._broken = f"grader dispatcher crashed: {type(exc).__name__}: {exc}"
        finally:
            self._stop_workers()
            self._fail_all(self._broken or "grader closed")
            self._selector.close()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except (OSError, TypeError):
                    pass

    def _loop(self) -> None:
        self._next_sweep = time.monotonic() + _HOUSEKEEPING_S
        while True:
            if self._closing or self._broken:
                return
            self._maintain_pool()
            self._dispatch()
            for key, _ in self._selector.select(self._wait_time()):
                worker = key.data
                if worker is None:
                    with self._lock:
                        self._wake_pending = False
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                elif worker in self._workers:
                    self._read_replies(worker)
            self._enforce_deadlines()
            self._housekeeping()

    def _wait_time(self) -> Optional[float]:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.task is not None]
        # wake when a running sample turns slow, to rescue what waits behind it or use the spare
        deadlines += [w.head_started + self._slow_after for w in self._workers
                      if w.task is not None and w.head_started + self._slow_after > now]
        deadlines += [w.started + _START_TIMEOUT_S for w in self._workers if not w.ready]
        if self._pending:
            deadlines.append(self._next_sweep)
        soonest = min(deadlines, default=None)
        if soonest is None:  # idle: nothing pending, every worker ready; a submit wakes us
            return None
        return min(_HOUSEKEEPING_S, max(0.0, soonest - now))

    def _spawn(self) -> None:
        worker = _start_worker(self.timeout, self.memory_limit_mb, self.require_anchor, self.test_slow_parse)
        self._workers.append(worker)
        self._selector.register(worker.replies, selectors.EVENT_READ, worker)
        self._stats["workers_started"] += 1

    def _maintain_pool(self) -> None:
        target = self.workers + self.spare_workers
        while len(self._workers) < target:
            try:
                self._spawn()
            except Exception as exc:
                self._broken = f"cannot start grader workers ({sys.executable}): {type(exc).__name__}: {exc}"
                return

    def _read_replies(self, worker: _Worker) -> None:
        while True:
            try:
                message = json.loads(worker.replies.recv_bytes())
            except (EOFError, OSError, ValueError):
                self._worker_died(worker)
                return
            self._on_message(worker, message)
            try:
                if not worker.replies.poll():
                    return
            except (EOFError, OSError):
                self._worker_died(worker)
                return

    def _on_message(self, worker: _Worker, message: list) -> None:
        if message[0] == "ready":
            worker.ready = True
            self._start_failures = 0
            return
        if message[0] == "g":
            if worker.task is not None and worker.task.id == message[1]:
                worker.gold_done = True
                worker.golds_parsed.add(worker.task.gold_text)
            return
        task_id, correct, extracted, gold_parsed, error = message
        task = worker.task
        if task is None or task.id != task_id:
            return
        self._pop_head(worker)
        self._resolve(task, GradeResult(bool(correct), extracted, bool(gold_parsed), False, error))

    def _pop_head(self, worker: _Worker) -> _Task:
        """Take the sample at the head of ``worker``'s pipe off it and start the clock on the next."""
        task = worker.inflight.popleft()
        if worker in task.holders:
            task.holders.remove(worker)
        worker.begin_next()
        if worker.task is not None:
            self._last_progress = worker.head_started
        return task

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.task is not None and now >= worker.deadline:
                running = worker.task
                try:  # the verdict may have arrived while we were busy elsewhere
                    if worker.replies.poll():
                        self._read_replies(worker)
                        if worker not in self._workers or worker.task is not running:
                            continue
                except (EOFError, OSError):
                    self._worker_died(worker)
                    continue
                gold_phase_done = worker.gold_done
                task = worker.inflight.popleft()
                if worker in task.holders:
                    task.holders.remove(worker)
                self._requeue_inflight(worker)
                self._remove(worker, reason="timeout")
                if not gold_phase_done:
                    # The gold itself is hostile: remember it, so its other samples cost nothing.
                    self._remember_bad_gold(task.gold_text, f"parsing the gold timed out after {self.timeout:g}s")
                if not task.future.done():
                    self._stats["timeouts"] += 1
                self._resolve(task, GradeResult(False, self._extract(task.response), gold_phase_done, True,
                                                f"timed out after {self.timeout:g}s"))
            elif not worker.ready and now >= worker.started + _START_TIMEOUT_S:
                logger.warning("rlhf_ext grader worker %s did not start within %ss; replacing it",
                               worker.proc.pid, _START_TIMEOUT_S)
                self._remove(worker, reason="stuck")

    def _housekeeping(self) -> None:
        """Once a second while samples are pending: requeue a sample without a live copy; give up on a
        pool that has made no progress for longer than any sample can take."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + _HOUSEKEEPING_S
        with self._lock:
            pending = list(self._pending.values())
        if not pending:
            return
        lost = []
        with self._lock:
            for task in pending:
                if task.future.done():
                    self._pending.pop(task.id, None)
                elif not task.live:
                    task.queued = True
                    self._queue.appendleft(task)
                    lost.append(task.id)
        if lost:
            self._stats["lost_requeued"] += len(lost)
            logger.error("rlhf_ext grader: %d pending samples had no live copy (ids %s); requeued them. "
                         "This is a bug in the grader's bookkeeping: please report it.", len(lost), lost[:10])
        if now - self._last_progress > self._stall_after:
            why = (f"the grader made no progress for {now - self._last_progress:.0f}s with {len(pending)} samples "
                   "pending; its workers were restarted")
            logger.error("rlhf_ext grader: %s", why)
            self._stats["stalled"] += 1
            for worker in list(self._workers):
                self._remove(worker, reason="stall")
            self._fail_all(why)
            self._last_progress = now

    def _remember_bad_gold(self, gold_text: str, why: str) -> None:
        with self._lock:
            self._bad_golds[gold_text] = why
            while len(self._bad_golds) > _BAD_GOLD_MEMORY:
                self._bad_golds.popitem(last=False)

    def _requeue_inflight(self, worker: _Worker) -> None:
        """Samples that were in ``worker``'s pipe behind its head go back to the front of the queue,
        in order, unless answered already or another copy is queued or on a live worker."""
        with self._lock:
            while worker.inflight:
                task = worker.inflight.pop()
                if worker in task.holders:
                    task.holders.remove(worker)
                if not task.future.done() and not task.live:
                    task.queued = True
                    self._queue.appendleft(task)

    def _worker_died(self, worker: _Worker) -> None:
        if worker not in self._workers:
            return
        task = None
        if worker.inflight:
            task = worker.inflight.popleft()
            if worker in task.holders:
                task.holders.remove(worker)
        gold_done = worker.gold_done
        self._requeue_inflight(worker)
        was_ready = worker.ready
        self._remove(worker, reason="died")
        code = worker.proc.returncode
        if not was_ready:
            self._start_failures += 1
            if self._start_failures >= _MAX_START_FAILURES:
                self._broken = (f"grader workers exit before they are ready (exit code {code}); run "
                                f"`{sys.executable} -c \"import math_verify\"` to see why")
        if task is not None:
            self._resolve(task, GradeResult(False, self._extract(task.response), gold_done, False,
                                            f"grader worker exited unexpectedly (exit code {code})"))

    def _remove(self, worker: _Worker, reason: str) -> None:
        if worker in self._workers:
            self._workers.remove(worker)
            self._stats["workers_replaced"] += 1
        # whatever is still in its pipe goes back to the queue (a no-op if the caller did it)
        self._requeue_inflight(worker)
        self._unregister(worker)
        _kill(worker)

    def _unregister(self, worker: _Worker) -> None:
        try:
            self._selector.unregister(worker.replies)
        except (KeyError, ValueError, OSError):
            pass

    def _resolve(self, task: _Task, result: GradeResult) -> None:
        """Answer ``task``'s future unless a copy of it answered first; the only place futures resolve."""
        with self._lock:
            self._pending.pop(task.id, None)
            if task.future.done():  # the other copy of a rescued sample answered first
                return
            self._stats["completed"] += 1
            if result.error is not None:
                self._stats["errors"] += 1
        self._last_progress = time.monotonic()
        try:
            task.future.set_result(result)
        except Exception:  # already resolved or cancelled
            pass

    def _stop_workers(self) -> None:
        workers, self._workers = list(self._workers), []
        for worker in workers:
            try:
                worker.requests.close()  # EOF: an idle worker exits by itself
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        for worker in workers:
            if not worker.inflight:
                try:
                    worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            while worker.inflight:
                task = worker.inflight.popleft()
                if worker in task.holders:
                    task.holders.remove(worker)
                self._resolve(task, GradeResult(False, None, False, False, "grader closed"))
            self._unregister(worker)
            _kill(worker)

    def _fail_all(self, why: str) -> None:
        """Answer every pending sample with an error (closing, a broken pool, a stall)."""
        with self._lock:
            tasks = list(self._pending.values())
            for task in self._queue:
                task.queued = False
            self._queue = deque()
        for task in tasks:
            if task.future.done():
                with self._lock:
                    self._pending.pop(task.id, None)
            elif task.started or task.future.set_running_or_notify_cancel():
                task.started = True
                self._resolve(task, GradeResult(False, self._extract(task.response), False, False, why))
            else:  # cancelled by the caller
                with self._lock:
                    self._pending.pop(task.id, None)
