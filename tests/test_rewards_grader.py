"""MathGrader against real math-verify, a real process pool and real threads: verdicts, agreement with
math-verify run in the main thread, hostile samples and golds, worker death, clean shutdown."""

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rlhf_ext.rewards import GradeResult, MathGrader, extract_answer, prepare_gold
from rlhf_ext.rewards.math_verify_recipe import grade_response

HOSTILE = "\\boxed{9^{9^{9^{9}}}}"  # math-verify issue #65: never finishes without a timeout
DATA = os.path.join("..", "shared", "data")


@pytest.fixture(scope="module")
def grader():
    with MathGrader(timeout=10.0, workers=2) as g:
        g.start()
        yield g


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids, limit=20.0):
    end = time.monotonic() + limit
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_math_verify_fails_off_the_main_thread_but_the_grader_works(grader):
    from math_verify import parse

    errors, results = [], []

    def rollout_thread():  # what OpenRLHF's asyncio.to_thread worker sees
        try:
            parse("\\boxed{1}")
        except ValueError as exc:
            errors.append(str(exc))
        results.append(grader.grade("\\boxed{1}", "1"))

    t = threading.Thread(target=rollout_thread)
    t.start()
    t.join()
    assert errors and "threaded environment" in errors[0]
    assert results == [GradeResult(correct=True, extracted="1", gold_parsed=True, timeout=False, error=None)]


@pytest.mark.parametrize(
    "response, gold, correct",
    [
        ("so \\boxed{\\frac{1}{2}}", "0.5", True),
        ("so \\boxed{0.5}", "\\frac{1}{2}", True),
        ("The answer is 1/2.", "\\frac12", True),
        ("<answer>\n\\frac{2}{4}\n</answer>", "0.5", True),
        ("\\boxed{25}", "025", True),  # AIME gold
        ("\\boxed{025}", 25, True),
        ("\\boxed{27}", 27.0, True),  # AMC gold, a JSON float
        ("\\boxed{27}", "27.0", True),
        ("So she makes 18 dollars.\n#### 18", "Janet sells 9 eggs.\n#### 18", True),  # GSM8K gold
        ("\\boxed{1,000}", "#### 1,000", True),
        ("\\boxed{x = 3}", "3", True),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
        ("first \\boxed{2} then \\boxed{3}", "3", True),  # the last boxed counts
        ("first \\boxed{3} then \\boxed{2}", "3", False),
        ("\\boxed{19}", "18", False),
        ("no final answer here", "18", False),
    ],
)
def test_verdicts(grader, response, gold, correct):
    r = grader.grade(response, gold)
    assert r.correct is correct and r.gold_parsed and not r.timeout and r.error is None
    assert r.extracted == extract_answer(response)


def test_unparseable_gold_is_reported(grader):
    for gold in ("", None, "#### ", {"not": "a gold"}):
        r = grader.grade("\\boxed{5}", gold)
        assert r.correct is False and r.gold_parsed is False and r.extracted == "5" and r.error
    r = grader.grade("\\boxed{5}", "\\boxed{}")  # a boxed gold with nothing in it
    assert r.correct is False and r.gold_parsed is False


def _corpus(n=120):
    with open(os.path.join(DATA, "math500.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f][:n]
    responses, golds = [], []
    for i, row in enumerate(rows):
        kind = i % 4
        if kind == 0:
            responses.append("Reasoning... so the answer is $\\boxed{%s}$." % row["answer"])
        elif kind == 1:
            responses.append("<think>\nwork\n</think>\n<answer>\n%s\n</answer>" % row["answer"])
        elif kind == 2:
            responses.append("The answer is \\boxed{%s+1}." % row["answer"])  # wrong
        else:
            responses.append("I could not finish")  # no answer
        golds.append(row["answer"])
    return responses, golds


def test_batch_matches_math_verify_in_the_main_thread(grader):
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    responses, golds = _corpus(80)
    responses, golds = responses * 2, golds * 2  # the second half hits the workers' verdict caches
    batch = grader.grade_batch(responses, golds)
    assert len(batch) == len(responses)
    for response, gold, result in zip(responses, golds, batch):
        expected = grade_response(response, prepare_gold(gold))  # math-verify with its own SIGALRM timeouts
        assert (result.correct, result.extracted, result.gold_parsed) == (
            expected["correct"], expected["extracted"], expected["gold_parsed"]), (response, gold)
    kinds = [sum(r.correct for r in batch[k::4]) for k in range(4)]
    assert kinds[0] >= 38 and kinds[1] >= 38 and kinds[3] == 0  # nearly all right answers are recognised
    assert grader.grade_batch([], []) == []


def test_many_threads_share_one_grader(grader):
    out = {}

    def worker(t):
        futures = [grader.submit("The answer is %d." % (t * 100 + i), str(t * 100 + i)) for i in range(10)]
        sync = [grader.grade("\\boxed{%d}" % (t * 100 + i), str(t * 100 + i + (i % 2))) for i in range(5)]
        out[t] = ([f.result(timeout=120) for f in futures], sync)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == list(range(8))
    for t, (async_results, sync_results) in out.items():
        assert [r.extracted for r in async_results] == [str(t * 100 + i) for i in range(10)]
        assert all(r.correct for r in async_results)
        assert [r.correct for r in sync_results] == [True, False, True, False, True]


def test_hostile_sample_does_not_delay_the_others_and_its_worker_is_replaced():
    timeout = 2.0
    with MathGrader(timeout=timeout, workers=2, spare_workers=1) as g:
        g.start()
        done_at = {}
        responses = [HOSTILE] + ["\\boxed{%d}" % i for i in range(40)]
        golds = ["1"] + [str(i) for i in range(40)]
        t0 = time.monotonic()
        futures = [g.submit(r, gold) for r, gold in zip(responses, golds)]
        for i, f in enumerate(futures):
            f.add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.monotonic()))
        results = [f.result(timeout=120) for f in futures]
        hostile = results[0]
        assert hostile.timeout and not hostile.correct and hostile.gold_parsed
        assert hostile.extracted == "9^{9^{9^{9}}}" and "timed out" in hostile.error
        assert all(r.correct and not r.timeout for r in results[1:])
        # Every other sample was graded while the hostile one was still running on its worker ...
        assert max(done_at[i] for i in range(1, 41)) < done_at[0]
        # ... which was stopped by the limit, not earlier.
        assert done_at[0] - t0 >= timeout
        stats = g.stats()
        assert stats["timeouts"] == 1 and stats["workers_replaced"] == 1
        # The pool is whole again and keeps serving, hostile samples included.
        assert g.grade_batch(["\\boxed{%d}" % i for i in range(10)], [str(i) for i in range(10)]) == [
            GradeResult(True, str(i), True) for i in range(10)]
        again = g.grade(HOSTILE, "1")
        assert again.timeout and g.stats()["workers_replaced"] == 2
        end = time.monotonic() + 30
        while g.stats()["alive"] < 3 and time.monotonic() < end:
            time.sleep(0.05)
        assert g.stats()["alive"] == 3


