"""The algorithms tour runs as a command and shows every registered algorithm."""

import subprocess
import sys

from rlhf_ext.algorithms import available_advantages, available_kl_estimators, available_policy_losses


def test_demo_prints_every_algorithm():
    out = subprocess.run([sys.executable, "-m", "rlhf_ext.tours.demo"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in available_advantages() + available_policy_losses() + available_kl_estimators():
        assert f"  {name}" in out.stdout, name
    assert "nan" not in out.stdout.lower()
    assert "zero-variance groups (DAPO dynamic sampling drops these): [False, False, True]" in out.stdout
