"""Issue 15, part 1: how the grader feeds its workers (batches, gold affinity, pipe budget).

OpenRLHF calls the reward file once per sample from worker threads; the grader turns those calls
into few messages per worker and sends a gold's samples to the worker that has it parsed. Real
worker processes and math-verify; the only instrument is a counter on the dispatcher's own sends.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from rlhf_ext.rewards import MathGrader
from rlhf_ext.rewards import grading_pool as grader_module
from rlhf_ext.rewards import grading_records, grading_scheduler


def _count_messages(g):
    """Wrap each worker's request connection so that every message sent to it is counted."""
    counts = {}
    lock = threading.Lock()
    for w in g._pool._workers:
        original = w.requests.send_bytes

        def counted(data, _original=original, _pid=w.proc.pid):
            with lock:
                counts[_pid] = counts.get(_pid, 0) + 1
            return _original(data)

        w.requests.send_bytes = counted
    return counts


def test_a_burst_reaches_a_busy_worker_in_a_few_messages():
    n = 40
    with MathGrader(timeout=60.0, workers=1, spare_workers=0) as g:
        g.start()
        counts = _count_messages(g)
        results = g.grade_batch(["\\boxed{%d}" % i for i in range(n)], [str(i if i % 4 else i + 1) for i in range(n)])
    assert [r.correct for r in results] == [i % 4 != 0 for i in range(n)]
    assert all(r.error is None and not r.timeout for r in results)
    # one message per sample before; now the worker is refilled in batches
    refill = grading_scheduler._PIPELINE_DEPTH - grading_scheduler._REFILL_AT - 1
    assert sum(counts.values()) <= 1 + -(-(n - grading_scheduler._PIPELINE_DEPTH) // refill) + 2, counts


def test_a_worker_takes_the_samples_of_golds_it_has_before_the_queue_head():
    """The choice itself, on a started pool with its real workers: among the queued samples a worker
    takes one whose gold it has, then one whose gold no worker has, and only then the head."""
    with MathGrader(timeout=60.0, workers=2, spare_workers=0) as g:
        g.start()
        grader_module.time.sleep(0.3)  # the dispatcher has handled the workers' "ready" and sleeps
        a, b = g._pool._workers
        now = grader_module.time.monotonic()
        queued = []
        for i, gold in enumerate(["1", "2", "3", "2"]):
            task = grading_records._Task(10_000 + i, "\\boxed{%s}" % gold, gold, grader_module.Future())
            task.queued = True
            queued.append(task)
        g._pool._gold_owner["1"] = a
        g._pool._gold_owner["2"] = b
        # the dispatcher thread is idle (nothing pending), so the queue is ours to arrange
        with g._pool._lock:
            g._pool._queue.extend(queued)
        try:
            assert g._pool._take_task(b, True, 0, now) is queued[1]  # b has gold 2
            assert g._pool._take_task(b, True, 0, now) is queued[3]  # and again
            assert g._pool._take_task(b, True, 0, now) is queued[2]  # nobody has gold 3
            assert g._pool._take_task(b, True, 0, now) is queued[0]  # only a's gold is left: b helps
            assert g._pool._take_task(a, True, 0, now) is None
        finally:
            with g._pool._lock:
                g._pool._queue.clear()


def test_samples_sharing_a_gold_are_mostly_parsed_once():
    golds = ["\\frac{%d}{7}" % k for k in range(1, 5)]
    responses, answers = [], []
    for i in range(32):  # a GRPO-like stream: groups interleaved, half right
        gold = golds[i % 4]
        responses.append("\\boxed{%s}" % (gold if i % 2 == 0 else "0"))
        answers.append(gold)
    with MathGrader(timeout=60.0, workers=2, spare_workers=0, fast_path=False) as g:  # the workers' gold affinity
        g.start()
        results = g.grade_batch(responses, answers)
        parsed = [set(w.golds_parsed) for w in g._pool._workers]
    assert [r.correct for r in results] == [i % 2 == 0 for i in range(32)]
    # sent round-robin, every gold would be parsed by both workers (8 parses); a worker that runs
    # dry may still help with another's gold at the end of the burst
    assert set().union(*parsed) == set(golds)
    assert sum(len(p) for p in parsed) <= 6, parsed


def test_per_sample_calls_from_threads_get_their_own_verdicts():
    """OpenRLHF's pattern: many threads, one sample each, at once."""
    with MathGrader(timeout=60.0, workers=2, spare_workers=1) as g:
        def one(i):
            return i, g.grade("The answer is \\boxed{%d}." % (i * 3), str(i * 3 + (i % 5 == 0)))

        with ThreadPoolExecutor(12) as ex:
            out = list(ex.map(one, range(120)))
    for i, r in out:
        assert r.correct is (i % 5 != 0) and r.extracted == str(i * 3), (i, r)


def test_large_samples_behind_a_busy_worker_do_not_stall_the_dispatcher():
    """Responses too big to queue in a busy worker's pipe wait in the grader instead (a blocking write
    to a worker stuck on a slow sample would stall every other sample)."""
    padding = "x" * 20000
    with MathGrader(timeout=30.0, workers=1, spare_workers=0, test_slow_parse=True) as g:
        g.start()
        slow = g.submit("<<slow:0.15>> \\boxed{1}", "1")
        big = [g.submit(padding + " so \\boxed{%d}" % i, str(i)) for i in range(6)]
        assert g.wait(slow).correct
        assert all(g.wait(f).correct for f in big)
        assert all(w.pipe_budget >= 1024 for w in g._pool._workers)


def test_worker_count_follows_a_container_cpu_quota(tmp_path):
    from rlhf_ext.rewards.grader import cgroup_cpu_limit

    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_limit(str(v2)) == 2.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(v2)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(str(v1)) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    assert cgroup_cpu_limit(str(v1)) == 3.0
    assert cgroup_cpu_limit(str(tmp_path / "absent")) is None
