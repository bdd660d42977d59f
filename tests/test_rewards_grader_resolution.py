"""Issue 17, item 1: every submitted sample resolves exactly once, whatever the workers do.

Overrunning and slow samples are made with the grader's test hook (``test_slow_parse``: a
response containing ``<<slow:S>>`` sleeps S seconds in its worker before it is graded), so the
interleavings are chosen, not hoped for. Real worker processes, real kills, real math-verify.
"""

import random
import time
from concurrent.futures import wait

import pytest

from rlhf_ext.rewards import MathGrader

TIMEOUT = 1.0  # per-sample limit; the grader calls a sample slow after max(0.2, TIMEOUT/5) = 0.2 s
BOUND = 60.0  # far above anything these batches need; only a lost future gets near it


def fast(i):
    return ("\\boxed{%d}" % i, i if i % 3 else i + 1, i % 3 != 0)  # (response, gold, correct)


def medium(i, seconds):  # slow enough to be rescued from, well within the limit
    return ("<<slow:%g>> \\boxed{%d}" % (seconds, i), i, True)


def overrun(i):  # killed at the limit
    return ("<<slow:30>> \\boxed{%d}" % i, i, None)


def check(grader, items):
    futures = [grader.submit(r, g) for r, g, _ in items]
    done, not_done = wait(futures, timeout=BOUND)
    assert not not_done, f"{len(not_done)} of {len(futures)} samples never resolved"
    for (response, gold, correct), fut in zip(items, futures):
        result = fut.result()
        if correct is None:
            assert result.timeout and not result.correct, (response, result)
        else:
            assert not result.timeout and result.error is None and result.correct is correct, (response, result)
    return [f.result() for f in futures]


@pytest.fixture(scope="module")
def pool():
    # two workers, no spare: the configuration in which the issue lost a sample
    with MathGrader(timeout=TIMEOUT, workers=2, spare_workers=0, test_slow_parse=True) as g:
        g.start()
        yield g


def test_housekeeping_finds_a_sample_without_a_live_copy(pool):
    """The safety net: a pending sample that the bookkeeping lost (simulated by taking it out of the
    queue behind the dispatcher's back) is found and requeued within about a second."""
    blocker = pool.submit("<<slow:0.8>> \\boxed{1}", 1)
    blocker2 = pool.submit("<<slow:0.8>> \\boxed{2}", 2)
    time.sleep(0.35)  # both workers now run a slow sample: nothing is pipelined behind a slow one
    lost = pool.submit("\\boxed{7}", 7)
    with pool._pool._lock:
        task = next((t for t in pool._pool._queue if t.future is lost), None)
        assert task is not None and not task.holders
        pool._pool._queue.remove(task)
        task.queued = False
    result = pool.wait(lost)
    assert result.correct and result.error is None
    assert blocker.result(timeout=BOUND).correct and blocker2.result(timeout=BOUND).correct
    assert pool.stats()["lost_requeued"] == 1
    pool._pool._stats["lost_requeued"] = 0  # the next test checks the bookkeeping itself again


def test_rescued_copy_behind_the_second_overrun_is_not_lost(pool):
    """The issue's reproduction: s1 on worker A with b waiting behind it; m on worker B with s2
    behind it. m finishes, s2 starts on B; A turns slow, so b is rescued and, B's s2 being fresh,
    pipelined behind s2. Then A and B are both killed. The old bookkeeping dropped b ("a rescued
    copy is queued already") twice, and its future never resolved."""
    items = [overrun(1), medium(2, 0.05), fast(3), overrun(4)]
    check(pool, items)
    stats = pool.stats()
    assert stats["timeouts"] == 2 and stats["lost_requeued"] == 0 and stats["stalled"] == 0
    assert stats["completed"] == stats["submitted"]


def test_random_interleavings_with_kills(pool):
    """Overruns, slow and fast samples in random order and in bursts, so rescues, second slots and
    kills of either or both workers interleave; every sample resolves once, with its own verdict."""
    rng = random.Random(0)
    for burst in range(2):
        items = []
        for i in range(12):
            roll = rng.random()
            n = 100 * burst + i + 10
            items.append(overrun(n) if roll < 0.2 else medium(n, rng.choice([0.05, 0.25, 0.4])) if roll < 0.5
                         else fast(n))
        check(pool, items)
    stats = pool.stats()
    assert stats["completed"] == stats["submitted"]
    assert stats["lost_requeued"] == 0 and stats["stalled"] == 0


def test_both_workers_killed_with_copies_everywhere(pool):
    """Two overruns at once with samples queued behind both: both workers die together, and every
    rescued copy, queued copy and pipelined copy still ends in exactly one verdict."""
    items = [overrun(1), overrun(2)] + [medium(10 + i, 0.3) for i in range(4)] + [fast(20 + i) for i in range(6)]
    results = check(pool, items)
    assert sum(r.timeout for r in results) == 2
    stats = pool.stats()
    assert stats["completed"] == stats["submitted"] and stats["lost_requeued"] == 0


def test_every_wait_is_bounded_after_close():
    g = MathGrader(timeout=TIMEOUT, workers=1, spare_workers=0, test_slow_parse=True)
    futures = [g.submit("<<slow:30>> \\boxed{1}", 1), g.submit("\\boxed{2}", 2)]
    time.sleep(0.5)
    start = time.monotonic()
    g.close()
    assert time.monotonic() - start < 30
    for f in futures:
        r = g.wait(f)
        assert not r.correct and r.error
