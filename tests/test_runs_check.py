"""rlhf-ext runs check: the smoke verdict on run records written by the run-record writer itself."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rlhf_ext import runs
from rlhf_ext.cli import main
from rlhf_ext.patches.openrlhf import run_record as rr
from rlhf_ext.runs.check import CheckOptions, check_run


def healthy_step(step: int) -> dict:
    """The status dict OpenRLHF hands its loggers (keys as OpenRLHF names them), a healthy run."""
    return {
        "policy_loss": -0.01, "ppo_kl": 1e-3 * (-1) ** step, "reward": 0.2 + 0.05 * step, "score": 0.1 + 0.05 * step,
        "zero_variance_group_frac": 0.25, "group_reward_std": 0.3, "actor_grad_norm": 0.5,
        "rollout_mismatch/probs_diff_mean": 2e-4, "rlhf_ext/ds_skipped_steps": 0,
        "rlhf_ext/guard/max_abs_log_ratio": 0.01, "timing/step_total": 1.0,
    }  # fmt: skip


def write_record(path, steps, *, end="finished", exit_code=0, threshold=0.005, events=()):
    """A run directory as a real run leaves it: config.json by the driver's build_config, the PPOTrainer
    side's RunWriter for metrics.jsonl and events.jsonl, the driver's end event."""
    ns = SimpleNamespace()
    for key, value in {"ckpt.path": str(path.parent), "rlhf_ext.run_dir": str(path),
                       "rlhf_ext.mismatch_threshold": threshold, "algo.advantage.estimator": "grpo"}.items():
        setattr(ns, key, value)
    path.mkdir(parents=True, exist_ok=True)
    runs.write_json_atomic(path / runs.CONFIG, rr.build_config(ns, str(path), started_at=0.0))
    writer = rr.RunWriter(path)
    writer.begin(0)
    for i, values in enumerate(steps, start=1):
        writer.write_step(i, values)
    for name, step, fields in events:
        writer.event(name, step, **fields)
    if end is not None:
        runs.append_jsonl(path / runs.EVENTS, runs.event_record("end", len(steps), status=end, exit_code=exit_code))
    return path


def statuses(verdict) -> dict:
    return {c.name: c.status for c in verdict.checks}


def test_a_healthy_run_passes_every_check(tmp_path):
    run = write_record(tmp_path / "ok", [healthy_step(i) for i in range(1, 11)])
    verdict = check_run(run)
    assert statuses(verdict) == dict.fromkeys(["ended", "finite", "ratio", "advantage", "reward", "mismatch"], "PASS")
    assert verdict.passed
    detail = {c.name: c.detail for c in verdict.checks}
    # reward 0.25..0.70: first 5 steps mean 0.35, last 5 steps 0.60, each window's SD 0.0791 -> 2 SE = 0.1
    assert "first 5 steps 0.35 -> last 5 steps 0.6 (+0.2500, 2 SE = 0.1): rising" in detail["reward"]
    assert "at most 0.001 " in detail["ratio"]
    assert "threshold 0.005, the run's --rlhf_ext.mismatch_threshold" in detail["mismatch"]


def test_each_failure_is_named_on_its_own_line(tmp_path):
    steps = [healthy_step(i) for i in range(1, 9)]
    for i, s in enumerate(steps, start=1):
        s["reward"] = 1.0 - 0.1 * i                                    # falling
        s["zero_variance_group_frac"] = 0.95                            # collapsed advantages
        s["rollout_mismatch/probs_diff_mean"] = 0.002 if i != 6 else 0.03
    steps[3]["ppo_kl"] = -0.05                                          # ratio far from 1 at step 4
    steps[4]["policy_loss"] = float("nan")                              # recorded as null, listed non-finite
    run = write_record(tmp_path / "bad", steps, end="crashed", exit_code=1,
                       events=[("mismatch_warning", 6, {"metric": "rollout_mismatch/probs_diff_mean", "value": 0.03})])
    verdict = check_run(run)
    assert statuses(verdict) == dict.fromkeys(["ended", "finite", "ratio", "advantage", "reward", "mismatch"], "FAIL")
    detail = {c.name: c.detail for c in verdict.checks}
    assert detail["ended"].startswith("crashed (exit code 1)")
    assert "train/policy_loss at step 5" in detail["finite"]
    assert "at most 0.05 (step 4" in detail["ratio"]
    assert "zero-variance groups 95%" in detail["advantage"]
    assert detail["reward"].endswith("falling")
    assert "at most 0.03 (step 6" in detail["mismatch"] and "mismatch_warning at step 6" in detail["mismatch"]
    lines = verdict.lines()
    assert len(lines) == 7 and lines[-1].startswith("verdict: FAIL (0 passed, 6 failed, 0 skipped)")


def test_no_end_event_guard_stop_skipped_steps_and_missing_metrics(tmp_path):
    minimal = [{"reward": 0.5, "ppo_kl": 0.0} for _ in range(4)]
    running = check_run(write_record(tmp_path / "running", minimal, end=None))
    assert statuses(running)["ended"] == "FAIL" and "still running or killed hard" in running.checks[0].detail
    # metrics the run did not log are skipped with what to switch on, and do not fail the verdict
    assert statuses(running)["advantage"] == "SKIP" and statuses(running)["mismatch"] == "SKIP"
    assert "--rlhf_ext.mismatch_metrics" in {c.name: c.detail for c in running.checks}["mismatch"]
    guard = check_run(write_record(tmp_path / "guard", minimal, end="stopped_by_guard", exit_code=3,
                                   events=[("guard_incident", 3, {"tensor": "grad", "rank": 0, "mode": "stop"})]))
    assert statuses(guard)["ended"] == "FAIL" and "stopped by guard (exit code 3)" in guard.checks[0].detail
    assert "guard_incident (grad) at step 3" in {c.name: c.detail for c in guard.checks}["finite"]
    skipped = [dict(s, **{"rlhf_ext/ds_skipped_steps": i // 3}) for i, s in enumerate(minimal)]
    ds = check_run(write_record(tmp_path / "ds", skipped))
    assert statuses(ds)["finite"] == "FAIL" and "DeepSpeed skipped 1 optimizer step" in ds.checks[1].detail
    assert ds.passed is False and check_run(write_record(tmp_path / "fine", minimal)).passed


def test_options_flat_reward_window_and_threshold(tmp_path):
    flat = [dict(healthy_step(i), reward=0.5 + 0.01 * (-1) ** i) for i in range(1, 9)]
    run = write_record(tmp_path / "flat", flat, threshold=1e-4)
    verdict = check_run(run)
    assert statuses(verdict)["reward"] == "PASS" and "flat within the step-to-step noise" in verdict.checks[4].detail
    # the run's own --rlhf_ext.mismatch_threshold (1e-4) is the limit unless one is given
    assert statuses(verdict)["mismatch"] == "FAIL"
    assert statuses(check_run(run, CheckOptions(mismatch_threshold=1e-3)))["mismatch"] == "PASS"
    assert statuses(check_run(run, CheckOptions(require_rise=True)))["reward"] == "FAIL"
    # a 3-step run: k halved to 1, one step per window, no spread to judge a trend by
    short = check_run(write_record(tmp_path / "short", [healthy_step(i) for i in range(1, 4)]))
    assert statuses(short)["reward"] == "N/A" and "first step 0.25 -> last step 0.35" in short.checks[4].detail


def test_a_two_step_smoke_run_with_a_drop_passes_not_judged(tmp_path, capsys):
    """Issue 38: '-0.0875, 2 SE = 0: falling' failed every 2-step smoke run whose reward happened to drop."""
    steps = [dict(healthy_step(1), reward=0.3), dict(healthy_step(2), reward=0.2125)]
    run = write_record(tmp_path / "two", steps)
    verdict = check_run(run)
    assert statuses(verdict) == {"ended": "PASS", "finite": "PASS", "ratio": "PASS", "advantage": "PASS",
                                 "reward": "N/A", "mismatch": "PASS"}
    assert verdict.passed
    detail = verdict.checks[4].detail
    assert detail.startswith("train/reward first step 0.3 -> last step 0.2125 (-0.0875): not enough steps to judge")
    assert "(2 steps; a trend needs 2 steps in each of the first and last windows, 4 steps in all" in detail
    # even when a rise is required: too short to say either way
    assert check_run(run, CheckOptions(require_rise=True)).passed
    assert main(["runs", "check", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[4].startswith("N/A   reward     train/reward first step 0.3")
    assert out[-1].startswith("verdict: PASS (5 passed, 0 failed, 0 skipped, 1 not judged)")
    assert main(["runs", "check", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "PASS" and data["checks"][4]["status"] == "N/A"
    one = check_run(write_record(tmp_path / "one", steps[:1]))
    assert statuses(one)["reward"] == "N/A" and "(1 step;" in one.checks[4].detail and one.passed


def test_a_long_run_with_a_real_drop_still_fails(tmp_path):
    # first 5 steps 0.60 +- (0, .02, -.02, .01, -.01): mean 0.6, SD sqrt(10e-4 / 4) = 0.01581; last 5 the same
    # shape around 0.30: 2 SE = 2 sqrt(2 * 2.5e-4 / 5) = 0.02, and the difference -0.3 is far below -0.02
    wiggle = [0.0, 0.02, -0.02, 0.01, -0.01]
    rewards = [0.6 + w for w in wiggle] + [0.6 - 0.03 * i for i in range(1, 11)] + [0.3 + w for w in wiggle]
    run = write_record(tmp_path / "drop", [dict(healthy_step(i), reward=r) for i, r in enumerate(rewards, 1)])
    verdict = check_run(run)
    assert len(rewards) == 20 and statuses(verdict)["reward"] == "FAIL" and not verdict.passed
    assert "first 5 steps 0.6 -> last 5 steps 0.3 (-0.3000, 2 SE = 0.02): falling" in verdict.checks[4].detail
    # 4 steps are enough to judge: 0.5, 0.6 | 0.2, 0.3 -> -0.3 against 2 SE = 2 sqrt(2 * 0.005 / 2) = 0.1414
    four = check_run(write_record(tmp_path / "four", [dict(healthy_step(i), reward=r)
                                                      for i, r in enumerate([0.5, 0.6, 0.2, 0.3], 1)]))
    assert statuses(four)["reward"] == "FAIL" and "(-0.3000, 2 SE = 0.1414): falling" in four.checks[4].detail


def test_a_two_step_run_whose_last_step_had_only_uniform_groups_is_not_judged_a_collapse(tmp_path):
    """The async + agent matrix run: its 2nd step's 4 groups were all wrong (share 1.0, std 0). One step cannot
    tell chance from a collapse; 4 steps with the last two collapsed still FAIL."""
    steps = [healthy_step(1), dict(healthy_step(2), zero_variance_group_frac=1.0, group_reward_std=0.0)]
    verdict = check_run(write_record(tmp_path / "two", steps))
    assert statuses(verdict)["advantage"] == "N/A" and verdict.passed
    assert verdict.checks[3].detail == ("zero-variance groups 100% over the last 1 steps (limit 90%); within-group "
                                        "reward std 0 over the last 1 steps: not enough steps to judge (2 steps; "
                                        "a collapse needs 2 steps in the last window)")
    four = [healthy_step(1), healthy_step(2)] + [dict(healthy_step(i), zero_variance_group_frac=1.0,
                                                      group_reward_std=0.0) for i in (3, 4)]
    assert statuses(check_run(write_record(tmp_path / "four", four)))["advantage"] == "FAIL"
    # a healthy 2-step run still passes the check outright
    assert statuses(check_run(write_record(tmp_path / "ok", steps[:1] * 2)))["advantage"] == "PASS"


def test_steps_with_an_async_policy_lag_are_left_out_of_the_mismatch_check(tmp_path):
    """Async runs: a stale batch's vLLM log-probs are an older policy's, so its probs_diff includes the policy
    change (0.0218 at lag 1 in the matrix run); only lag-0 steps judge the numerics."""
    steps = [dict(healthy_step(1), **{"rlhf_ext/policy_lag": 0.0}),
             dict(healthy_step(2), **{"rollout_mismatch/probs_diff_mean": 0.0218, "rlhf_ext/policy_lag": 1.0})]
    warn = [("mismatch_warning", 2, {"metric": "rollout_mismatch/probs_diff_mean", "value": 0.0218})]
    verdict = check_run(write_record(tmp_path / "async", steps, events=warn))
    assert statuses(verdict)["mismatch"] == "PASS", verdict.lines()
    assert verdict.checks[5].detail.endswith("at most 0.0002 (step 1; threshold 0.005, the run's "
                                             "--rlhf_ext.mismatch_threshold); 1 step(s) with a policy lag left "
                                             "out (async: their mismatch includes the policy's change)")
    # the same mismatch at lag 0 is a numerical mismatch: FAIL
    synced = [dict(s, **{"rlhf_ext/policy_lag": 0.0}) for s in steps]
    assert statuses(check_run(write_record(tmp_path / "sync", synced, events=warn)))["mismatch"] == "FAIL"
    # every mismatch step lagged: nothing to judge the numerics on
    lagged = [dict(s, **{"rlhf_ext/policy_lag": 1.0}) for s in steps]
    only = check_run(write_record(tmp_path / "lagged", lagged))
    assert statuses(only)["mismatch"] == "N/A" and only.passed


def test_windows_without_spread(tmp_path):
    # 0.5 x 4 then 0.25 x 4: the means differ but neither window varies, so the noise is unknown
    step_change = [dict(healthy_step(i), reward=0.5 if i <= 4 else 0.25) for i in range(1, 9)]
    verdict = check_run(write_record(tmp_path / "step", step_change))
    assert statuses(verdict)["reward"] == "N/A" and verdict.passed
    assert verdict.checks[4].detail.endswith("(-0.2500, 2 SE = 0): not enough steps to judge (no spread within "
                                             "either window, so the step-to-step noise is unknown)")
    # the same reward at every step is flat, and certainly no rise
    constant = write_record(tmp_path / "constant", [dict(healthy_step(i), reward=0.5) for i in range(1, 9)])
    assert "flat within the step-to-step noise" in check_run(constant).checks[4].detail
    assert statuses(check_run(constant, CheckOptions(require_rise=True)))["reward"] == "FAIL"


def test_command_exit_codes_json_and_errors(tmp_path, capsys):
    ok = write_record(tmp_path / "ok", [healthy_step(i) for i in range(1, 7)])
    bad = write_record(tmp_path / "bad", [healthy_step(i) for i in range(1, 7)], end="crashed", exit_code=137)
    assert main(["runs", "check", str(ok)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 7 and all(line.startswith(("PASS", "SKIP", "FAIL")) for line in out[:6])
    assert out[-1].startswith("verdict: PASS")
    assert main(["runs", "check", str(bad), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "FAIL" and data["checks"][0]["detail"].startswith("crashed (exit code 137)")
    assert main(["runs", "check", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert main(["runs", "check", str(ok), "--window", "0"]) == 2
    assert "--window must be > 0" in capsys.readouterr().err


def test_a_queue_suite_stops_before_the_long_run_when_the_check_fails(tmp_path):
    """The check as a queue command: its exit code 1 fails the smoke run and the long run never starts."""
    bad = write_record(tmp_path / "smoke_record", [healthy_step(i) for i in range(1, 5)], end="crashed", exit_code=1)
    suite = tmp_path / "suite.toml"
    suite.write_text(f"""
