"""The one-sample path of the OpenRLHF reward file (issue 41, item 3): OpenRLHF calls ``reward_func``
once per sample, which :meth:`RewardScorer.score` scores through each reward's one-sample form
(:meth:`WeightedReward.score_one`) instead of the list forms. It must give exactly what the batch path
gives: the same values, flags, keys and key order, failures and tensors; the real grader (workers and
fast path) grades both."""

import json
import logging
import math

import pytest
import torch

from rlhf_ext.rewards import openrlhf_reward
from rlhf_ext.rewards.composite import WeightedReward
from rlhf_ext.rewards.config import RewardConfig
from rlhf_ext.rewards.openrlhf_protocol import RewardScorer
from rlhf_ext.rewards.registry import REWARDS, register_reward

PROMPT = "<|im_start|>user\nSolve.<|im_end|>\n<|im_start|>assistant\n"
CHOICE_GOLD = json.dumps({"answer_type": "choice", "options": ["red", "green", "blue"], "answer": "B"})
# (response, gold): fast-path integers and fractions right and wrong, no answer, an <answer> tag, a
# symbolic gold the workers grade, a None gold, a choice gold, a gold with no answer in it
SAMPLES = [
    ("So \\boxed{42}.", "42"),
    ("So \\boxed{41}.", "42"),
    ("The answer is 1,000.", "1000"),
    ("Thinking, no answer at all.", "42"),
    ("<think>\nhm\n</think>\n<answer>\n3\n</answer>", "3"),
    ("Thus \\boxed{\\frac{1}{2}}.", "0.5"),
    ("Thus \\boxed{x^2+2x+1}.", "(x+1)^2"),
    ("Thus \\boxed{x^2+2x}.", "(x+1)^2"),
    ("So \\boxed{5}.", None),
    ("The answer is B.", CHOICE_GOLD),
    ("The answer is C.", CHOICE_GOLD),
    ("So \\boxed{5}.", "   "),
]
SPECS = ["math", "open_r1", "accuracy:1.0,format:0.5,tag_count:0.25,truncation:-1",
         "choice_accuracy:1.0,parse_failure:-0.5,truncation:-0.5", "answer_format:1.0,truncation:-0.5"]


def _batch_path(scorer: RewardScorer):
    """The same scorer with the one-sample path off: every call goes through the list forms."""
    scorer._one_sample = False
    return scorer


@pytest.fixture(scope="module")
def scorers():
    made = {}
    for spec in SPECS:
        one = RewardScorer(RewardConfig(reward=spec, workers=1))
        batch = RewardScorer(RewardConfig(reward=spec, workers=1))
        batch.reward._grader = one.reward.grader  # one grader: the verdicts cannot differ by the pool
        batch.reward._owns_grader = False
        made[spec] = (one, _batch_path(batch))
    yield made
    for one, _ in made.values():
        one.close()


def _query(response: str, eos: bool) -> str:
    return PROMPT + response + ("<|im_end|>" if eos else "")


@pytest.mark.parametrize("spec", SPECS)
def test_one_sample_path_gives_what_the_batch_path_gives(scorers, spec):
    one, batch = scorers[spec]
    assert one._one_sample and not batch._one_sample
    for response, gold in SAMPLES:
        for eos in (True, False):
            q = _query(response, eos)
            got = one.score([q], [PROMPT], [gold])
            want = batch.score([q], [PROMPT], [gold])
            assert got == want, (spec, response, gold, eos)
            assert list(got["extra_logs"]) == list(want["extra_logs"]) == one.log_keys
    # the prompt not found (a best guess at the split), a missing prompt list and missing labels
    for args in (([PROMPT + "So \\boxed{42}.<|im_end|>"], ["another prompt"], ["42"]),
                 (["So \\boxed{42}.<|im_end|>"], None, ["42"]),
                 (["So \\boxed{42}.<|im_end|>"], [""], None)):
        assert one.score(*args) == batch.score(*args)


def _first(out: dict) -> dict:
    return {"rewards": out["rewards"][0], "scores": out["scores"][0],
            "extra_logs": {key: values[0] for key, values in out["extra_logs"].items()}}


