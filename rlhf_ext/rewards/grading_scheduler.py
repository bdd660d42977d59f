"""Which queued sample goes to which grading worker, and when: the pool's scheduling.

``_Scheduler`` is a part of :class:`~rlhf_ext.rewards.grading_pool.GradingPool` (a base class; the
state it reads, ``_queue``, ``_workers``, ``_lock``, ``_gold_owner``, ..., is the pool's). Its
:meth:`~_Scheduler._dispatch` runs on the dispatcher thread (:mod:`.grading_dispatcher`) each round:
it rescues samples stuck behind a slow one, then plans which samples each worker takes (the shortest
pipe first, a worker's cached golds first) and sends each worker its share in one message.
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Optional

from .grading_records import GradeResult, _Task
from .grading_worker_handle import _Worker

# Samples a worker may hold at once (the one it grades and those waiting in its pipe), and how few may
# wait before it is refilled: deep enough that it never idles while the caller turns its verdicts
# into the next submissions, refilled in batches so that a burst costs a few messages, not one each.
_PIPELINE_DEPTH = 8
_REFILL_AT = 2
# How far into the queue the dispatcher looks for a sample whose gold a worker has cached.
_AFFINITY_WINDOW = 64
_GOLD_OWNER_MEMORY = 4096


class _Scheduler:
    """The pool's scheduling: the part of :class:`~rlhf_ext.rewards.grading_pool.GradingPool` that
    decides which worker grades which queued sample (see the module's docstring)."""

    def _is_slow(self, worker: _Worker, now: float) -> bool:
        return worker.task is not None and now - worker.head_started >= self._slow_after

    def _worker_may_starve(self) -> bool:  # caller holds self._lock
        """Whether the dispatcher must be woken for new samples now. Not when every ready worker has
        samples waiting behind the one it grades: its next verdict wakes the dispatcher anyway (or the
        head's slow mark or deadline does), and the samples go out then, together. This halves the
        dispatcher's wake-ups when threads submit one sample each, as OpenRLHF's do."""
        now, fresh, idle = time.monotonic(), 0, False
        for w in list(self._workers):  # read without the dispatcher's cooperation: len() of a deque is atomic
            if not w.ready:
                continue
            held = len(w.inflight)
            if held == 0:
                idle = True
                continue
            try:
                slow = self._is_slow(w, now)
            except IndexError:  # its last sample was answered just now
                return True
            if not slow:
                fresh += 1
                if held == 1:
                    return True
        return fresh == 0 or (idle and fresh < self.workers)

    def _dispatch(self) -> None:
        now = time.monotonic()
        fresh = 0  # workers whose current sample is not (yet) slow
        for w in self._workers:
            if not w.inflight:
                continue
            if not self._is_slow(w, now):
                fresh += 1
                continue
            # Samples waiting behind a slow one would wait up to the whole time limit: copy them to
            # the front of the queue unless a copy is queued already or waits behind a fresh sample;
            # whichever copy finishes first answers (see _resolve).
            waiting = [t for t in list(w.inflight)[1:] if not t.queued and not t.future.done()
                       and all(h.task is not t and self._is_slow(h, now) for h in t.holders)]
            if waiting:
                with self._lock:
                    for task in reversed(waiting):
                        task.queued = True
                        self._queue.appendleft(task)
        # Plan this round: each sample goes to the usable worker with the shortest pipe, so a burst
        # spreads evenly; then each worker gets its share in ONE message. Concurrent per-sample
        # calls (OpenRLHF's reward threads) thus reach a worker as a batch of whatever queued
        # while it was busy: no round trip per sample, and no waiting window when calls are rare.
        plan: Dict[_Worker, List[_Task]] = {}
        planned_bytes: Dict[_Worker, int] = {}
        full: set = set()  # workers that take nothing more this round
        while True:
            worker = self._next_worker(now, fresh, plan, full)
            if worker is None:
                break
            idle = not worker.inflight and not plan.get(worker)
            task = self._take_task(worker, idle, planned_bytes.get(worker, 0), now)
            if task is None:
                full.add(worker)
                continue
            if not task.started:
                if not task.future.set_running_or_notify_cancel():  # cancelled by the caller
                    with self._lock:
                        self._pending.pop(task.id, None)
                    continue
                task.started = True
            bad = self._bad_golds.get(task.gold_text)
            if bad is not None:
                self._resolve(task, GradeResult(False, self._extract(task.response), False, False, bad))
                continue
            plan.setdefault(worker, []).append(task)
            planned_bytes[worker] = planned_bytes.get(worker, 0) + len(task.payload)
            self._note_gold(worker, task.gold_text)  # now: later picks of this round see it
            if idle:
                fresh += 1
        for worker, tasks in plan.items():
            message = b"[" + b",".join(t.payload for t in tasks) + b"]"
            try:
                worker.requests.send_bytes(message)
            except OSError:
                with self._lock:
                    for task in reversed(tasks):
                        task.queued = True
                        self._queue.appendleft(task)
                self._worker_died(worker)
                continue
            was_idle = not worker.inflight
            for task in tasks:
                worker.inflight.append(task)
                task.holders.append(worker)
            if was_idle:
                worker.begin_next()
                self._last_progress = worker.head_started

    def _next_worker(self, now: float, fresh: int, plan: Dict[_Worker, List[_Task]], full: set) -> Optional[_Worker]:
        """The worker with the fewest samples in its pipe (counting this round's plan) that takes more now.

        An idle worker takes samples only while fewer than ``workers`` samples run fresh (the spare
        stands in for a worker stuck on a slow sample). A busy one is refilled, up to
        ``_PIPELINE_DEPTH``, once no more than ``_REFILL_AT`` samples wait behind the one it grades,
        and only behind a sample that is not slow: so a steady stream reaches it a few at a time,
        one message each, and it never idles for a round trip.
        """
        best, best_load = None, _PIPELINE_DEPTH
        for w in self._workers:
            if not w.ready or w in full:
                continue
            planned = len(plan.get(w, ()))
            load = len(w.inflight) + planned
            if load >= best_load:
                continue
            if not w.inflight:
                if not planned and fresh >= self.workers:
                    continue
            elif self._is_slow(w, now) or (not planned and len(w.inflight) - 1 > _REFILL_AT):
                continue
            best, best_load = w, load
        return best

    def _take_task(self, worker: _Worker, idle: bool, planned_bytes: int, now: float) -> Optional[_Task]:
        """Take a queued sample for ``worker`` off the queue: among the first few queued, one whose gold
        this worker parsed or was sent lately (its gold cache then answers; a GRPO group's samples
        share a gold), else one whose gold no live worker has, else the first it may take. A sample
        goes into a busy worker's pipe only if the pipe surely has room (a blocking write to a worker
        stuck on a hostile sample would stall the dispatcher), never to a worker holding a copy."""
        with self._lock:
            while self._queue and self._queue[0].future.done():  # rescued copies answered meanwhile
                task = self._queue.popleft()
                task.queued = False
                self._pending.pop(task.id, None)
            if not self._queue:
                return None
            room = math.inf if idle else worker.pipe_budget - planned_bytes - sum(
                len(t.payload) for t in list(worker.inflight)[1:])
            affine = fresh_gold = first = None
            for i, task in enumerate(self._queue):
                if i >= _AFFINITY_WINDOW:
                    break
                if task.future.done() or worker in task.holders or len(task.payload) > room:
                    continue
                owner = self._gold_owner.get(task.gold_text)
                if owner is worker:
                    affine = i
                    break
                if first is None:
                    first = i
                if fresh_gold is None and (owner is None or owner not in self._workers or self._is_slow(owner, now)):
                    fresh_gold = i
            pick = next((i for i in (affine, fresh_gold, first) if i is not None), None)
            if pick is None:
                return None
            task = self._queue[pick]
            del self._queue[pick]
            task.queued = False
            return task

    def _note_gold(self, worker: _Worker, gold_text: str) -> None:
        owner = self._gold_owner.get(gold_text)
        if owner is None or owner not in self._workers:
            self._gold_owner[gold_text] = worker
        self._gold_owner.move_to_end(gold_text)
        while len(self._gold_owner) > _GOLD_OWNER_MEMORY:
            self._gold_owner.popitem(last=False)
