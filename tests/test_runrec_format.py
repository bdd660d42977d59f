"""The run-record format (rlhf_ext.runs): lines, torn-line safety, resume, reading, TensorBoard import, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from rlhf_ext import runs
from rlhf_ext.cli import main as cli_main


def test_metric_names_follow_openrlhf_loggers():
    assert runs.metric_name("policy_loss") == "train/policy_loss"
    assert runs.metric_name("reward/accuracy") == "train/reward/accuracy"  # reward extra_logs, as wandb names them
    for kept in ("rollout/reward_mean", "timing/generation", "eval/x", "rlhf_ext/ds_skipped_steps",
                 "rollout_mismatch/probs_diff_mean", "train/kl"):  # fmt: skip
        assert runs.metric_name(kept) == kept
    # TensorBoardLogger writes train/{key} for every key: the import undoes the doubled prefix
    assert runs.tensorboard_tag_name("train/timing/generation") == "timing/generation"
    assert runs.tensorboard_tag_name("train/policy_loss") == "train/policy_loss"
    assert runs.tensorboard_tag_name("train/reward/accuracy") == "train/reward/accuracy"
    assert runs.tensorboard_tag_name("eval/pass1") == "eval/pass1"


def test_metrics_record_numbers_only_nonfinite_as_null():
    rec = runs.metrics_record(
        3,
        {"policy_loss": torch.tensor(0.5), "actor_grad_norm": float("nan"), "kl": float("inf"),
         "generated_samples": ["text", 1.0], "response_length": 12, "flag": True, "vec": torch.ones(3),
         "timing/step_total": 2.5, "step": 99},
        now=110.0, started_at=100.0,
    )  # fmt: skip
    assert rec["step"] == 3 and rec["time"] == 110.0 and rec["elapsed_s"] == 10.0
    assert rec["train/policy_loss"] == 0.5 and rec["timing/step_total"] == 2.5
    assert rec["train/response_length"] == 12 and rec["train/flag"] == 1.0
    assert rec["train/actor_grad_norm"] is None and rec["train/kl"] is None
    assert rec["nonfinite"] == ["train/actor_grad_norm", "train/kl"]
    assert "train/generated_samples" not in rec and "train/vec" not in rec
    json.dumps(rec, allow_nan=False)  # strictly valid JSON


def test_torn_last_line_is_ignored_by_readers_and_dropped_by_writers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    runs.append_jsonl(path, {"step": 1, "a": 1.0})
    runs.append_jsonl(path, {"step": 2, "a": 2.0})
    with open(path, "ab") as f:
        f.write(b'{"step": 3, "a": 3')  # the writer was killed mid-line
    assert [r["step"] for r in runs.read_metrics(path)] == [1, 2]
    assert runs.repair_tail(path) is True
    assert path.read_bytes().endswith(b'"a":2.0}\n')
    assert runs.repair_tail(path) is False
    runs.append_jsonl(path, {"step": 3, "a": 3.0})
    assert [r["step"] for r in runs.read_metrics(path)] == [1, 2, 3]
    # a file that is one torn line only
    torn = tmp_path / "t.jsonl"
    torn.write_bytes(b'{"step": 1')
    assert runs.read_jsonl(torn) == [] and runs.repair_tail(torn) and torn.read_bytes() == b""


def test_read_metrics_keeps_the_last_occurrence_of_a_step(tmp_path):
    path = tmp_path / "m.jsonl"
    for step, v in ((1, 1.0), (2, 2.0), (3, 3.0), (2, 20.0), (3, 30.0), (4, 40.0)):
        runs.append_jsonl(path, {"step": step, "v": v})
    assert [(r["step"], r["v"]) for r in runs.read_metrics(path)] == [(1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)]
    assert runs.truncate_metrics_after(path, 2) == 3  # the two step-3 lines and step 4
    assert [r["step"] for r in runs.read_jsonl(path)] == [1, 2, 2]


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "e.jsonl"
    code = (
        "import sys; from rlhf_ext import runs\n"
        "for i in range(300): runs.append_jsonl(sys.argv[1], {'w': sys.argv[2], 'i': i, 'pad': 'x' * 2000})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(w)]) for w in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    records = runs.read_jsonl(path)
    assert len(records) == 900
    for w in "012":
        assert [r["i"] for r in records if r["w"] == w] == list(range(300))


def _write_run(tmp_path, events, steps=3):
    run = tmp_path / "run"
    run.mkdir()
    runs.write_json_atomic(run / runs.CONFIG, {"schema": runs.SCHEMA, "name": "r1", "started_at": 0.0,
                                               "args": {"algo.advantage.estimator": "grpo"}})  # fmt: skip
    for s in range(1, steps + 1):
        runs.append_jsonl(run / runs.METRICS, runs.metrics_record(
            s, {"reward": 0.1 * s, "actor_grad_norm": float("nan") if s == 2 else 1.0}, now=10.0 * s, started_at=0.0))
    for ev in events:
        runs.append_jsonl(run / runs.EVENTS, ev)
    return run


def test_status_and_summary(tmp_path):
    start = runs.event_record("start", 0)
    run = _write_run(tmp_path, [start, runs.event_record("checkpoint", 2, path="/c/global_step2"),
                                runs.event_record("end", 3, status="finished", exit_code=0)])  # fmt: skip
    text = runs.summarize(run)
    assert "status: finished (exit code 0); last step 3; 3 steps recorded" in text
    assert "estimator=grpo" in text
    assert "train/reward" in text and "step 1: 0.1  ->  step 3: 0.3" in text
    assert "non-finite values at steps: 2" in text
    assert "checkpoints: 1, last at step 2: /c/global_step2" in text
    assert runs.run_status([start]) == ("running", None)
    assert runs.run_status([start, runs.event_record("end", 3, status="finished", exit_code=0),
                            runs.event_record("resume", 3)]) == ("running", None)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        runs.summarize(tmp_path)


def test_runs_show_cli(tmp_path, capsys):
    run = _write_run(tmp_path, [runs.event_record("start", 0),
                                runs.event_record("guard_incident", 2, tensor="grad", rank=0, mode="stop"),
                                runs.event_record("end", 2, status="stopped_by_guard", exit_code=3)])  # fmt: skip
    runs.write_json_atomic(run / runs.INCIDENT, {"step": 2, "micro_batch": 0, "tensor": "grad",
                                                 "last_good_checkpoint": "/c/global_step1"})  # fmt: skip
    assert cli_main(["runs", "show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "status: stopped_by_guard (exit code 3)" in out
    assert "guard incident at step 2: tensor grad (rank 0, mode stop)" in out
    assert "last good checkpoint /c/global_step1" in out
    assert cli_main(["runs", "show", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_runs_show_and_report_name_a_nonfinite_input(tmp_path):
    """A NaN reward under the guard: the estimator's deferred check (``nonfinite_input``), then the stop on
    the advantages it made non-finite."""
    from rlhf_ext.report import collect, incident_rows

    run = _write_run(tmp_path, [runs.event_record("start", 0),
                                runs.event_record("nonfinite_input", 2, where="advantages", estimator="maxrl",
                                                  check="maxrl: scores", nan_count=1, inf_count=0,
                                                  first_index=[1, 1]),
                                runs.event_record("guard_incident", 2, tensor="advantages", rank=0, mode="stop",
                                                  incident="incident.json"),
                                runs.event_record("end", 2, status="stopped_by_guard", exit_code=3)])  # fmt: skip
    runs.write_json_atomic(run / runs.INCIDENT, {"step": 2, "micro_batch": 1, "tensor": "advantages", "rank": 0,
                                                 "nan_count": 3, "inf_count": 0, "first_index": [0, 0],
                                                 "last_good_checkpoint": None})  # fmt: skip
    text = runs.summarize(run)
    assert "non-finite input at step 2: maxrl: scores in advantages (1 NaN, 0 Inf), left to the guard" in text
    assert "incident.json: step 2, micro-batch 1, tensor advantages, rank 0" in text
    assert "    3 NaN and 0 Inf value(s), first at index (0, 0)" in text
    rows = incident_rows(collect([run], resamples=20).runs)
    assert ("non-finite input" in [r[2] for r in rows]) and ("guard incident" in [r[2] for r in rows])
    detail = next(r[3] for r in rows if r[2] == "non-finite input")
    assert detail == "maxrl: scores in advantages: 1 NaN, 0 Inf, first at (1, 1); left to the guard"


def test_tensorboard_export_matches_live_names(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    tb = tmp_path / "tb" / "my_run"
    w = SummaryWriter(log_dir=str(tb))
    # what OpenRLHF's TensorboardLogger writes: train/{key} for each status key, eval/{key}
    for step in (1, 2, 3):
        w.add_scalar("train/policy_loss", 0.5 / step, step)
        w.add_scalar("train/timing/generation", 2.0, step)
        w.add_scalar("train/rollout/reward_mean", 0.25 * step, step)
        w.add_scalar("train/actor_grad_norm", float("nan") if step == 2 else 1.5, step)
    w.add_scalar("eval/pass1", 0.3, 3)
    w.add_text("train/generated_samples", "hello", 1)
    w.close()
    out = tmp_path / "exported"
    assert cli_main(["runs", "export", "--tensorboard", str(tmp_path / "tb"), "--output", str(out)]) == 0
    assert "wrote 3 steps" in capsys.readouterr().out
    records = runs.read_metrics(out / runs.METRICS)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert math.isclose(records[1]["train/policy_loss"], 0.25, rel_tol=1e-6)
    assert records[0]["timing/generation"] == 2.0 and records[2]["rollout/reward_mean"] == 0.75
    assert records[1]["train/actor_grad_norm"] is None and records[1]["nonfinite"] == ["train/actor_grad_norm"]
    assert math.isclose(records[2]["eval/pass1"], 0.3, rel_tol=1e-6) and "eval/pass1" not in records[0]
    config = json.loads((out / runs.CONFIG).read_text())
    assert config["schema"] == runs.SCHEMA and config["name"] == "my_run"
    assert runs.run_status(runs.read_jsonl(out / runs.EVENTS))[0] == "finished"
    # exporting again into the same place is refused; two runs in one directory must be told apart
    assert cli_main(["runs", "export", "--tensorboard", str(tmp_path / "tb"), "--output", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    SummaryWriter(log_dir=str(tmp_path / "tb" / "other")).add_scalar("train/x", 1.0, 1)
    assert cli_main(["runs", "export", "--tensorboard", str(tmp_path / "tb"), "--output", str(tmp_path / "o2")]) == 2
    assert "holds the event files of 2 runs" in capsys.readouterr().err
