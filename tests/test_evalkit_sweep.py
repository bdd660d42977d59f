"""evalkit sweep: every checkpoint of a training run's record, one protocol, resumable (real vLLM on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rlhf_ext import runs
from rlhf_ext.evalkit.records import RunDirError
from rlhf_ext.evalkit.sweep import checkpoints
from rlhf_ext.patches.openrlhf import run_record as rr


def make_record(tmp_path, model):
    """A finished run's record, written by the plugin's own writer: checkpoints at steps 2 (with a
    Hugging Face export) and 4 (DeepSpeed only), the final save at step 4."""
    ckpt, final = tmp_path / "ckpt", tmp_path / "final"
    ns = SimpleNamespace()
    for key, value in {"actor.model_name_or_path": str(model), "ckpt.path": str(ckpt),
                       "ckpt.output_dir": str(final)}.items():
        setattr(ns, key, value)
    run_dir = ckpt / "rlhf_ext_run"
    run_dir.mkdir(parents=True)
    runs.write_json_atomic(run_dir / runs.CONFIG, rr.build_config(ns, str(run_dir), started_at=0.0))
    writer = rr.RunWriter(run_dir)
    writer.begin(0)
    for step in range(1, 5):
        writer.write_step(step, {"reward": 0.1 * step})
    shutil.copytree(model, ckpt / "global_step2_hf")
    shutil.copytree(model, final)
    writer.event("checkpoint", 2, path=str(ckpt / "_actor" / "global_step2"), hf_path=str(ckpt / "global_step2_hf"))
    writer.event("checkpoint", 4, path=str(ckpt / "_actor" / "global_step4"))
    writer.event("end", 4, status="finished", exit_code=0)
    return run_dir


def test_plan_from_the_record(tmp_path):
    model = tmp_path / "base"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run_dir = make_record(tmp_path, model)
    plan, notes = checkpoints(run_dir)
    assert plan == [(0, str(model)), (2, str(tmp_path / "ckpt" / "global_step2_hf")), (4, str(tmp_path / "final"))]
    assert len(notes) == 1 and notes[0].startswith("step 4: no Hugging Face export") and "--ckpt.save_hf" in notes[0]
    assert [s for s, _ in checkpoints(run_dir, include_start=False)[0]] == [2, 4]
    with pytest.raises(RunDirError, match="not a run record"):
        checkpoints(tmp_path)


def test_sweep_evaluates_each_checkpoint_once_and_the_report_places_them(tmp_path):
    from rlhf_ext.evalkit.tiny_model import build_tiny_model
    from rlhf_ext.report import collect

    model = build_tiny_model(tmp_path / "base", seed=0)
    run_dir = make_record(tmp_path, model)
    data = tmp_path / "held_out.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(2)) + "\n")
    out = tmp_path / "evals"
    # --no-start: two vLLM evaluations are enough to show one protocol per checkpoint (each is a vLLM start,
    # the slowest thing here); the start's place in the plan is test_plan_from_the_record's
    cmd = [sys.executable, "-m", "rlhf_ext.evalkit", "sweep", str(run_dir), "run", "--output", str(out), "--no-start", "--",
           "--data", str(data), "--name", "held_out", "--n-samples", "2", "--max-tokens", "4", "--template", "none",
           "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert not (out / "step_0").exists()
    for step in (2, 4):
        summary = json.loads((out / f"step_{step}" / "summary.json").read_text())
        assert summary["tasks"]["held_out"]["problems"] == 2
    # the same command again: every step complete, nothing started
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stderr.count("complete, skipped") == 2, again.stderr[-2000:]
    # other options into the same directory are refused
    other = subprocess.run(cmd[:-1] + ["--n-samples", "3"], capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "use another --output" in other.stderr
    # the report puts the three evaluations on the run's step axis
    data_ = collect([run_dir], [out])
    assert sorted(p.step for p in data_.points) == [2, 4]
