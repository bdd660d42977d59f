"""The grader's worker process: reads samples from a pipe, grades them with math-verify, writes verdicts.

Started by :class:`~rlhf_ext.rewards.grading_pool.GradingPool` (a :class:`~rlhf_ext.rewards.grader.MathGrader`'s) as
``python -c "from rlhf_ext.rewards.grading_worker import main; main()" REQ_FD RES_FD PARENT_PID MEMORY_MB
[--test-slow-parse] [--no-require-anchor]``
(a fresh interpreter, not a fork: the parent may be a Ray actor or hold threads, and
multiprocessing's spawn/forkserver would re-import the parent's ``__main__``, e.g. all of OpenRLHF,
in every worker).

Messages are length-prefixed JSON (``multiprocessing.connection.Connection`` framing), never pickle:
    request  ``[[task_id, response, gold_text_or_null], ...]``: a batch, graded in order
    replies  ``["ready", pid]`` once; ``["g", task_id]`` after a gold was parsed anew;
             ``[task_id, correct, extracted, gold_parsed, error]`` per sample.
The parent kills the worker when a sample overruns its time limit; this process only has to exit
when the parent goes away (pipe EOF, PR_SET_PDEATHSIG, or a watchdog thread as a last resort).

``--test-slow-parse`` (``MathGrader(test_slow_parse=True)``, tests only): a response containing
``<<slow:SECONDS>>`` sleeps that long after its gold is parsed, where its answer would be parsed,
standing in for a slow or hostile answer. ``--no-require-anchor`` (``MathGrader(require_anchor=False)``):
a response without an anchor is graded on its last math expression.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Connection

SLOW_PARSE_MARK = re.compile(r"<<slow:(\d+(?:\.\d+)?)>>")
GOLD_CACHE_SIZE = 4096
VERDICT_CACHE_SIZE = 65536


class _LRU(OrderedDict):
    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def get(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if len(self) > self.capacity:
            self.popitem(last=False)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # no prctl: the watchdog below still covers it
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)

    def watchdog():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watchdog, name="rlhf-ext-grader-watchdog", daemon=True).start()


def _limit_memory(memory_mb: int) -> None:
    if memory_mb <= 0:
        return
    try:
        import resource

        limit = memory_mb * 1024 * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass


def slow_parse(response: str) -> None:
    """The test hook: ``<<slow:S>>`` in a response costs S seconds where parsing its answer would."""
    mark = SLOW_PARSE_MARK.search(response)
    if mark:
        time.sleep(float(mark.group(1)))


def serve(requests: Connection, replies: Connection, test_slow_parse: bool = False,
          require_anchor: bool = True) -> None:
    """Grade samples until the request pipe closes."""
    import logging

    # Per-sample math-verify warnings ("Timeout during comparison") would flood the trainer's log;
    # the grader reports timeouts itself.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from .math_verify_recipe import grade_response

    gold_cache = _LRU(GOLD_CACHE_SIZE)
    verdict_cache = _LRU(VERDICT_CACHE_SIZE)
    # The first parse imports much of sympy lazily (about a second): pay that before "ready", not
    # out of the first sample's time limit (a replacement worker's first sample would overrun).
    try:
        grade_response("\\boxed{\\frac{1}{2}}", "0.5", None)
    except Exception:
        pass
    replies.send_bytes(json.dumps(["ready", os.getpid()]).encode())
    while True:
        try:
            batch = json.loads(requests.recv_bytes())
        except (EOFError, OSError):
            return
        for task_id, response, gold_text in batch:
            if not _grade_one(grade_response, task_id, response, gold_text, replies, gold_cache, verdict_cache,
                              test_slow_parse, require_anchor):
                return


def _grade_one(grade_response, task_id, response, gold_text, replies, gold_cache, verdict_cache,
               test_slow_parse, require_anchor=True) -> bool:
    """Grade one sample and send its verdict; False when the parent is gone."""

    def gold_done():
        replies.send_bytes(json.dumps(["g", task_id]).encode())

    try:
        out = grade_response(response, gold_text, gold_cache, on_gold_parsed=gold_done,
                             verdict_cache=verdict_cache, before_answer=slow_parse if test_slow_parse else None,
                             require_anchor=require_anchor)
        reply = [task_id, out["correct"], out["extracted"], out["gold_parsed"], None]
    except MemoryError:
        reply = [task_id, False, None, False, "MemoryError: the sample exceeded the worker's memory limit"]
    except BaseException as exc:  # anything math-verify or sympy throws becomes a verdict
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        reply = [task_id, False, None, False, f"{type(exc).__name__}: {str(exc)[:300]}"]
    try:
        replies.send_bytes(json.dumps(reply).encode())
    except (BrokenPipeError, OSError):
        return False
    return True


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    req_fd, res_fd, parent_pid, memory_mb = (int(a) for a in argv[:4])
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    requests = Connection(req_fd, writable=False)
    replies = Connection(res_fd, readable=False)
    import math_verify  # noqa: F401  -- imported before the memory limit: it maps large shared libraries

    _limit_memory(memory_mb)
    serve(requests, replies, test_slow_parse="--test-slow-parse" in argv[4:],
          require_anchor="--no-require-anchor" not in argv[4:])
