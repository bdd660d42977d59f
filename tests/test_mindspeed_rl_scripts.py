"""scripts/npu/train_mindspeed_rl.sh: input checks and the command it runs (--dry-run starts nothing)."""

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "npu", "train_mindspeed_rl.sh")


def run(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def checkout(tmp_path):
    """The layout the script checks for (a real checkout is not needed for --dry-run)."""
    (tmp_path / "mindspeed_rl").mkdir()
    (tmp_path / "cli").mkdir()
    for algo in ("grpo", "dapo", "ppo"):
        (tmp_path / "cli" / f"train_{algo}.py").write_text("")
    return tmp_path


def test_help_has_an_example():
    proc = run("--help")
    assert proc.returncode == 0 and "Example" in proc.stdout and "--mindspeed-rl" in proc.stdout


def test_dry_run_prints_the_plugin_command(checkout):
    proc = run("--mindspeed-rl", str(checkout), "--algo", "dapo", "--config-name", "gspo_qwen25_7b_A3", "--dry-run",
               "--", "megatron_training.tokenizer_name_or_path=/m")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.strip().splitlines()[-1]
    assert command.startswith(f"python3 {checkout}/cli/train_dapo.py --config-dir {REPO}/examples/mindspeed_rl")
    assert "--config-name gspo_qwen25_7b_A3 --plugin rlhf_ext megatron_training.tokenizer_name_or_path=/m" in command
    assert f"export PYTHONPATH={checkout}" in proc.stdout


@pytest.mark.parametrize("args, status, message", [
    ((), 2, "--mindspeed-rl DIR (the MindSpeed-RL checkout) is required"),
    (("--mindspeed-rl", "/nonexistent"), 1, "is not a MindSpeed-RL checkout"),
    (("--algo", "sft"), 2, "--algo must be grpo, dapo or ppo"),
    (("--config-name", "nope"), 1, "config 'nope.yaml' is in neither"),
    (("--config-name", "a b"), 2, "must be a config name"),
    (("--", "--plugin", "rlhf_ext"), 2, "adds --plugin rlhf_ext itself"),
    (("--bogus",), 2, "unknown option '--bogus'"),
])
def test_bad_input_fails_early_with_a_message(checkout, args, status, message):
    if args and args[0] != "--mindspeed-rl" and args != ():
        args = ("--mindspeed-rl", str(checkout), "--dry-run") + args
    proc = run(*args)
    assert proc.returncode == status, (proc.stdout, proc.stderr)
    assert message in proc.stderr
