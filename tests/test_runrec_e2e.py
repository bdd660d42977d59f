"""Run records and the non-finite guard in real ``train_ppo_ray --plugin rlhf_ext`` runs on CPU.

The healthy run is the shared 2-step GRPO run (tests/conftest.py); the poisoned run is a second
run of the same recipe that puts a NaN into one gradient at step 1 (test-only hook
``RLHF_EXT_TEST_POISON``) with a checkpoint after every step. Step 1 keeps the poisoned run short
(it ends before the first weight sync to vLLM); the weights at the stop must then be the starting
model's, bit for bit, in the dtype DeepSpeed trains in.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from rlhf_ext import runs
from rlhf_ext.runs.flops import ModelShape
from rlhf_ext.cli import main as cli_main
from rlhf_ext.patches.openrlhf.guard import GUARD_EXIT_CODE, tensor_digest
from rlhf_ext.tours.smoke import parse_train_log, run_record_dir, run_training, train_command

E2E_STEPS = 2  # the shared run (tests/conftest.py)


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_healthy_run_records_config_every_logged_metric_and_events(e2e_grpo_run, capsys):
    work, rc, text = e2e_grpo_run
    assert rc == 0, text[-4000:]
    run = run_record_dir(work / "trained")
    assert f"rlhf_ext: run record in {run}" in text

    config = json.loads((run / runs.CONFIG).read_text())
    assert config["schema"] == runs.SCHEMA and config["name"] == "trained_ds"
    args = config["args"]
    assert args["algo.advantage.estimator"] == "grpo" and args["rollout.n_samples_per_prompt"] == 4
    assert args["ckpt.path"] == str(work / "trained") + "_ds" and args["rlhf_ext.run_dir"] == str(run)
    assert config["plugin"]["guard"] == "stop" and config["plugin"]["version"]
    assert config["versions"]["openrlhf"] == "0.11.2" and config["versions"]["torch"].startswith("2.")
    assert all(config["versions"][k] for k in ("rlhf_ext", "vllm", "deepspeed", "ray"))
    train_file = work / "task" / "train.jsonl"
    assert config["data_sha256"] == {str(train_file): _sha256(train_file)}
    assert set(config["git"]) == {"commit", "dirty", "cwd"}
    assert isinstance(config["started_at"], float)

    records = runs.read_metrics(run / runs.METRICS)
    assert [r["step"] for r in records] == list(range(1, E2E_STEPS + 1))
    assert len(runs.read_jsonl(run / runs.METRICS)) == E2E_STEPS  # one line per step, no duplicates
    # every number OpenRLHF logged for a step is in that step's line, under its logger name
    for logged, rec in zip(parse_train_log(text).steps, records):
        assert logged["global_step"] == rec["step"]
        for key, value in logged.items():
            if key == "global_step":
                continue
            name = runs.metric_name(key)
            assert name in rec, (name, sorted(rec))
            if rec[name] is None:
                assert not math.isfinite(value)
            else:
                assert rec[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
        for key in ("train/policy_loss", "train/actor_grad_norm", "train/reward", "train/kl", "rollout/reward_mean",
                    "timing/step_total", "timing/generation", "train/reward/accuracy"):  # fmt: skip
            assert key in rec, key
        # a step whose groups all have equal rewards has zero advantages, and on step 1 the KL term's
        # gradient is zero too (policy == reference): a true norm of 0 there, not a stale one
        assert "nonfinite" not in rec
        if rec["train/zero_variance_group_frac"] < 1:
            assert rec["train/actor_grad_norm"] > 0
        else:
            assert rec["train/actor_grad_norm"] >= 0
        # counted where the groups are made (before any dynamic filtering) and where the advantages
        # are: no filtering in this run, so the same 4 groups and the same share
        assert rec["rlhf_ext/groups_generated"] == 4
        assert rec["rlhf_ext/zero_variance_group_frac_before_filter"] == pytest.approx(
            rec["train/zero_variance_group_frac"])
        # the advantage std is 0 exactly when no group carries signal
        assert (rec["train/advantage_std"] > 0) == (rec["train/zero_variance_group_frac"] < 1)
        assert rec["rlhf_ext/ds_skipped_steps"] == 0 and rec["rlhf_ext/guard/incidents"] == 0
        assert rec["rlhf_ext/guard/max_abs_log_ratio"] >= 0
        assert rec["elapsed_s"] > 0 and rec["time"] > config["started_at"]
    assert records[1]["elapsed_s"] > records[0]["elapsed_s"]

    # the compute block: this run trains on the CPU, which has no peak figure: no MFU, and the reason
    compute = config["compute"]
    assert compute["device"] == "cpu" and compute["device_count"] == 1 and compute["peak_flops_per_device"] is None
    assert "no peak-FLOPs figure for device 'cpu'" in compute["mfu_unavailable"]
    model_config = json.loads((work / "task" / "model" / "config.json").read_text())
    assert compute["model_shape"]["layers"] == model_config["num_hidden_layers"]
    for rec in records:  # the update's FLOPs by hand from the same step's logged values; no MFU without a peak
        shape = ModelShape(**{k: v for k, v in compute["model_shape"].items() if k in ModelShape.__dataclass_fields__})
        t = rec["train/total_length"]
        assert rec["rlhf_ext/throughput/update_flops"] == pytest.approx(
            rec["rollout/num_samples"] * t * shape.train_flops_per_token(t))
        assert "rlhf_ext/throughput/mfu" not in rec

    # rollout samples: the default 8 per step = the two 4-answer groups with the lowest prompt ids
    samples = runs.read_rollout_samples(run / runs.ROLLOUT_SAMPLES)
    assert [s["step"] for s in samples] == [1] * 8 + [2] * 8
    for step in (1, 2):
        groups = {}
        for s in samples:
            if s["step"] == step:
                groups.setdefault(s["prompt_id"], []).append(s)
        assert list(groups) == sorted(groups) and [len(g) for g in groups.values()] == [4, 4]
        for group in groups.values():
            assert all(runs.prompt_id(s["prompt"]) == s["prompt_id"] and s["response"] for s in group)
            assert all(isinstance(s["truncated"], bool) and 0 < s["response_tokens"] <= 16 for s in group)
            # the reward function's extra_logs, not the step-level values other patches copy into every row
            assert all("reward/accuracy" in s["components"] and "advantage_std" not in s["components"]
                       and not any(k.startswith("rollout_mismatch/") for k in s["components"]) for s in group)
            # GRPO's advantages: each answer's reward against its group's mean, so they sum to 0 and keep the order
            assert abs(sum(s["advantage"] for s in group)) < 1e-3
            for a in group:
                for b in group:
                    if a["reward"] > b["reward"] + 1e-6:
                        assert a["advantage"] > b["advantage"]

    events = runs.read_jsonl(run / runs.EVENTS)
    assert [e["event"] for e in events] == ["start", "end"]
    assert events[-1]["status"] == "finished" and events[-1]["exit_code"] == 0 and events[-1]["step"] == E2E_STEPS
    assert not (run / runs.INCIDENT).exists()
    assert cli_main(["runs", "show", str(run)]) == 0
    assert f"status: finished (exit code 0); last step {E2E_STEPS}" in capsys.readouterr().out


@pytest.fixture(scope="module")
def poisoned(e2e_grpo_run, tmp_path_factory):
    work, _, _ = e2e_grpo_run
    out = tmp_path_factory.mktemp("poisoned") / "trained"
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl", output=out,
                        estimator="grpo", steps=2, prompts_per_step=4, n_samples=4, lr=5e-4)  # fmt: skip
    cmd += ["--ckpt.save_steps", "1"]
    import os

    os.environ["RLHF_EXT_TEST_POISON"] = "step=1,tensor=grad,rank=0"
    try:
        rc = run_training(cmd, out.parent / "train.log", timeout=900, echo=False)
    finally:
        os.environ.pop("RLHF_EXT_TEST_POISON", None)
    return out, rc, (out.parent / "train.log").read_text()


def test_guard_stops_before_the_optimizer_step_with_its_exit_code(poisoned, e2e_grpo_run):
    out, rc, text = poisoned
    assert rc == GUARD_EXIT_CODE, text[-4000:]
    ckpt = out.parent / (out.name + "_ds")
    run = run_record_dir(out)
    incident = json.loads((run / runs.INCIDENT).read_text())
    assert incident["tensor"] == "grad" and incident["step"] == 1 and incident["rank"] == 0
    assert incident["micro_batch"] == 3  # 16 samples / micro-batches of 4: the accumulation boundary
    assert incident["sample_indices"] and len(incident["prompts"]) == len(incident["sample_indices"])
    assert incident["last_good_checkpoint"] is None

    # no checkpoint after the incident (--ckpt.save_steps 1), and no final save
    assert not list(ckpt.glob("global_step*")) and not list((ckpt / "_actor").glob("global_step*"))
    assert not (out / "model.safetensors").exists()

    # the weights at the stop are bit for bit the starting model's (no optimizer step was taken)
    import torch
    from safetensors.torch import load_file

    start = load_file(str(e2e_grpo_run[0] / "task" / "model" / "model.safetensors"))
    at_stop = incident["weights_sha256"]
    common = sorted(set(start) & set(at_stop))
    assert len(common) >= len(at_stop) - 1, (sorted(start), sorted(at_stop))  # a tied lm_head may be saved once
    # --ds.param_dtype bf16, which the CPU target trains in float32 where the CPU has no native bf16
    config = json.loads((run / runs.CONFIG).read_text())
    assert config["args"]["ds.param_dtype"] == "bf16" and config["train_dtype"] in ("bf16", "fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[config["train_dtype"]]
    mismatched = [n for n in common if tensor_digest(start[n].to(dtype)) != at_stop[n]]
    assert not mismatched, mismatched

    assert runs.read_metrics(run / runs.METRICS) == []
    events = runs.read_jsonl(run / runs.EVENTS)
    assert [e["event"] for e in events] == ["start", "guard_incident", "end"]
    assert events[1]["tensor"] == "grad" and events[1]["mode"] == "stop" and events[1]["step"] == 1
    assert events[2]["status"] == "stopped_by_guard" and events[2]["exit_code"] == GUARD_EXIT_CODE
    assert "the non-finite guard stopped the run" in text
