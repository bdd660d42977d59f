"""Start-up hook: which command lines are MindSpeed-RL's (there --plugin is stripped before Hydra parses)."""

import os

from rlhf_ext.patches.activation import command_line, startup


def _checkout(tmp_path):
    (tmp_path / "mindspeed_rl").mkdir()
    (tmp_path / "cli").mkdir()
    return tmp_path


def test_mindspeed_rl_cli_scripts_are_recognised(tmp_path):
    root = _checkout(tmp_path)
    for algo in ("grpo", "dapo", "ppo"):
        assert command_line.program_is_mindspeed_rl_cli([str(root / "cli" / f"train_{algo}.py"), "--config-name", "x"])
    assert not command_line.program_is_mindspeed_rl_cli([str(root / "cli" / "train_dpo.py")])  # not supported
    assert not command_line.program_is_mindspeed_rl_cli([str(root / "cli" / "preprocess_data.py")])
    other = tmp_path / "elsewhere" / "cli"
    other.mkdir(parents=True)
    assert not command_line.program_is_mindspeed_rl_cli([str(other / "train_grpo.py")])  # no mindspeed_rl/ beside it
    assert not command_line.program_is_mindspeed_rl_cli(["train_grpo.py"]) or os.path.isdir("mindspeed_rl")


def test_plugin_flags_are_removed_from_a_hydra_command_line():
    names, rest = startup.extract_plugin_flags(
        ["--config-name", "grpo_qwen25_7b_A3", "--plugin", "rlhf_ext", "rl_config.adv_estimator=rloo", "--plugin=x"])
    assert names == ["rlhf_ext", "x"]
    assert rest == ["--config-name", "grpo_qwen25_7b_A3", "rl_config.adv_estimator=rloo"]