@pytest.mark.parametrize("spec", SPECS)
def test_score_sample_gives_the_batch_paths_values_as_floats(scorers, spec):
    """:meth:`RewardScorer.score_sample` (what ``reward_func`` calls for OpenRLHF's one-sample call):
    each value the batch path gives, as a float, the keys in the same order; odd inputs and failures alike."""
    one, batch = scorers[spec]
    cases = [(_query(r, eos), PROMPT, gold) for r, gold in SAMPLES for eos in (True, False)]
    cases += [(PROMPT + "So \\boxed{42}.<|im_end|>", "another prompt", "42"),  # prompt not found
              ("So \\boxed{42}.<|im_end|>", "", None),
              (None, PROMPT, "42"), (_query("So \\boxed{42}.", True), None, "42"), (b"bytes", PROMPT, "42")]
    for query, prompt, gold in cases:
        got = one.score_sample(query, prompt, gold)
        want = _first(batch.score([query], [prompt], [gold]))
        assert got == want and list(got["extra_logs"]) == list(want["extra_logs"]), (spec, query, gold)
        assert all(type(v) is float for v in [got["rewards"], got["scores"], *got["extra_logs"].values()])
    assert one.score_sample(None, PROMPT, "42")["extra_logs"]["reward_flag/error"] == 1.0


def test_the_reward_file_gives_one_samples_logs_as_floats_and_batches_as_tensors(scorers, monkeypatch):
    from rlhf_ext.rewards import openrlhf_protocol

    one, _ = scorers["math"]
    monkeypatch.setattr(openrlhf_protocol, "_env_scorer", one)
    q = _query("So \\boxed{42}.", True)
    single = openrlhf_reward.reward_func([q], [PROMPT], ["42"])
    assert single["rewards"].dtype == torch.float32 and single["rewards"].tolist() == [pytest.approx(1.2)]
    assert single["scores"].tolist() == [1.0] and single["extra_logs"] == _first(one.score([q], [PROMPT], ["42"]))["extra_logs"]
    pair = openrlhf_reward.reward_func([q, q], [PROMPT, PROMPT], ["42", "41"])
    assert pair["scores"].tolist() == [1.0, 0.0] and pair["extra_logs"]["reward/accuracy"].tolist() == [1.0, 0.0]
    as_tuple = openrlhf_reward.reward_func((q,), (PROMPT,), ("42",))  # not OpenRLHF's lists: the batch path
    assert as_tuple["rewards"].tolist() == single["rewards"].tolist() and as_tuple["extra_logs"] == single["extra_logs"]
    bad = openrlhf_reward.reward_func([q], [PROMPT], ["42", "43"])  # lengths differ: scored 0 and reported
    assert bad["rewards"].tolist() == [0.0] and bad["extra_logs"]["reward_flag/error"] == 1.0


def test_the_values_the_one_sample_path_gives_are_the_rewards(scorers):
    one, _ = scorers["math"]
    out = one.score([_query("So \\boxed{42}.", True)], [PROMPT], ["42"])
    assert out["rewards"] == [1.2] and out["scores"] == [1.0]
    out = one.score([_query("So \\boxed{41}.", False)], [PROMPT], ["42"])
    assert out["rewards"] == [0.2 - 0.5] and out["scores"] == [0.0]
    assert out["extra_logs"]["reward_flag/truncated"] == [1.0]
    out = one.score([_query("Thinking, no answer at all.", True)], [PROMPT], ["42"])
    assert out["rewards"] == [0.0] and out["extra_logs"]["reward_flag/no_answer"] == [1.0]
    out = one.score([_query("So \\boxed{5}.", True)], [PROMPT], [None])
    assert out["extra_logs"]["reward_flag/gold_unparsed"] == [1.0] and out["scores"] == [0.0]


def test_malformed_calls_fail_alike(scorers):
    one, batch = scorers["math"]
    for args in (([3], [PROMPT], ["42"]), (["a"], [PROMPT, PROMPT], ["42"]), (["a"], [7], ["42"]),
                 (["a"], PROMPT, ["42"])):
        got, want = one.score(*args), batch.score(*args)
        assert got == want and got["extra_logs"]["reward_flag/error"] == [1.0] * len(got["rewards"])