[suite]
name = "smoke_then_long"

[[runs]]
name = "smoke"
commands = [["{{python}}", "-m", "rlhf_ext.cli", "runs", "check", "{bad}"]]
expect = ["{bad}/events.jsonl"]

[[runs]]
name = "long"
commands = [["{{python}}", "-c", "open('{tmp_path / 'long_ran'}', 'w').write('x')"]]
expect = ["{tmp_path / 'long_ran'}"]
""")
    out = tmp_path / "q"
    proc = subprocess.run([sys.executable, "-m", "rlhf_ext.cli", "queue", "run", str(suite), "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    by_name = {r["name"]: r for r in manifest["runs"]} if isinstance(manifest["runs"], list) else manifest["runs"]
    assert by_name["smoke"]["status"] == "failed" and by_name["smoke"]["exit_code"] == 1
    assert by_name["long"]["status"] == "pending" and not (tmp_path / "long_ran").exists()
    log = (out / "runs" / "smoke" / "logs").glob("1-*.log")
    assert "FAIL  ended      crashed (exit code 1)" in next(log).read_text()


@pytest.mark.parametrize("flag", ["--max-ppo-kl", "--max-zero-variance"])
def test_bad_limits_are_refused(tmp_path, flag, capsys):
    ok = write_record(tmp_path / "ok", [healthy_step(i) for i in range(1, 5)])
    assert main(["runs", "check", str(ok), flag, "-1"]) == 2
    assert f"{flag} must be > 0" in capsys.readouterr().err


def test_the_smoke_tour_ends_with_the_verdict(tmp_path, capsys):
    from rlhf_ext.tours import smoke

    run = write_record(tmp_path / "trained_ds" / "rlhf_ext_run", [healthy_step(i) for i in range(1, 7)])
    smoke._print_check(run)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"runs check (rlhf-ext runs check {run}):"
    assert [line.split()[0] for line in out[1:7]] == ["PASS"] * 6 and out[-1].startswith("  verdict: PASS")
    smoke._print_check(tmp_path / "missing")
    assert "no run record at" in capsys.readouterr().out
