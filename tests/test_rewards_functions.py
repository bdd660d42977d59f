"""Open-R1 rule rewards (hand-computed values), the reward registry with a really installed third-party
package, weighted specs and presets, and the environment configuration."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.rewards import (
    REWARD_PRESETS,
    GradeResult,
    MathGrader,
    RewardConfig,
    UnknownRewardError,
    WeightedReward,
    accuracy_reward,
    answer_format_reward,
    available_rewards,
    cosine_scaled_reward,
    format_reward,
    get_reward,
    length_reward,
    parse_reward_spec,
    reasoning_steps_reward,
    register_reward,
    repetition_penalty_reward,
    reward_config_from_env,
    soft_overlong_punishment_reward,
    tag_count_reward,
    truncation_reward,
)
from rlhf_ext.rewards.registry import REWARDS
from rlhf_ext.rewards.rule_rewards import format_matches

R1 = "<think>\nI add.\n</think>\n<answer>\n\\boxed{4}\n</answer>"


def _g(correct, gold_parsed=True):
    return GradeResult(correct=correct, extracted="x", gold_parsed=gold_parsed)


@pytest.fixture(scope="module")
def grader():
    with MathGrader(timeout=10.0, workers=2, spare_workers=0) as g:
        yield g


# --- Open-R1 rule rewards ------------------------------------------------------------------------


def test_format_reward():
    assert format_reward([R1, R1.replace("\n</think>", "</think>"), "<think>\n\n</think>\n<answer>\n\n</answer>",
                          R1 + "\ntrailing line", R1 + " trailing"]) == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert format_reward([[{"role": "assistant", "content": R1}]]) == [1.0]  # Open-R1's chat form


_OPEN_R1_FORMAT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(["<think>\n", "\n</think>\n<answer>\n", "\n</answer>", "\n", "a", "</think>",
                                 "<answer>\n", "\n</think>\n", "x\n", "<think>"]), max_size=9))
def test_linear_format_check_equals_open_r1_regex(pieces):
    text = "".join(pieces)
    for candidate in (text, "<think>\n" + text):
        assert format_matches(candidate) == bool(_OPEN_R1_FORMAT.match(candidate))


def test_format_check_is_linear_on_degenerate_repetition():
    text = "<think>\n" + "\n</think>\n<answer>\n" * 40_000 + "x"  # the regex backtracks quadratically here
    assert format_matches(text) is False and format_matches(text + "\n</answer>") is True


def test_tag_count_reward():
    assert tag_count_reward([R1, "<think>\nonly", "<think>\n<think>\n\n</think>\n", ""]) == [1.0, 0.25, 0.25, 0.0]


def test_reasoning_steps_reward():
    texts = ["Step 1: a. Step 2: b.", "First, x. Second, y. Next, z. Finally, w.", "1. a\n2. b", "\n- a\n* b\n- c",
             "plain"]
    # "^\d+\." has no MULTILINE flag in Open-R1: only the "1." at the very start counts.
    assert reasoning_steps_reward(texts) == [2 / 3, 1.0, 1 / 3, 1.0, 0.0]  # 3 bullets: \n-, \n*, \n-


def test_length_reward_kimi():
    texts = ["a" * 10, "b" * 20, "c" * 30]
    # lambda = 0.5 - (L - 10) / 20 = [0.5, 0.0, -0.5]; wrong answers get min(0, lambda)
    assert length_reward(texts, grades=[_g(True), _g(False), _g(True)]) == [0.5, 0.0, -0.5]
    assert length_reward(texts, grades=[_g(False), _g(False), _g(False)]) == [0.0, 0.0, -0.5]
    assert length_reward(["x", "y"], grades=[_g(True), _g(False)]) == [0.0, 0.0]  # equal lengths
    assert length_reward([], grades=[]) == []


def test_cosine_reward():
    texts = ["", "a" * 500, "a" * 1000]
    correct = cosine_scaled_reward(texts, grades=[_g(True)] * 3)
    wrong = cosine_scaled_reward(texts, grades=[_g(False)] * 3)
    assert correct == pytest.approx([1.0, 0.75, 0.5])  # short correct answers earn most
    assert wrong == pytest.approx([-1.0, -0.75, -0.5])  # short wrong answers are punished most
    unparsed = cosine_scaled_reward(["a" * 500], grades=[_g(False, gold_parsed=False)])
    assert unparsed == pytest.approx([-0.75])  # an unparsed gold is wrong, not "skipped as correct"
    custom = cosine_scaled_reward(["a" * 100], grades=[_g(True)], max_len=200, min_value_correct=0.0,
                                  max_value_correct=2.0)
    assert custom == pytest.approx([1.0])
    with pytest.raises(ValueError, match="max_len must be positive"):
        cosine_scaled_reward(["a"], grades=[_g(True)], max_len=0)


def test_repetition_penalty():
    out = repetition_penalty_reward(["a b c a b c", "a b", "", "one two three four"], ngram_size=3, max_penalty=-1.0)
    assert out == [pytest.approx(-0.25), 0.0, 0.0, 0.0]
    assert repetition_penalty_reward(["x x x x"], ngram_size=2, max_penalty=-0.5) == [pytest.approx(-1 / 3)]
    with pytest.raises(ValueError, match="should not be positive"):
        repetition_penalty_reward(["a"], max_penalty=1.0)
    with pytest.raises(ValueError, match="must be 'en' or 'zh'"):
        repetition_penalty_reward(["a"], language="fr")


def test_repetition_penalty_chinese_segments_with_jieba():
    # jieba: 我|爱|北京|天安门|。 twice -> 10 segments, 8 trigrams of which 5 distinct
    text = "我爱北京天安门。我爱北京天安门。"
    assert repetition_penalty_reward([text], language="zh") == [pytest.approx(-(1 - 5 / 8))]
    # whitespace splitting would see one "word" and no trigram at all
    assert repetition_penalty_reward([text], language="en") == [0.0]
    assert repetition_penalty_reward(["我爱北京"], language="zh", ngram_size=4) == [0.0]  # 3 segments < n


def test_repetition_penalty_chinese_without_jieba_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_jieba(name, *args, **kwargs):
        if name == "jieba":
            raise ImportError("No module named 'jieba'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_jieba)
    with pytest.raises(ValueError, match="pip install jieba"):
        repetition_penalty_reward(["我爱北京"], language="zh")


def test_soft_overlong_punishment():
    lengths = [6, 8, 10, 11]
    out = soft_overlong_punishment_reward(["x"] * 4, max_completion_len=10, soft_punish_cache=4,
                                          completion_lengths=lengths)
    assert out == [0.0, -0.5, -1.0, -1.0]
    by_ids = soft_overlong_punishment_reward(["x"] * 2, max_completion_len=10, soft_punish_cache=4,
                                             completion_ids=[[1] * 8, [1] * 3])
    assert by_ids == [-0.5, 0.0]
    by_chars = soft_overlong_punishment_reward(["y" * 9], max_completion_len=10, soft_punish_cache=4)
    assert by_chars == [-0.75]
    with pytest.raises(ValueError, match="soft_punish_cache <= max_completion_len"):
        soft_overlong_punishment_reward(["x"], max_completion_len=4, soft_punish_cache=8)


def test_soft_overlong_punishment_called_the_open_r1_way():
    # Open-R1: reward(completion_ids=...) or reward(completion_ids) -- token ids, no completions
    kw = dict(max_completion_len=100, soft_punish_cache=20)
    assert soft_overlong_punishment_reward(completion_ids=[[1] * 90], **kw) == [-0.5]
    assert soft_overlong_punishment_reward([[1] * 90, [7] * 10, [], [2] * 101], **kw) == [-0.5, 0.0, 0.0, -1.0]
    # chat-form completions are still texts, not ids
    assert soft_overlong_punishment_reward([[{"role": "assistant", "content": "y" * 90}]], **kw) == [-0.5]
    with pytest.raises(ValueError, match="needs completion_ids"):
        soft_overlong_punishment_reward(**kw)


def test_truncation_and_answer_format():
    assert truncation_reward(["a", "b"], truncated=[True, False]) == [1.0, 0.0]
    assert truncation_reward(["a"]) == [0.0]
    assert answer_format_reward(["\\boxed{1}", "The answer is 3", "<answer>4</answer>", "#### 5", "I think 3"]) == \
        [1.0, 1.0, 1.0, 1.0, 0.0]


def test_accuracy_reward_with_the_real_grader(grader):
    completions = ["\\boxed{\\frac{1}{2}}", "The answer is 0.5.", "\\boxed{3}", "\\boxed{25}", "\\boxed{7}"]
    golds = ["0.5", "\\frac12", "4", "025", None]
    assert accuracy_reward(completions, golds, grader=grader) == [1.0, 1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="needs the gold answers"):
        accuracy_reward(["x"])
    with pytest.raises(ValueError, match="1 completions but 2 solutions"):
        accuracy_reward(["x"], ["1", "2"], grader=grader)


def test_bad_completion_type_is_named():
    with pytest.raises(TypeError, match=r"completions\[1\] must be a str"):
        format_reward(["ok", 42])


# --- registry ------------------------------------------------------------------------------------


def test_registry_names_and_errors():
    builtins = {"accuracy", "format", "tag_count", "reasoning_steps", "length", "cosine", "repetition_penalty",
                "soft_overlong_punishment", "truncation", "answer_format"}
    assert builtins <= set(available_rewards())
    assert get_reward("format") is format_reward
    with pytest.raises(KeyError) as err:
        get_reward("acuracy")
    assert isinstance(err.value, ValueError) and isinstance(err.value, UnknownRewardError)
    assert "unknown reward 'acuracy'" in str(err.value) and "accuracy" in str(err.value)
    with pytest.raises(ValueError, match="already registered"):
        register_reward("format")(lambda completions, **kw: [])
    with pytest.raises(ValueError, match="without ','"):
        register_reward("a:b")
    with pytest.raises(TypeError, match="non-callable"):
        register_reward("test_only_x")(3)


def test_user_reward_in_a_weighted_spec():
    @register_reward("test_only_len")
    def length_in_chars(completions, *, scale: float = 1.0, **kwargs):
        return [scale * len(c) for c in completions]

    try:
        reward = WeightedReward("test_only_len:0.5,format:2", options={"test_only_len": {"scale": 2.0}})
        out = reward(["abcd", R1])
        assert out.components["test_only_len"] == [8.0, 2.0 * len(R1)]
        assert out.rewards == [4.0, len(R1) + 2.0]
        assert out.correct is None  # nothing needed grading
    finally:
        REWARDS.unregister("test_only_len")


# --- weighted specs ------------------------------------------------------------------------------


def test_parse_reward_spec():
    assert parse_reward_spec("accuracy:1.0, format:0.2 ,truncation:-0.5") == [
        ("accuracy", 1.0), ("format", 0.2), ("truncation", -0.5)]
    assert parse_reward_spec("format") == [("format", 1.0)]
    assert parse_reward_spec("math") == [("accuracy", 1.0), ("answer_format", 0.2), ("truncation", -0.5)]
    assert parse_reward_spec("open_r1") == parse_reward_spec(REWARD_PRESETS["open_r1"])
    for bad, msg in [("", "non-empty"), ("accuracy:x", "not a number"), ("accuracy:nan", "finite"),
                     ("format,format:2", "appears twice"), ("accuracy,,format", "empty entry"),
                     ("math:1.0", "preset 'math' cannot be weighted")]:
        with pytest.raises(ValueError, match=msg):
            parse_reward_spec(bad)
    with pytest.raises(UnknownRewardError, match="unknown reward 'acc'"):
        parse_reward_spec("acc:1")


def test_options_are_checked_when_the_combination_is_built():
    with pytest.raises(ValueError, match="unknown option 'max_lenght' for reward 'cosine'.*max_len"):
        WeightedReward("cosine", options={"cosine": {"max_lenght": 10}})
    with pytest.raises(ValueError, match="bad options for reward 'cosine'.*max_len must be positive"):
        WeightedReward("cosine", options={"cosine": {"max_len": -1}})
    with pytest.raises(ValueError, match="not in the reward spec"):
        WeightedReward("format", options={"cosine": {"max_len": 10}})
    with pytest.raises(ValueError, match="unknown option 'grades'"):
        WeightedReward("format", options={"format": {"grades": []}})
    with pytest.raises(ValueError, match="timeout must be a positive"):
        WeightedReward("accuracy", timeout=0)


def test_math_preset_composite(grader):
    reward = WeightedReward("math", grader=grader)
    completions = [
        "Adding gives \\boxed{4}.",  # correct, formatted
        "The answer is 5.",  # wrong, formatted
        "I keep thinking and thinking",  # no answer, truncated
        "\\boxed{4}",  # correct but truncated (cut off after the answer)
    ]
    out = reward(completions, ["4", "4", "4", "#### 4"], truncated=[False, False, True, True])
    assert out.components == {"accuracy": [1.0, 0.0, 0.0, 1.0], "answer_format": [1.0, 1.0, 0.0, 1.0],
                              "truncation": [0.0, 0.0, 1.0, 1.0]}
    assert out.rewards == pytest.approx([1.2, 0.2, -0.5, 0.7])
    assert out.correct == [1.0, 0.0, 0.0, 1.0]
    assert out.flags["no_answer"] == [0.0, 0.0, 1.0, 0.0]
    assert out.flags["truncated"] == [0.0, 0.0, 1.0, 1.0]
    assert out.flags["gold_unparsed"] == [0.0] * 4 and out.flags["timeout"] == [0.0] * 4
    with pytest.raises(ValueError, match="got 1 completions but 2 entries in truncated"):
        reward(["x"], ["1"], truncated=[True, False])


def test_all_correctness_rewards_share_one_grading_pass(grader):
    reward = WeightedReward("accuracy:1,length:1,cosine:1", grader=grader)
    before = grader.stats()["submitted"]
    out = reward(["\\boxed{2}", "long wrong answer \\boxed{3}"], ["2", "2"])
    assert grader.stats()["submitted"] - before == 2
    assert out.components["accuracy"] == [1.0, 0.0]
    assert out.components["length"] == [0.5, -0.5]


def test_unparseable_gold_is_reported_not_rewarded(grader):
    out = WeightedReward("accuracy:1,cosine:1", grader=grader)(["\\boxed{1}"], [""])
    assert out.correct == [0.0] and out.components["accuracy"] == [0.0]
    assert out.flags["gold_unparsed"] == [1.0]
    assert out.components["cosine"][0] < 0


def test_a_failing_component_is_scored_zero_and_flagged():
    @register_reward("test_only_broken")
    def broken(completions, **kwargs):
        if completions:  # fine on the empty dry run at construction, broken on real batches
            raise RuntimeError("boom")
        return []

    try:
        out = WeightedReward("test_only_broken:1,format:1")([R1, "x"])
        assert out.components["test_only_broken"] == [0.0, 0.0]
        assert out.rewards == [1.0, 0.0]
        assert out.flags["reward_error"] == [1.0, 1.0]
    finally:
        REWARDS.unregister("test_only_broken")


# --- configuration from the environment ----------------------------------------------------------


def test_config_from_env_defaults_and_values():
    assert reward_config_from_env({}) == RewardConfig()
    cfg = reward_config_from_env({
        "RLHF_EXT_REWARD": "accuracy:1.0,cosine:0.5",
        "RLHF_EXT_REWARD_TIMEOUT": "2.5",
        "RLHF_EXT_REWARD_WORKERS": "3",
        "RLHF_EXT_REWARD_OPTIONS": '{"cosine": {"max_len": 2000}}',
        "RLHF_EXT_REWARD_EOS": '["<|im_end|>", "</s>"]',
    })
    assert (cfg.reward, cfg.timeout, cfg.workers, cfg.eos_tokens) == ("accuracy:1.0,cosine:0.5", 2.5, 3,
                                                                      ("<|im_end|>", "</s>"))
    assert cfg.options == {"cosine": {"max_len": 2000}}
    assert reward_config_from_env(cfg.to_env()) == cfg  # round trip
    assert reward_config_from_env({"RLHF_EXT_REWARD_EOS": "<|im_end|>, <|endoftext|>"}).eos_tokens == (
        "<|im_end|>", "<|endoftext|>")


@pytest.mark.parametrize("env, msg", [
    ({"RLHF_EXT_REWARD": "acuracy"}, "unknown reward 'acuracy'"),
    ({"RLHF_EXT_REWARD_TIMEOUT": "soon"}, "RLHF_EXT_REWARD_TIMEOUT must be a number"),
    ({"RLHF_EXT_REWARD_TIMEOUT": "-1"}, "timeout must be a positive"),
    ({"RLHF_EXT_REWARD_WORKERS": "2.5"}, "RLHF_EXT_REWARD_WORKERS must be an integer"),
    ({"RLHF_EXT_REWARD_WORKERS": "0"}, "workers must be a positive integer"),
    ({"RLHF_EXT_REWARD_OPTIONS": "{bad"}, "RLHF_EXT_REWARD_OPTIONS is not valid JSON"),
    ({"RLHF_EXT_REWARD_OPTIONS": '{"cosine": 3}'}, "must be a JSON object of objects"),
    ({"RLHF_EXT_REWARD": "format", "RLHF_EXT_REWARD_OPTIONS": '{"cosine": {"max_len": 3}}'}, "not in the reward spec"),
    ({"RLHF_EXT_REWARD_EOS": "[1]"}, "list of non-empty strings"),
])
def test_config_errors_name_the_problem(env, msg):
    with pytest.raises(ValueError, match=msg):
        reward_config_from_env(env)


# --- a third-party reward package, really installed ------------------------------------------------

PLUGIN_SETUP = """
from setuptools import setup
setup(
    name="rlhf-ext-demo-rewards",
    version="0.0.1",
    py_modules=["demo_rewards", "broken_rewards"],
    entry_points={"rlhf_ext.rewards": ["demo = demo_rewards", "broken = broken_rewards"]},
)
"""

PLUGIN_MODULE = """
from rlhf_ext.rewards import register_reward, get_reward

