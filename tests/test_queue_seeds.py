"""Queue suites: ``seeds = [0, 1, 2]`` expands a run into one run per seed (a seed group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_ext.queue import SuiteError
from rlhf_ext.queue.suite import load_suite, resolve_run

SUITE = """
[suite]
name = "seeds"

[vars]
train = ["{python}", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", "{run_dir}.out"]

[defaults]
expect = ["{run_dir}.out"]

[[runs]]
name = "base"
commands = [["{train}", "base"]]

[[runs]]
name = "grpo"
seeds = [0, 1, 2]
commands = [["{train}", "seed={seed}"]]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def test_seeds_expand_in_suite_order_with_their_seed(tmp_path):
    suite = load_suite(write(tmp_path, SUITE))
    assert suite.run_names() == ["base", "grpo_seed0", "grpo_seed1", "grpo_seed2"]
    assert [r.group for r in suite.runs] == [None, "grpo", "grpo", "grpo"]
    resolved = [resolve_run(suite, r, {}, output=tmp_path / "q", snapshot=tmp_path / "s", inputs={})
                for r in suite.runs[1:]]
    assert [r.commands[0][-1] for r in resolved] == ["seed=0", "seed=1", "seed=2"]
    assert [Path(r.run_dir).name for r in resolved] == ["grpo_seed0", "grpo_seed1", "grpo_seed2"]
    # --only with the group's name selects every seed of it
    assert [r.name for r in suite.select(["grpo"])] == ["grpo_seed0", "grpo_seed1", "grpo_seed2"]
    assert [r.name for r in suite.select(["grpo_seed1", "base"])] == ["base", "grpo_seed1"]
    with pytest.raises(SuiteError, match=r"seed groups: grpo"):
        suite.select(["nope"])


@pytest.mark.parametrize("seeds, message", [
    ("[]", "non-empty list of non-negative integers"),
    ("[0, 0]", "lists a seed twice"),
    ("['a']", "non-empty list of non-negative integers"),
    ("[-1]", "non-empty list of non-negative integers"),
])  # fmt: skip
def test_bad_seed_lists_are_refused(tmp_path, seeds, message):
    with pytest.raises(SuiteError, match=message):
        load_suite(write(tmp_path, SUITE.replace("seeds = [0, 1, 2]", f"seeds = {seeds}")))


def test_seeds_nothing_uses_or_a_clashing_name_are_refused(tmp_path):
    with pytest.raises(SuiteError, match=r"nothing|neither its commands nor any variable uses \{seed\}"):
        load_suite(write(tmp_path, SUITE.replace('"seed={seed}"', '"same"')))
    extra = '\n[[runs]]\nname = "grpo_seed1"\ncommands = [["{train}", "x"]]\n'
    with pytest.raises(SuiteError, match="run 'grpo_seed1': duplicate run name"):
        load_suite(write(tmp_path, SUITE + extra))  # a run after the group
    before = SUITE.replace('\n[[runs]]\nname = "grpo"', extra + '\n[[runs]]\nname = "grpo"')
    with pytest.raises(SuiteError, match="seed run 'grpo_seed1' clashes"):
        load_suite(write(tmp_path, before))  # a run before it
    with pytest.raises(SuiteError, match="do not also set a variable 'seed'"):
        load_suite(write(tmp_path, SUITE.replace('seeds = [0, 1, 2]', 'seeds = [0, 1]\nvars = { seed = "5" }')))


def test_the_queue_runs_every_seed_and_records_its_group(tmp_path):
    suite = write(tmp_path, SUITE)
    out = tmp_path / "q"
    proc = subprocess.run([sys.executable, "-m", "rlhf_ext.cli", "queue", "run", str(suite), "--output", str(out),
                           "--only", "grpo"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(r["name"], r["status"], r.get("seed_group")) for r in manifest["runs"]] == [
        ("grpo_seed0", "done", "grpo"), ("grpo_seed1", "done", "grpo"), ("grpo_seed2", "done", "grpo")]
    assert [(out / "runs" / f"grpo_seed{s}.out").read_text() for s in range(3)] == ["seed=0", "seed=1", "seed=2"]