def test_hostile_gold_is_remembered_and_costs_nothing_the_second_time():
    slow_gold = "+".join(["x^{2}"] * 1000)  # math-verify needs more than 5 s to parse this
    with MathGrader(timeout=1.5, workers=1, spare_workers=1) as g:
        first = g.grade("\\boxed{1}", slow_gold)
        assert first.timeout and not first.gold_parsed and not first.correct
        replaced = g.stats()["workers_replaced"]
        second = g.grade("\\boxed{2}", slow_gold)
        assert not second.timeout and not second.gold_parsed and "parsing the gold timed out" in second.error
        assert second.extracted == "2"
        assert g.stats()["workers_replaced"] == replaced  # answered without a worker
        assert g.grade("\\boxed{2}", "2").correct


def test_a_worker_killed_from_outside_is_replaced():
    with MathGrader(timeout=60.0, workers=1, spare_workers=0) as g:
        g.start()  # a plain number is decided without a worker (the fast path): start the pool first
        assert g.grade("\\boxed{1}", "1").correct
        fut = g.submit(HOSTILE, "1")
        time.sleep(0.5)  # let it start on the worker
        (worker,) = [w for w in g._pool._workers if w.inflight]
        os.kill(worker.proc.pid, signal.SIGKILL)
        r = fut.result(timeout=60)
        assert not r.correct and not r.timeout and "exited unexpectedly" in r.error
        assert g.grade("\\boxed{2}", "2").correct  # a fresh worker took over


def test_close_stops_every_worker_and_answers_what_is_pending():
    g = MathGrader(timeout=60.0, workers=2, spare_workers=1).start()
    pids = [w.proc.pid for w in g._pool._workers]
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    stuck = g.submit(HOSTILE, "1")
    time.sleep(0.3)
    g.close()
    r = stuck.result(timeout=10)
    assert r.error == "grader closed" and not r.correct
    assert _wait_dead(pids) == []
    with pytest.raises(RuntimeError, match="closed"):
        g.submit("\\boxed{1}", "1")
    g.close()  # idempotent


CHILD = """
import os, sys, time
from rlhf_ext.rewards import MathGrader
g = MathGrader(timeout=30, workers=2).start()  # a plain number alone would not start the pool
assert g.grade("\\\\boxed{3}", "3").correct
print(" ".join(str(w.proc.pid) for w in g._pool._workers), flush=True)
if sys.argv[1] == "hang":
    g.submit("\\\\boxed{9^{9^{9^{9}}}}", "1")
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["exit", "hang"])
def test_no_worker_outlives_its_parent(how):
    """Normal exit (atexit closes the pool) and SIGKILL of the parent mid-sample (workers die with it)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), how], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3 and all(_alive(p) for p in pids)
    if how == "hang":
        time.sleep(0.5)
        proc.kill()
    assert proc.wait(timeout=60) in (0, -signal.SIGKILL)
    assert _wait_dead(pids) == []


def test_arguments_are_checked():
    for kwargs, msg in [({"timeout": 0}, "timeout must be a positive"), ({"timeout": float("inf")}, "timeout"),
                        ({"workers": 0}, "workers must be a positive"), ({"workers": 1.5}, "workers"),
                        ({"spare_workers": -1}, "spare_workers"), ({"memory_limit_mb": 100}, "too small")]:
        with pytest.raises(ValueError, match=msg):
            MathGrader(**kwargs)
    g = MathGrader(timeout=1.0, workers=1)
    with pytest.raises(ValueError, match="one gold per response: got 2 responses and 1 golds"):
        g.grade_batch(["a", "b"], ["1"])
    with pytest.raises(TypeError, match=r"responses\[1\] must be a str"):
        g.grade_batch(["a", None], ["1", "2"])
    with pytest.raises(TypeError, match="response must be a str"):
        g.submit(b"bytes", "1")
    g.close()


def test_pickled_grader_is_a_fresh_pool_with_the_same_settings():
    g = MathGrader(timeout=2.5, workers=1, spare_workers=0, memory_limit_mb=2048)
    copy = pickle.loads(pickle.dumps(g))
    assert (copy.timeout, copy.workers, copy.spare_workers, copy.memory_limit_mb) == (2.5, 1, 0, 2048)
    assert copy is not g and copy._pool._thread is None
    assert copy.grade("\\boxed{4}", "4").correct
    copy.close()
    g.close()