@register_reward("demo_short_and_right", uses_correctness=True)
def demo_short_and_right(completions, solution=None, *, grades=None, **kwargs):
    get_reward("format")  # looking up from inside an entry point must not deadlock
    return [1.0 / len(c) if g.correct else 0.0 for c, g in zip(completions, grades)]
"""

CHECK = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from rlhf_ext.rewards import WeightedReward, available_rewards, get_reward
    names = available_rewards()
with WeightedReward("demo_short_and_right:2,format:1", workers=1) as reward:
    out = reward(["\\\\boxed{4}", "\\\\boxed{5}"], ["4", "4"])
try:
    get_reward("from_broken_plugin")
    missing = ""
except KeyError as e:
    missing = str(e)
print(json.dumps({"names": names, "rewards": out.rewards, "warnings": [str(w.message) for w in caught],
                  "missing": missing}))
"""


def test_third_party_reward_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text(PLUGIN_SETUP)
    (src / "demo_rewards.py").write_text(PLUGIN_MODULE)
    (src / "broken_rewards.py").write_text("raise ImportError('this reward plugin is broken on purpose')\n")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(src)], check=True, capture_output=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "demo_short_and_right" in res["names"] and "accuracy" in res["names"]
    assert res["rewards"] == [pytest.approx(2 / len("\\boxed{4}")), 0.0]
    assert any("'broken'" in w and "broken on purpose" in w for w in res["warnings"])
    assert "broken (ImportError: this reward plugin is broken on purpose)" in res["missing"]
