"""A grading worker process as the pool's dispatcher sees it: the ``_Worker`` handle, and how one is
started (:func:`_start_worker`) and killed (:func:`_kill`).

The process itself runs :mod:`.grading_worker`: a fresh interpreter started with ``subprocess``,
talking JSON over two pipes (requests in, replies out), that dies with its parent.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Deque, Optional

from .grading_records import _Task

logger = logging.getLogger(__name__)

_BOOTSTRAP = "from rlhf_ext.rewards.grading_worker import main; main()"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A worker that has not said "ready" by then is stuck (e.g. a hung filesystem) and is replaced.
_START_TIMEOUT_S = 60.0
# Samples are queued in a busy worker's pipe only while they surely fit its buffer (64 KiB on Linux
# unless the system is short of pipe pages: asked with F_GETPIPE_SZ): a blocking write to a worker
# stuck on a hostile sample would stall the dispatcher. This is the budget when the size is unknown.
_PIPELINE_MAX_BYTES = 16 * 1024


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


def _start_worker(timeout: float, memory_limit_mb: int, require_anchor: bool, test_slow_parse: bool) -> _Worker:
    """Start a worker process for a pool with these options; it says "ready" once it can grade."""
    req_r, req_w = os.pipe()
    res_r, res_w = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [sys.executable, "-c", _BOOTSTRAP, str(req_r), str(res_w), str(os.getpid()), str(memory_limit_mb)]
    if test_slow_parse:
        argv.append("--test-slow-parse")
    if not require_anchor:
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
    return _Worker(proc, Connection(req_w, readable=False), Connection(res_r, writable=False), timeout)


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
