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
invariant at the top of the dispatcher section (live copies, requeue on worker loss, a once-a-second
check, a stall limit), and :meth:`GradingPool.wait`.

Workers are fresh interpreters started with ``subprocess`` (see :mod:`.grading_worker`), talk JSON
over pipes, die with their parent, and are started lazily on first use and stopped by
:meth:`GradingPool.close` or at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import selectors
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from .extraction import extract_answer

logger = logging.getLogger(__name__)

_BOOTSTRAP = "from rlhf_ext.rewards.grading_worker import main; main()"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A worker that has not said "ready" by then is stuck (e.g. a hung filesystem) and is replaced.
_START_TIMEOUT_S = 60.0
# This many workers in a row dying before "ready" means they cannot start (broken install).
_MAX_START_FAILURES = 3
_BAD_GOLD_MEMORY = 4096
# Samples are queued in a busy worker's pipe only while they surely fit its buffer (64 KiB on Linux
# unless the system is short of pipe pages: asked with F_GETPIPE_SZ): a blocking write to a worker
# stuck on a hostile sample would stall the dispatcher. This is the budget when the size is unknown.
_PIPELINE_MAX_BYTES = 16 * 1024
# Samples a worker may hold at once (the one it grades and those waiting in its pipe), and how few may
# wait before it is refilled: deep enough that it never idles while the caller turns its verdicts
# into the next submissions, refilled in batches so that a burst costs a few messages, not one each.
_PIPELINE_DEPTH = 8
_REFILL_AT = 2
# How far into the queue the dispatcher looks for a sample whose gold a worker has cached.
_AFFINITY_WINDOW = 64
_GOLD_OWNER_MEMORY = 4096
# The dispatcher never sleeps longer than this: each wake-up checks that every pending sample is
# queued or on a live worker (a bookkeeping slip must cost a second, never a hang).
_HOUSEKEEPING_S = 1.0
# With samples pending and none finishing or starting for this long beyond the time limit, the pool
# is wedged (a bug, not a slow sample: every sample on a worker ends by its deadline, and a new
# worker is ready or replaced within _START_TIMEOUT_S): pending samples then resolve as errors.
_STALL_MARGIN_S = _START_TIMEOUT_S + 30.0
# How long a caller waits on the dispatcher between checks that it is still alive.
_CALLER_POLL_S = 1.0


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one response.

    ``correct``: math-verify says the final answer equals the gold.
    ``extracted``: the response's final answer, normalized (a majority-vote key); None if it states none.
    ``gold_parsed``: the gold yielded an answer math-verify could parse; when False the sample is
    scored wrong and should be reported, not trained on as if the model erred.
    ``timeout``: grading overran the time limit and was killed (scored wrong).
    ``error``: why grading failed, if it did (scored wrong).
    """

    correct: bool
    extracted: Optional[str]
    gold_parsed: bool
    timeout: bool = False
    error: Optional[str] = None

    def as_dict(self) -> dict:
        return asdict(self)


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


class _Task:
    """One submitted sample. It may have several live copies: at most one in the queue (``queued``)
    and one in the pipe of each worker in ``holders`` (a copy rescued from behind a slow sample runs
    on another worker while the original still waits). Whichever copy answers first resolves the
    future; a copy lost with its worker is requeued unless another live copy remains."""

    __slots__ = ("id", "response", "gold_text", "future", "started", "queued", "holders", "_payload")

    def __init__(self, task_id: int, response: str, gold_text: Optional[str], future: Future):
        self.id = task_id
        self.response = response
        self.gold_text = gold_text
        self.future = future
        self.started = False  # future set running (it stays so when requeued after a worker died)
        self.queued = False  # a copy is in the grader's queue
        self.holders: List["_Worker"] = []  # workers with a copy in their pipe (head or waiting)
        self._payload: Optional[bytes] = None

    @property
    def live(self) -> bool:
        """Some copy is queued or on a worker, so the future will be answered."""
        return self.queued or bool(self.holders)

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            self._payload = json.dumps([self.id, self.response, self.gold_text]).encode()
        return self._payload


class _Worker:
    """A worker process as the dispatcher sees it.

    ``inflight[0]`` is the sample being graded, since ``head_started``, with ``deadline``;
    ``inflight[1]`` (if any) waits in the pipe so that the worker never idles for a round trip
    between samples.
    """

    __slots__ = ("proc", "requests", "replies", "ready", "inflight", "deadline", "head_started", "started",
                 "golds_parsed", "gold_done", "pipe_budget", "_timeout")

    def __init__(self, proc: subprocess.Popen, requests: Connection, replies: Connection, timeout: float):
        self._timeout = timeout
        self.proc = proc
        self.requests = requests
        self.replies = replies
        self.ready = False
        self.inflight: Deque[_Task] = deque()
        self.deadline = math.inf
        self.head_started = math.inf
        self.started = time.monotonic()
        self.golds_parsed: set = set()
        self.gold_done = False
        self.pipe_budget = _pipe_budget(requests.fileno())

    @property
    def task(self) -> Optional[_Task]:
        return self.inflight[0] if self.inflight else None

    def begin_next(self) -> None:
        """Start the clock on the sample now at the head of ``inflight``."""
        task = self.task
        if task is None:
            self.deadline = self.head_started = math.inf
            return
        self.head_started = time.monotonic()
        self.deadline = self.head_started + self._timeout
        self.gold_done = task.gold_text in self.golds_parsed



_LIVE_POOLS: "weakref.WeakSet[GradingPool]" = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        try:
            pool.close()
        except Exception:
            pass


class GradingPool:
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

    def _poke(self) -> None:  # caller holds self._lock
        if self._wake_w is not None and not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    # --- dispatcher thread ---------------------------------------------------------------------
    #
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
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        argv = [sys.executable, "-c", _BOOTSTRAP, str(req_r), str(res_w), str(os.getpid()), str(self.memory_limit_mb)]
        if self.test_slow_parse:
            argv.append("--test-slow-parse")
        if not self.require_anchor:
            argv.append("--no-require-anchor")
        try:
            proc = subprocess.Popen(argv, pass_fds=(req_r, res_w), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, env=env)
        except Exception:
            for fd in (req_r, req_w, res_r, res_w):
                os.close(fd)
            raise
        finally:
            for fd in (req_r, res_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        worker = _Worker(proc, Connection(req_w, readable=False), Connection(res_r, writable=False), self.timeout)
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

    def _is_slow(self, worker: _Worker, now: float) -> bool:
        return worker.task is not None and now - worker.head_started >= self._slow_after

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


def _pipe_budget(fd: int) -> int:
    """Bytes of samples that may wait in a worker's request pipe: 3/4 of its buffer (message headers
    and what the worker holds already are the rest)."""
    try:
        import fcntl

        return max(1024, fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) * 3 // 4)
    except (ImportError, AttributeError, OSError):
        return _PIPELINE_MAX_BYTES


def _kill(worker: _Worker) -> None:
    for conn in (worker.requests, worker.replies):
        try:
            conn.close()
        except OSError:
            pass
    if worker.proc.poll() is None:
        try:
            worker.proc.kill()
        except OSError:
            pass
    try:
        worker.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        logger.warning("rlhf_ext grader worker %s did not exit after SIGKILL", worker.proc.pid)


def _safe_extract(response, require_anchor: bool = True) -> Optional[str]:
    try:
        return extract_answer(response, require_anchor=require_anchor) if isinstance(response, str) else None
    except Exception:
        return None

