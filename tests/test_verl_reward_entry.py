"""rlhf_ext's verl reward entry in the main environment (it does not import verl), and the grader
under verl's calling pattern: one compute_score call per sample from many threads.

Regression: with more hostile samples in flight than workers, a sample "rescued" from behind one
slow sample could be dispatched behind another and be dropped when both workers were replaced,
leaving its caller waiting forever.
"""

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlhf_ext.rewards import verl_protocol as verl_reward
from rlhf_ext.rewards.path import verl_reward_file_path

HOSTILE = "The answer is \\boxed{9^{9^{9^{9}}}}"


@pytest.fixture
def score():
    yield lambda text, gold: verl_reward.compute_score(data_source="x", solution_str=text, ground_truth=gold,
                                                       extra_info={}, reward="accuracy", timeout=1.5, workers=2)
    verl_reward.close_all()


def test_many_hostile_samples_from_threads_all_resolve(score):
    items = [(HOSTILE, "1")] * 5 + [(f"\\boxed{{{i}}}" if i % 2 else "no answer", str(i)) for i in range(10)]
    pool = ThreadPoolExecutor(8)
    try:
        futures = [pool.submit(score, *item) for item in items]
        results = [f.result(timeout=120) for f in futures]  # a lost sample fails here, not by hanging CI
    finally:
        verl_reward.close_all()  # resolves anything still pending, so the threads can end
        pool.shutdown(wait=True)
    assert [r["flag_timeout"] for r in results[:5]] == [1.0] * 5
    assert [r["acc"] for r in results[5:]] == [1.0 if i % 2 else 0.0 for i in range(10)]
    assert all(r["error"] == 0.0 for r in results)


def test_path_command_prints_the_verl_file():
    out = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path", "--verl"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == verl_reward_file_path() and out.endswith("verl_reward.py")
    plain = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert plain.endswith("openrlhf_reward.py")
    help_text = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path", "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "custom_reward_function.path" in help_text
