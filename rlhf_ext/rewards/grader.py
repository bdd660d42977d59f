"""MathGrader: math-verify verdicts from any thread or process, with a hard per-sample time limit.

The grading API: its options, :class:`GradeResult`, ``grade`` / ``grade_batch`` / ``submit``. Each
gold's answer is read here (:func:`~rlhf_ext.rewards.extraction.prepare_gold`) and a plain-number
sample is decided exactly in the calling process (:mod:`.exact_numbers`); every other sample goes to
a pool of killable worker processes, :mod:`.grading_pool` (why a pool, and how it keeps every wait
bounded, is told there).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from concurrent.futures import Future
from typing import Dict, List, Optional, Sequence

from .exact_numbers import exact_verdict
from .extraction import prepare_gold
from .grading_pool import GradingPool
from .grading_records import GradeResult
from .grading_sizing import cgroup_cpu_limit, default_workers

logger = logging.getLogger(__name__)

__all__ = ["GradeResult", "MathGrader", "cgroup_cpu_limit", "default_grader", "default_workers"]


class MathGrader:
    """Grade responses against golds with math-verify in a pool of killable worker processes.

    ``timeout``: hard limit in seconds for one sample on a worker (queueing time not counted).
    ``workers``: samples graded at once; None -> :func:`default_workers`.
    ``spare_workers``: extra idle processes kept warm to replace a killed worker at once.
    ``memory_limit_mb``: address-space limit of each worker (a hostile ``10^{10^{10}}`` then fails
    with MemoryError instead of eating the node's memory); 0 disables it.
    ``require_anchor``: True (the default, for rewards) grades only an answer the response states
    with an anchor (``\\boxed{}``, ``<answer>``, "the answer is", ``####``), as Open-R1's accuracy
    reward does, which rewards the format too. False (evaluation) falls back, when there is no
    anchor, to the response's last math expression or number, as lighteval and math-verify do
    (``try_extract_without_anchor``) and as published AIME / MATH-500 numbers are produced.

    Thread-safe; usable as a context manager; pickles as its configuration (a copy starts its own
    pool). Future callbacks (``submit(...).add_done_callback``) run on the grader's dispatcher
    thread: keep them short.

    ``fast_path``: True (the default) decides a sample whose gold is a plain number (integer, decimal,
    fraction, percentage) and whose answer is one too, or states none, exactly in the calling
    process, without a worker (:mod:`.exact_numbers`); the verdict is the one the workers would give.
    False (and ``test_slow_parse``) sends every sample to the workers.

    ``test_slow_parse``: a test hook, off in real use. When on, a response containing
    ``<<slow:SECONDS>>`` makes its worker sleep that long where it would parse the answer, which is how the
    tests produce overrunning and slow samples at chosen moments without a real hostile answer.

    The workers, their time limits, restarts and housekeeping are the pool's
    (:class:`~rlhf_ext.rewards.grading_pool.GradingPool`); the grader checks the options, reads each
    gold's answer and decides plain numbers itself before a sample reaches the pool.
    """

    def __init__(self, timeout: float = 5.0, workers: Optional[int] = None, *, spare_workers: int = 1,
                 memory_limit_mb: int = 4096, require_anchor: bool = True, fast_path: bool = True,
                 test_slow_parse: bool = False):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive integer or None, got {workers!r}")
        if isinstance(spare_workers, bool) or not isinstance(spare_workers, int) or spare_workers < 0:
            raise ValueError(f"spare_workers must be a non-negative integer, got {spare_workers!r}")
        if isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, int) or memory_limit_mb < 0:
            raise ValueError(f"memory_limit_mb must be a non-negative integer (0 = no limit), got {memory_limit_mb!r}")
        if not isinstance(require_anchor, bool):
            raise ValueError(f"require_anchor must be True or False, got {require_anchor!r}")
        if not isinstance(fast_path, bool):
            raise ValueError(f"fast_path must be True or False, got {fast_path!r}")
        if memory_limit_mb and memory_limit_mb < 512:
            raise ValueError(f"memory_limit_mb={memory_limit_mb} is too small for Python with sympy (use >= 512)")
        self.timeout = float(timeout)
        self.workers = workers if workers is not None else default_workers()
        self.spare_workers = spare_workers
        self.memory_limit_mb = memory_limit_mb
        self.require_anchor = require_anchor
        self.fast_path = fast_path
        self.test_slow_parse = bool(test_slow_parse)
        self._pool = GradingPool(self.timeout, self.workers, spare_workers=spare_workers,
                                 memory_limit_mb=memory_limit_mb, require_anchor=require_anchor,
                                 test_slow_parse=self.test_slow_parse)

    def __getstate__(self):
        return {"timeout": self.timeout, "workers": self.workers, "spare_workers": self.spare_workers,
                "memory_limit_mb": self.memory_limit_mb, "require_anchor": self.require_anchor,
                "fast_path": self.fast_path, "test_slow_parse": self.test_slow_parse}

    def __setstate__(self, state):
        self.__init__(**state)

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"MathGrader(timeout={self.timeout}, workers={self.workers}, require_anchor={self.require_anchor}, "
                f"{self._pool.state})")

    # --- public API ----------------------------------------------------------------------------

    def start(self, wait_ready: bool = True, timeout: float = 120.0) -> "MathGrader":
        """Start the pool now instead of on first use; with ``wait_ready``, block until workers can grade."""
        self._pool.start(wait_ready, timeout)
        return self

    def submit(self, response: str, gold) -> "Future[GradeResult]":
        """Queue one sample; the future always resolves to a :class:`GradeResult` (never an exception)."""
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}")
        return self._submit_many([response], [gold])[0]

    def grade(self, response: str, gold) -> GradeResult:
        """Grade one sample, blocking; never raises for a bad sample."""
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}")
        # the fast path's verdict comes back as it is, without a future (OpenRLHF grades one sample a call)
        prepared = self._prepare(response, gold)
        if prepared[2] is not None and self._pool.count_decided():
            return prepared[2]
        out = self._pool.submit([prepared], direct=True)[0]
        return out if isinstance(out, GradeResult) else self.wait(out)

    def grade_batch(self, responses: Sequence[str], golds: Sequence) -> List[GradeResult]:
        """Grade many samples in parallel across the workers; results in input order."""
        responses, golds = list(responses), list(golds)
        if len(responses) != len(golds):
            raise ValueError(f"grade_batch needs one gold per response: got {len(responses)} responses "
                             f"and {len(golds)} golds")
        for i, r in enumerate(responses):
            if not isinstance(r, str):
                raise TypeError(f"responses[{i}] must be a str, got {type(r).__name__}")
        if not responses:
            return []
        # the fast path's verdicts come back as they are, without a future each
        return [f if isinstance(f, GradeResult) else self.wait(f)
                for f in self._submit_many(responses, golds, direct=True)]

    def wait(self, future: "Future[GradeResult]") -> GradeResult:
        """The result of a future from :meth:`submit`, waiting in bounded steps.

        ``future.result()`` works too; this also answers the future with an error if the
        dispatcher thread is gone while it is pending, so a caller can never wait forever.
        """
        return self._pool.wait(future)

    def close(self, wait: bool = True) -> None:
        """Stop the workers; samples not yet graded resolve as errors. Idempotent."""
        self._pool.close(wait)

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def stats(self) -> Dict[str, int]:
        """Counters: submitted, completed, timeouts, errors, workers_started, workers_replaced, fast_path
        (samples decided without a worker), queued, alive."""
        return self._pool.stats()

    # --- submission ----------------------------------------------------------------------------

    def _submit_many(self, responses: Sequence[str], golds: Sequence, direct: bool = False) -> list:
        """One future per sample; with ``direct``, a sample the fast path decides gets its
        :class:`GradeResult` itself instead (a future costs a lock and a condition)."""
        # Outside the pool's lock: the golds' answers, and the fast path's exact verdicts (string work
        # and fractions, linear in the response), so that concurrent submitters do not queue behind it.
        return self._pool.submit([self._prepare(response, gold) for response, gold in zip(responses, golds)], direct)

    def _prepare(self, response: str, gold) -> tuple:
        """``(response, gold_text, verdict)`` as the pool takes a sample: the gold's answer (None: it states
        none) and the fast path's verdict (None: a worker grades it)."""
        try:
            gold_text = prepare_gold(gold)
        except Exception as exc:  # an exotic gold object must not break the batch
            gold_text = None
            logger.debug("prepare_gold failed: %r", exc)
        return response, gold_text, self._fast_verdict(response, gold_text)

    def _fast_verdict(self, response, gold_text: Optional[str]) -> Optional[GradeResult]:
        """The exact verdict on a plain-number sample (:mod:`.exact_numbers`), or None: a worker grades it."""
        if not self.fast_path or gold_text is None or not isinstance(response, str):
            return None
        if self.test_slow_parse:
            return None  # the test hook exercises the pool itself: every sample reaches a worker
        try:
            # golds and verdicts are remembered there (one look-up per sample of a GRPO group)
            out = exact_verdict(response, gold_text, self.require_anchor)
        except Exception:
            return None
        if out is None:
            return None
        return _fast_result(out["correct"], out["extracted"], out["gold_parsed"])


@functools.lru_cache(maxsize=4096)
def _fast_result(correct: bool, extracted: Optional[str], gold_parsed: bool) -> GradeResult:
    # GradeResult is frozen: one object per verdict is shared (a frozen dataclass costs a microsecond
    # to build, a tenth of a one-sample reward call)
    return GradeResult(correct, extracted, gold_parsed, False, None)



_default_grader: Optional[MathGrader] = None
_default_grader_lock = threading.Lock()


def default_grader() -> MathGrader:
    """The process-wide grader that reward functions use when none is passed (timeout 5 s, default workers)."""
    global _default_grader
    with _default_grader_lock:
        if _default_grader is None or _default_grader.closed or _default_grader._pool.pid != os.getpid():
            _default_grader = MathGrader()
        return _default_grader
