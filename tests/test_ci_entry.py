"""``.ci/run``, CI's entry point: it runs the README's test command, and its exit code is that command's,
including when setup fails before any test runs (bash's errexit ignores a failing ``a`` in ``a && b``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = "bash scripts/setup_env.sh && .venv/bin/python -m pytest -q"


def test_ci_runs_the_readmes_test_command():
    assert TEST_COMMAND in (ROOT / "README.md").read_text()
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("setup_rc, pytest_rc, expected", [(3, 0, 3), (0, 1, 1), (0, 0, 0)])
def test_ci_exits_with_the_failure_of_setup_or_tests(tmp_path, setup_rc, pytest_rc, expected):
    # a stand-in checkout: .ci/run itself, a setup script and a "python" that only exit with a code
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "setup_env.sh").write_text(f"exit {setup_rc}\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho pytest ran\nexit {pytest_rc}\n")
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert ("pytest ran" in proc.stdout) == (setup_rc == 0)
    assert f"(exit {expected})" in proc.stdout
