"""rlhf_ext's reward entry under verl's compute_score contract and verl's reward managers (.venv-verl)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl import DataProto

from rlhf_ext.rewards import verl_protocol as verl_reward

HOSTILE = "so the answer is \\boxed{9^{9^{9^{9}}}}"
KWARGS = {"reward": "math", "timeout": 2, "workers": 2}


@pytest.fixture(scope="module")
def reward_file():
    path = subprocess.run([sys.executable, "-m", "rlhf_ext.rewards.path", "--verl"], capture_output=True,
                          text=True, check=True).stdout.strip()
    yield path
    verl_reward.close_all()


@pytest.fixture(scope="module")
def compute_score(reward_file):
    """verl's own loader (``reward.custom_reward_function``) applied to the printed path."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": reward_file, "name": "compute_score", "reward_kwargs": KWARGS}}})
    return get_custom_reward_fn(config)


@pytest.fixture(scope="module")
def tokenizer():
    from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_single_sample_contract(compute_score):
    out = compute_score(data_source="openai/gsm8k", solution_str="... so \\boxed{\\frac{1}{2}}", ground_truth="0.5",
                        extra_info={"index": 0})
    assert out["score"] == pytest.approx(1.2) and out["acc"] == 1.0  # correct 1.0 + answer format 0.2
    assert verl_reward._rewards, "the file verl loads by path must share the package module's grader pool"
    assert out["reward_accuracy"] == 1.0 and out["reward_answer_format"] == 1.0 and out["error"] == 0.0
    wrong = compute_score(data_source="x", solution_str="\\boxed{3}", ground_truth="4", extra_info=None)
    assert (wrong["score"], wrong["acc"]) == (pytest.approx(0.2), 0.0)
    assert set(wrong) == set(out)  # same keys for every sample: verl collects them per key
    cut = compute_score(data_source="x", solution_str="\\boxed{4}", ground_truth="4", extra_info={"truncated": True})
    assert cut["score"] == pytest.approx(0.7) and cut["flag_truncated"] == 1.0  # 1 + 0.2 - 0.5


def test_choice_and_ranking_ground_truths(reward_file):
    """Choice/ranking golds as a verl dataset holds them (an object, or its JSON text) under a weighted
    spec of the new rewards, through verl's loader (issue 25)."""
    import json

    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": reward_file, "name": "compute_score", "reward_kwargs": {
            "reward": "choice_accuracy:1.0,ranking_partial:0.5,parse_failure:-0.5,truncation:-0.5", "workers": 1}}}})
    score = get_custom_reward_fn(config)
    choice = {"options": ["Paris", "London", "Rome"], "answer": "B"}
    ranking = {"options": {"A": "one", "B": "two", "C": "three"}, "answer": ["C", "A", "B"]}
    outs = score(data_sources=["x"] * 4, solution_strs=["\\boxed{B}", "Answer: A or B", "\\boxed{C > B > A}",
                                                        "1. C 2. A"],
                 ground_truths=[choice, json.dumps(choice), ranking, ranking], extra_infos=[{}] * 4)
    assert [o["score"] for o in outs] == pytest.approx([1.5, -0.5, 1 + 0.5 * (1 / 3 + 0.5), -0.5])
    assert [o["acc"] for o in outs] == [1.0, 0.0, 0.0, 0.0]
    assert [o["reward_parse_failure"] for o in outs] == [0.0, 1.0, 0.0, 1.0]
    assert all(o["error"] == 0.0 and o["flag_gold_unparsed"] == 0.0 for o in outs)


def test_batch_contract_and_bad_input_scores_zero_with_error(compute_score):
    out = compute_score(data_sources=["a", "b", "c"], solution_strs=["\\boxed{1}", "no answer", "\\boxed{2}"],
                        ground_truths=["1", "1", "2"], extra_infos=[{}, {}, {}])
    assert [o["acc"] for o in out] == [1.0, 0.0, 1.0]
    assert [o["flag_no_answer"] for o in out] == [0.0, 1.0, 0.0]
    bad = compute_score(data_sources=["a"], solution_strs=[None], ground_truths=["1"], extra_infos=[{}])
    assert bad[0]["score"] == 0.0 and bad[0]["error"] == 1.0
    mismatched = compute_score(data_sources=["a", "b"], solution_strs=["\\boxed{1}", "x"], ground_truths=["1"])
    assert [o["error"] for o in mismatched] == [1.0, 1.0]


