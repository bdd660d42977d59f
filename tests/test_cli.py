"""The `rlhf-ext` console command dispatches to its subcommands."""

import subprocess
import sys

import pytest

from rlhf_ext.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "rlhf_ext.cli", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_subcommand():
    out = run("--help")
    assert out.returncode == 0
    for name in ("reward-server", "reward-file", "tiny-task", "smoke"):
        assert name in out.stdout


def test_smoke_help_is_the_smoke_commands_own():
    out = run("smoke", "--help")
    assert out.returncode == 0, out.stderr
    assert "--estimator" in out.stdout and "--workdir" in out.stdout


def test_tiny_task_needs_an_output_and_unknown_flags_fail(capsys):
    with pytest.raises(SystemExit) as err:
        main(["tiny-task"])
    assert err.value.code == 2
    assert "--output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reward-file", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_reward_file_prints_an_existing_path(capsys):
    assert main(["reward-file"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.endswith("openrlhf_reward.py")
    with open(path) as f:
        assert "def reward_func" in f.read()


def test_reward_file_verl_matches_the_module_entrance(capsys):
    import argparse

    from rlhf_ext.cli import build_parser
    from rlhf_ext.rewards import path as reward_path

    assert main(["reward-file", "--verl"]) == 0
    shown = capsys.readouterr().out.strip()
    reward_path.main(["--verl"])
    assert capsys.readouterr().out.strip() == shown == reward_path.verl_reward_file_path()
    with open(shown) as f:
        assert "compute_score" in f.read()
    # both entrances offer the same flags (the tool declares them once, the CLI takes them from it)
    module_parser = argparse.ArgumentParser()
    reward_path.add_arguments(module_parser)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["reward-file"]

    def flags(parser):
        return sorted((tuple(a.option_strings), a.help) for a in parser._actions
                      if a.option_strings and a.dest != "help")

    assert flags(sub) == flags(module_parser)


def test_every_subcommand_is_declared_one_way():
    """Each subcommand's flags come from its tool's module (``add_arguments``), which also runs it
    (``run``); the CLI holds only names and help. Building the parser for one command imports that
    tool alone, so no command pays for another's imports."""
    import importlib
    import json
    import subprocess

    from rlhf_ext.cli import _SUBCOMMANDS

    for name, (module_name, _) in _SUBCOMMANDS.items():
        if module_name is None:  # smoke forwards everything to its own parser
            continue
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.run), name
    code = ("import json, sys; from rlhf_ext.cli import build_parser; build_parser(sys.argv[1]); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rlhf_ext.'))))")
    loaded = {}
    for command in ("runs", "queue", "reward-file", ""):
        out = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        loaded[command] = set(json.loads(out.stdout))
    tools = {"rlhf_ext.runs.cli", "rlhf_ext.queue.cli", "rlhf_ext.rewards.reward_file", "rlhf_ext.report.cli",
             "rlhf_ext.data.cli", "rlhf_ext.alignment", "rlhf_ext.tours.tiny_task", "rlhf_ext.rewards.server"}
    assert loaded["runs"] & tools == {"rlhf_ext.runs.cli"}
    assert loaded["queue"] & tools == {"rlhf_ext.queue.cli"}
    assert loaded["reward-file"] & tools == {"rlhf_ext.rewards.reward_file"}
    assert loaded[""] & tools == set()  # `rlhf-ext --help` lists the commands without importing a tool
