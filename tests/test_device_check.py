"""Issue 27: the prepared GPU check (scripts/gpu/device_check.sh, benchmarks/device_check.py) runs on the
CPU with small shapes, end to end, through its shell entry point.

It must run first time on a lent GPU machine that has only PyTorch and transformers: here every
registered algorithm is enumerated and compared (device = CPU), the training-step section runs all
four variants and counts host syncs, the JSON is complete, and none of OpenRLHF, vLLM, Ray or
DeepSpeed was imported.
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_device_check_runs_on_cpu_and_covers_every_registered_algorithm(tmp_path):
    out = tmp_path / "dc.json"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=REPO)
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu", "device_check.sh"), "--cpu", "--json",
                           str(out), "--budget", "150"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["complete"] and report["all_comparisons_ok"] and report["heavy_modules_imported"] == []

    from rlhf_ext.algorithms import LOSS_AGG_MODES, available_advantages, available_kl_estimators, \
        available_policy_losses

    results = report["sections"]["algorithms"]["results"]
    seen = {(r["kind"], r["name"], r["dtype"]) for r in results}
    for dtype in ("float32", "bfloat16"):
        for kind, names in (("advantage", available_advantages()), ("policy_loss", available_policy_losses()),
                            ("aggregation", LOSS_AGG_MODES), ("kl", available_kl_estimators())):
            for name in names:
                assert (kind, name, dtype) in seen, (kind, name, dtype)
    assert all(r["ok"] and r["max_err"] == 0.0 for r in results)  # device = CPU: identical results

    steps = {r["variant"]: r for r in report["sections"]["step"]["results"]}
    assert set(steps) == {"plain", "guard", "metrics", "both"}
    # the guard and the metrics read values on the host: each adds syncs; both add at least each alone
    assert steps["guard"]["host_syncs_added"] > 0 and steps["metrics"]["host_syncs_added"] > 0
    assert steps["both"]["host_syncs_added"] >= max(steps["guard"]["host_syncs_added"],
                                                    steps["metrics"]["host_syncs_added"])
    assert "training step" in proc.stdout and "passed" in proc.stdout


def test_device_check_refuses_cleanly_without_cuda():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "device_check.py")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
