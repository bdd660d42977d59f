"""The real ``rule_verifier.verifier`` and ``compute_verifier_score`` with rlhf_ext rewards."""

from types import SimpleNamespace

import pytest
import torch

GOOD = "<think>\n2+2 is 4\n</think>\n<answer>\n\\boxed{4}\n</answer>"
WRONG = "<think>\nguess\n</think>\n<answer>\n\\boxed{5}\n</answer>"
PLAIN = "the answer is \\boxed{4}"
RESPONSES = [GOOD, WRONG, PLAIN]
LABELS = ["4", "4", "4"]


def config(functions, weights, **extra):
    from mindspeed_rl.config_cls.rl_config import RLConfig

    return RLConfig({"verifier_function": functions, "verifier_weight": weights, "verifier_timeout": 5, **extra})


def test_rlhf_ext_rewards_mix_with_mindspeed_ones():
    from mindspeed_rl.models import rule_verifier

    from rlhf_ext.rewards import WeightedReward

    cfg = config(["acc", "rlhf_ext:accuracy", "format", "rlhf_ext:format"], [1.0, 2.0, 0.5, 0.25])
    scores, metrics = rule_verifier.verifier(RESPONSES, {"labels": LABELS}, cfg)

    original = rule_verifier.accuracy_reward(sequences=RESPONSES, answers=LABELS)
    fmt = rule_verifier.format_reward(sequences=RESPONSES)
    with WeightedReward("accuracy:1.0", timeout=5) as acc, WeightedReward("format:1.0", timeout=5) as form:
        ours_acc = acc(RESPONSES, LABELS).rewards
        ours_fmt = form(RESPONSES, LABELS).rewards
    assert ours_acc == [1.0, 0.0, 1.0]
    assert ours_fmt == [1.0, 1.0, 0.0]  # Open-R1's <think>/<answer> format
    want = [a + 2.0 * b + 0.5 * c + 0.25 * d for a, b, c, d in zip(original, ours_acc, fmt, ours_fmt)]
    assert scores == pytest.approx(want)
    # MindSpeed-RL's own metrics, and the OpenRLHF side's names for rlhf_ext's components and flags.
    assert metrics["acc_rewards/mean"] == original
    assert metrics["reward/accuracy"] == ours_acc and metrics["reward/format"] == ours_fmt
    assert metrics["reward_flag/no_answer"] == [0.0, 0.0, 0.0]


def test_presets_and_weighted_specs():
    from mindspeed_rl.models import rule_verifier

    scores, metrics = rule_verifier.verifier(RESPONSES, {"labels": LABELS}, config(["rlhf_ext:math"], [1.0]))
    # math = accuracy 1.0 + answer_format 0.2 + truncation -0.5 (nothing truncated here)
    assert scores == pytest.approx([1.2, 0.2, 1.2])
    assert set(metrics) >= {"reward/accuracy", "reward/answer_format", "reward/truncation"}


def test_builtin_names_alone_are_unchanged():
    from mindspeed_rl.models import rule_verifier

    from rlhf_ext.patches.mindspeed_rl import compat

    builtin = compat.original(rule_verifier, "verifier")
    cfg = config(["acc", "format"], [1.0, 0.5])
    assert rule_verifier.verifier(RESPONSES, {"labels": LABELS}, cfg) == builtin(RESPONSES, {"labels": LABELS}, cfg)


def test_unknown_name_is_a_configuration_error_and_a_verifier_error():
    from mindspeed_rl.models import rule_verifier

    from rlhf_ext.patches.mindspeed_rl import ConfigError

    with pytest.raises(ConfigError, match=r"'acc_typo' is not a known reward.*math_17k_acc.*rlhf_ext:accuracy"):
        config(["acc_typo"], [1.0])
    with pytest.raises(ConfigError, match="rlhf_ext:nope"):
        config(["rlhf_ext:nope"], [1.0])
    # A config that bypassed RLConfig (built by hand) still cannot score 0 silently.
    cfg = SimpleNamespace(verifier_function=["acc", "acc_typo"], verifier_weight=[1.0, 1.0], verifier_timeout=5)
    with pytest.raises(ValueError, match="unknown reward.*'acc_typo'"):
        rule_verifier.verifier(RESPONSES, {"labels": LABELS}, cfg)


def test_hostile_answer_times_out_and_scores_zero():
    from mindspeed_rl.models import rule_verifier

    hostile = "\\boxed{9^{9^{9^{9}}}}"
    cfg = config(["rlhf_ext:accuracy"], [1.0], verifier_timeout=1)
    scores, metrics = rule_verifier.verifier([hostile, PLAIN], {"labels": ["5", "4"]}, cfg)
    assert scores == [0.0, 1.0]


def test_compute_verifier_score_with_a_real_tokenizer(tiny_tokenizer):
    from mindspeed_rl.models import rule_verifier

    cfg = config(["rlhf_ext:accuracy", "acc"], [1.0, 1.0], n_samples_per_prompt=3)
    prompt = tiny_tokenizer("what is 2+2?", return_tensors="pt")["input_ids"]
    encoded = [tiny_tokenizer(r)["input_ids"] for r in RESPONSES]
    width = max(map(len, encoded))
    pad = tiny_tokenizer.pad_token_id
    responses = torch.tensor([ids + [pad] * (width - len(ids)) for ids in encoded])
    labels = tiny_tokenizer(["4"] * 3, return_tensors="pt")["input_ids"]
    batch = {
        "prompts": prompt.repeat(3, 1),
        "responses": responses,
        "response_length": torch.tensor([[len(ids)] for ids in encoded]),
        "labels": labels,
    }
    megatron_config = SimpleNamespace(dataset_additional_keys=["labels"])
    scores, metrics = rule_verifier.compute_verifier_score(batch, megatron_config, cfg, tiny_tokenizer)
    acc = rule_verifier.accuracy_reward(sequences=RESPONSES, answers=LABELS)
    assert scores.shape == (3, 1)
    assert scores.flatten().tolist() == pytest.approx([1.0 + acc[0], 0.0 + acc[1], 1.0 + acc[2]])
    assert metrics["reward/accuracy"] == [1.0, 0.0, 1.0]