def test_configuration_errors_score_zero_and_say_why(caplog):
    verl_reward._last_error_log[0] = 0.0
    with caplog.at_level("ERROR"):
        out = verl_reward.compute_score(data_source="x", solution_str="\\boxed{1}", ground_truth="1", rewrd="math")
    assert out["score"] == 0.0 and out["error"] == 1.0
    assert "unknown reward_kwargs 'rewrd'" in caplog.text
    out = verl_reward.compute_score(data_source="x", solution_str="\\boxed{1}", ground_truth="1", reward="nope")
    assert out["error"] == 1.0
    # accuracy alone: the binary reward Pass@k and MaxRL need
    out = verl_reward.compute_score(data_source="x", solution_str="\\boxed{1}", ground_truth="1", reward="accuracy",
                                    timeout=2, workers=2)
    assert out["score"] == 1.0 and "reward_answer_format" not in out
    # Open-R1's rewards by name: format and tag_count need <think>/<answer> tags
    r1 = "<think>\nadd them\n</think>\n<answer>\n\\boxed{3}\n</answer>"
    out = verl_reward.compute_score(data_source="x", solution_str=r1, ground_truth="3", reward="open_r1",
                                    timeout=2, workers=2)
    assert (out["reward_accuracy"], out["reward_format"], out["reward_tag_count"]) == (1.0, 1.0, 1.0)
    assert out["score"] == pytest.approx(3.0)


def test_threads_with_hostile_answers_are_bounded_by_the_timeout(compute_score):
    items = [(HOSTILE, "1")] * 2 + [(f"\\boxed{{{i}}}", str(i)) for i in range(10)]
    done = []

    def one(item):
        out = compute_score(data_source="x", solution_str=item[0], ground_truth=item[1], extra_info={})
        done.append(threading.current_thread().name)
        return out

    pool = ThreadPoolExecutor(8)
    try:
        results = list(pool.map(one, items, timeout=120))  # a hang fails here instead of stalling CI
    finally:
        verl_reward.close_all()  # resolves anything still pending, so the threads can end
        pool.shutdown(wait=True)
    assert len(set(done)) > 1  # really from several threads
    assert [r["flag_timeout"] for r in results[:2]] == [1.0, 1.0]
    assert [r["acc"] for r in results[:2]] == [0.0, 0.0]
    assert all(r["acc"] == 1.0 and r["error"] == 0.0 for r in results[2:])


def _rollout(tokenizer, responses, golds, prompt_len=4, response_len=24) -> DataProto:
    """A batch as verl's rollout leaves it: left-padded prompts, right-padded responses."""
    pad = tokenizer.pad_token_id
    prompts = torch.full((len(responses), prompt_len), pad)
    resp = torch.full((len(responses), response_len), pad)
    attention = torch.zeros(len(responses), prompt_len + response_len, dtype=torch.long)
    for i, text in enumerate(responses):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:response_len]
        prompts[i, -2:] = torch.tensor(tokenizer("Q:", add_special_tokens=False)["input_ids"][:2])
        resp[i, :len(ids)] = torch.tensor(ids)
        attention[i, prompt_len - 2:prompt_len + len(ids)] = 1
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": resp, "attention_mask": attention,
                 "input_ids": torch.cat([prompts, resp], dim=1)},
        non_tensors={"data_source": np.array(["openai/gsm8k"] * len(responses), dtype=object),
                     "reward_model": np.array([{"ground_truth": g} for g in golds], dtype=object),
                     "extra_info": np.array([{"index": i} for i in range(len(responses))], dtype=object)})


def test_verls_naive_reward_loop_manager_from_its_executor_threads(compute_score, tokenizer):
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    manager = NaiveRewardManager(config=OmegaConf.create({}), tokenizer=tokenizer, compute_score=compute_score)
    responses = ["so \\boxed{7}", HOSTILE, "\\boxed{12}", "none"]
    data = _rollout(tokenizer, responses, ["7", "1", "12", "3"])

    async def run_all():
        return await asyncio.gather(*(manager.run_single(data[i:i + 1]) for i in range(len(responses))))

    results = manager.loop.run_until_complete(asyncio.wait_for(run_all(), timeout=120))
    scores = [r["reward_score"] for r in results]
    assert scores == pytest.approx([1.2, 0.2, 1.2, 0.0])
    assert results[1]["reward_extra_info"]["flag_timeout"] == 1.0
    assert [r["reward_extra_info"]["acc"] for r in results] == [1.0, 0.0, 1.0, 0.0]


def test_verls_batch_reward_manager(reward_file, tokenizer):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.batch import BatchRewardManager

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": reward_file, "name": "compute_score", "reward_kwargs": KWARGS}}})
    manager = BatchRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=get_custom_reward_fn(config))
    responses = ["\\boxed{5}", "\\boxed{6}", HOSTILE]
    data = _rollout(tokenizer, responses, ["5", "7", "2"])
    out = manager(data, return_dict=True)
    tensor = out["reward_tensor"]
    lengths = data.batch["attention_mask"][:, 4:].sum(-1)
    for i, expected in enumerate([1.2, 0.2, 0.2]):
        assert tensor[i, lengths[i] - 1].item() == pytest.approx(expected)  # reward on the last response token
        assert tensor[i].sum().item() == pytest.approx(expected)
    assert out["reward_extra_info"]["flag_timeout"] == [0.0, 0.0, 1.0]
