"""benchmarks/plugin_step_cost.py compares like with like: both sides run, each is what it claims to be,
their numbers agree, and a side that is not what it claims (or numbers that differ) stops the run.

No time is asserted: only that both sides were measured and checked.
"""

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "plugin_step_cost.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("plugin_step_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_seam_comparison_reports_both_sides_with_equal_numerics(bench):
    report = bench.compare_seams("tiny", reps=1, threads=1, progress=False)
    assert set(report["seams"]) == set(bench.SEAMS)
    for seam, row in report["seams"].items():
        assert row["unpatched_s"] > 0 and row["patched_s"] > 0, seam
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0, seam
        assert row["max_abs_diff"], f"{seam}: no output was compared"
        assert all(d <= bench.ATOL + bench.RTOL for d in row["max_abs_diff"].values()), (seam, row["max_abs_diff"])
    # the advantages really differ in code path (grpo vs group_norm) yet agree in value
    assert report["seams"]["advantages"]["max_abs_diff"]["advantages"] < 1e-4
    ident = report["identity"]
    # unpatched: OpenRLHF's own objects; patched: rlhf_ext's patches (by their registered names)
    assert ident["unpatched"]["ppo_actor.PolicyLoss"] == "PolicyLoss"
    assert ident["patched"]["ppo_actor.PolicyLoss"] == "policy losses and aggregation modes"
    assert ident["patched"]["RemoteExperienceMaker.compute_advantages_and_returns"] == "advantage estimators"
    unpatched_adv = ident["unpatched"]["RemoteExperienceMaker.compute_advantages_and_returns"]
    assert unpatched_adv.startswith("RemoteExperienceMaker.")
    assert report["sum"]["unpatched_s"] > 0 and report["sum"]["patched_s"] > 0
    assert report["torch_threads"] == 1


def test_unpatched_side_refuses_to_run_with_the_plugin_requested(bench, tmp_path):
    env = dict(os.environ, RLHF_EXT_PLUGINS="rlhf_ext", RLHF_EXT_QUIET="1")
    # --plugin-free argv, but the variable makes the start-up hook activate the plugin: not "unpatched"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", "unpatched", "--shape", "tiny", "--outdir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert "unpatched side: the plugin was requested" in proc.stdout


def test_differing_numbers_stop_the_comparison(bench, tmp_path):
    torch.save({"loss": torch.tensor([1.0, 2.0])}, tmp_path / "unpatched_policy_loss.pt")
    torch.save({"loss": torch.tensor([1.0, 2.01])}, tmp_path / "patched_policy_loss.pt")
    with pytest.raises(SystemExit, match="not apples to apples"):
        bench.compare_outputs(str(tmp_path), "policy_loss")
    torch.save({"loss": torch.tensor([1.0, 2.0 + 1e-6])}, tmp_path / "patched_policy_loss.pt")
    assert bench.compare_outputs(str(tmp_path), "policy_loss")["loss"] == pytest.approx(1e-6, rel=0.3)
    torch.save({"other": torch.tensor([1.0])}, tmp_path / "patched_policy_loss.pt")
    with pytest.raises(SystemExit, match="different outputs"):
        bench.compare_outputs(str(tmp_path), "policy_loss")
