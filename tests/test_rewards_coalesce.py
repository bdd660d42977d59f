"""Issue 15, part 1: concurrent per-sample reward calls are scored together (group commit)."""

import threading
import time

import pytest

from rlhf_ext.rewards.coalesce import Coalescer


class _Recorder:
    """A batch function that records its batches and can be held until released."""

    def __init__(self, hold_first: bool = False):
        self.batches = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.hold_first = hold_first
        self.lock = threading.Lock()

    def __call__(self, items):
        with self.lock:
            self.batches.append(list(items))
            first = len(self.batches) == 1
        if first and self.hold_first:
            self.entered.set()
            assert self.release.wait(30)
        return [x * 10 for x in items]


def _start(fn, *args):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*args)))
    t.start()
    return t, out


def test_a_lone_call_runs_at_once_with_its_own_items():
    rec = _Recorder()
    c = Coalescer(rec, max_inflight=1)
    assert c.call([1, 2]) == [10, 20]
    assert rec.batches == [[1, 2]]


def test_calls_arriving_while_the_slots_are_busy_share_the_next_batch():
    rec = _Recorder(hold_first=True)
    c = Coalescer(rec, max_inflight=1)
    first, first_out = _start(c.call, [1])
    assert rec.entered.wait(30)
    others = [_start(c.call, [x, x + 1]) for x in (10, 20, 30)]
    deadline = time.monotonic() + 30
    while c._forming is None or len(c._forming.items) < 6:  # all three joined the forming batch
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert len(rec.batches) == 1  # nothing else ran while the slot was busy
    rec.release.set()
    for t, _ in [(first, first_out)] + others:
        t.join(30)
    assert first_out["r"] == [10]
    for (t, out), x in zip(others, (10, 20, 30)):
        assert out["r"] == [10 * x, 10 * (x + 1)]  # each caller gets exactly its own results
    assert len(rec.batches) == 2 and sorted(rec.batches[1]) == [10, 11, 20, 21, 30, 31]
    assert c.stats == {"calls": 4, "batches": 2, "items": 7}


def test_two_slots_run_two_batches_at_once():
    started = threading.Barrier(3, timeout=30)

    def fn(items):
        started.wait()  # both batches must be inside at the same time, or this times out
        return items

    c = Coalescer(fn, max_inflight=2)
    threads = [_start(c.call, [i]) for i in range(2)]
    started.wait()
    for t, out in threads:
        t.join(30)
    assert sorted(out["r"][0] for _, out in threads) == [0, 1]


def test_a_batch_closes_at_max_batch():
    rec = _Recorder(hold_first=True)
    c = Coalescer(rec, max_inflight=1, max_batch=2)
    first, _ = _start(c.call, [0])
    assert rec.entered.wait(30)
    waiting = [_start(c.call, [i]) for i in range(1, 6)]
    deadline = time.monotonic() + 30
    while c.stats["calls"] < 6:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rec.release.set()
    for t, _ in [(first, None)] + waiting:
        t.join(30)
    assert all(len(b) <= 2 for b in rec.batches)
    assert sorted(x for b in rec.batches for x in b) == list(range(6))
    assert [out["r"] for _, out in waiting] == [[10 * i] for i in range(1, 6)]


def test_an_error_reaches_every_caller_of_that_batch_and_the_next_batch_still_runs():
    calls = []

    def fn(items):
        calls.append(list(items))
        if 13 in items:
            raise RuntimeError("unlucky batch")
        return items

    c = Coalescer(fn, max_inflight=1)
    with pytest.raises(RuntimeError, match="unlucky"):
        c.call([13])
    assert c.call([1, 2]) == [1, 2]

    def short(items):
        return items[:-1]

    with pytest.raises(ValueError, match="returned 1 results for 2 items"):
        Coalescer(short).call([1, 2])


@pytest.mark.parametrize("kwargs", [{"max_inflight": 0}, {"max_inflight": True}, {"max_batch": 0}, {"max_batch": 1.5}])
def test_bad_limits_are_named(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Coalescer(lambda items: items, **kwargs)


def test_reward_file_calls_from_threads_match_one_batch_call():
    """The OpenRLHF entry point, called per sample from many threads at once, scores every sample as
    the batch scorer does (the coalesced batches are split back exactly)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlhf_ext.rewards.openrlhf_protocol import RewardScorer
    from rlhf_ext.rewards.config import RewardConfig

    prompt = "<|im_start|>user\nWhat is 6 x 7?<|im_end|>\n<|im_start|>assistant\n"
    answers = ["\\boxed{42}", "\\boxed{41}", "The answer is 42.", "no idea", "<answer>42</answer>", "\\boxed{42"]
    queries = [prompt + a + ("<|im_end|>" if i % 5 else "") for i, a in enumerate(answers * 5)]
    labels = ["42"] * len(queries)
    scorer = RewardScorer(RewardConfig(reward="math", workers=2))
    try:
        whole = scorer.score(queries, [prompt] * len(queries), labels)
        with ThreadPoolExecutor(8) as ex:
            singles = list(ex.map(lambda q: scorer.score_concurrent([q], [prompt], ["42"]), queries))
        assert scorer._coalescer.stats["calls"] == len(queries)
        for i, one in enumerate(singles):
            assert one["rewards"] == [whole["rewards"][i]] and one["scores"] == [whole["scores"][i]]
            assert one["extra_logs"] == {k: [v[i]] for k, v in whole["extra_logs"].items()}
        bad = scorer.score_concurrent([None], [prompt], ["42"])  # malformed: scored alone, reported
        assert bad["rewards"] == [0.0] and bad["extra_logs"]["reward_flag/error"] == [1.0]
    finally:
        scorer.close()


def test_batch_relative_rewards_keep_their_per_call_meaning_when_calls_are_coalesced():
    """Only the grading is shared: `length` (relative to the lengths in its call) stays 0 for
    one-sample calls, exactly as when each call is scored alone."""
    from concurrent.futures import ThreadPoolExecutor

    from rlhf_ext.rewards.config import RewardConfig
    from rlhf_ext.rewards.openrlhf_protocol import RewardScorer

    prompt = "Q: 2+2?\nA: "
    queries = [prompt + "x" * (5 * i) + " \\boxed{%d}</s>" % (4 if i % 2 else 5) for i in range(24)]
    scorer = RewardScorer(RewardConfig(reward="accuracy:1.0,length:1.0", workers=2))
    try:
        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(lambda q: scorer.score_concurrent([q], [prompt], ["4"]), queries))
        assert scorer._coalescer.stats["batches"] <= scorer._coalescer.stats["calls"]
        for i, out in enumerate(outs):
            assert out["extra_logs"]["reward/length"] == [0.0]
            assert out["rewards"] == [1.0 if i % 2 else 0.0]
        together = scorer.score(queries, [prompt] * 24, ["4"] * 24)  # one call: lengths relative to each other
        assert len(set(together["extra_logs"]["reward/length"])) > 2
    finally:
        scorer.close()