def test_a_reward_that_fails_scores_zero_and_is_flagged_as_in_the_batch_path(caplog):
    def boom_one(text, grade, truncated):
        if "nan" in text:
            return float("nan")
        raise RuntimeError("boom")

    @register_reward("test_only_one_boom", per_sample=True, one=boom_one)
    def boom(completions, **kwargs):
        return [boom_one(t, None, None) for t in completions]

    try:
        reward = WeightedReward("test_only_one_boom:1.0,truncation:-0.5")
        assert reward.scores_one
        for text in ("x", "a nan"):
            with caplog.at_level(logging.ERROR, logger="rlhf_ext.rewards.composite"):
                got = reward.score_one(text, None, True)
            want = reward([text], [None], truncated=[True])
            assert got == want and got.rewards == [-0.5] and got.flags["reward_error"] == [1.0]
            assert "test_only_one_boom" in caplog.text
    finally:
        REWARDS.unregister("test_only_one_boom")


def test_specs_without_one_sample_forms_use_the_batch_path():
    assert not WeightedReward("accuracy:1.0,length:0.5").scores_one  # length is batch-relative
    assert not WeightedReward("cosine:1.0").scores_one  # no one-sample form
    with pytest.raises(ValueError, match="one-sample form"):
        WeightedReward("accuracy:1.0,length:0.5").score_one("x", "1")
    with pytest.raises(ValueError, match="per_sample"):
        register_reward("test_only_one_not_per_sample", one=lambda t, g, c: 0.0)
    scorer = RewardScorer(RewardConfig(reward="accuracy:1.0,repetition_penalty:0.1", workers=1))
    try:
        assert not scorer._one_sample
        out = scorer.score([_query("So \\boxed{42}.", True)], [PROMPT], ["42"])
        assert out["scores"] == [1.0]
    finally:
        scorer.close()


def test_reward_file_tensors_are_float32_rows_that_own_their_memory():
    out = {"rewards": [1.2, 0.3], "scores": [1.0, 0.0],
           "extra_logs": {"reward/accuracy": [1.0, 0.0], "reward_flag/error": [0.0, 1.0]}}
    got = openrlhf_reward._tensors(out)
    want = {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items() if k != "extra_logs"}
    for key in ("rewards", "scores"):
        assert got[key].dtype == torch.float32 and torch.equal(got[key], want[key])
        assert got[key].untyped_storage().nbytes() == 2 * 4
    assert list(got["extra_logs"]) == list(out["extra_logs"])
    for key, values in out["extra_logs"].items():
        assert torch.equal(got["extra_logs"][key], torch.tensor(values, dtype=torch.float32))
    # a row changed in place changes no other row
    got["extra_logs"]["reward/accuracy"] += 5
    assert got["extra_logs"]["reward_flag/error"].tolist() == [0.0, 1.0] and got["scores"].tolist() == [1.0, 0.0]
    # one sample (OpenRLHF's per-sample call): the logs are floats, rewards and scores tensors of one
    one = openrlhf_reward._tensors({"rewards": [0.1], "scores": [0.0], "extra_logs": {"a": [math.pi], "b": [1.0]}})
    assert one["extra_logs"] == {"a": math.pi, "b": 1.0} and all(type(v) is float for v in one["extra_logs"].values())
    assert one["rewards"].shape == (1,) and one["rewards"].dtype == torch.float32
    assert one["rewards"].item() == pytest.approx(0.1) and one["scores"].tolist() == [0.0]
    odd = openrlhf_reward._tensors({"rewards": [0.1], "scores": [0.0], "extra_logs": {"a": [1.0, 2.0]}})
    assert odd["extra_logs"]["a"].tolist() == [1.0, 2.0]  # a log of another length: tensors, never raised
    ragged = openrlhf_reward._tensors({"rewards": [0.1], "scores": [0.0, 1.0], "extra_logs": {}})
    assert ragged["scores"].tolist() == [0.0, 1.0]
