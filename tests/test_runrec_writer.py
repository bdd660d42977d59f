"""The PPOTrainer-side run-record glue: start/resume, one line per step, eval lines, shipped actor data, API."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlhf_ext import runs
from rlhf_ext.patches.openrlhf import run_record as rr


@pytest.fixture()
def fresh_state():
    rr._writer = None
    rr._current_step = None
    rr._take_pending(), rr._take_events(), rr._deferred.clear()
    yield
    rr._writer = None
    rr._current_step = None
    rr._take_pending(), rr._take_events(), rr._deferred.clear()


def _trainer(run_dir, *, eval_steps=float("inf"), save_steps=float("inf"), eval_data=None):
    args = SimpleNamespace(
        rlhf_ext=SimpleNamespace(run_dir=str(run_dir)),
        eval=SimpleNamespace(steps=eval_steps),
        ckpt=SimpleNamespace(path="/ck", save_steps=save_steps, save_hf=True, disable_ds=False),
    )
    return SimpleNamespace(args=args, eval_dataloader=eval_data, best_eval_metric_value=float("-inf"))


def _wrappers():
    calls = []
    init = rr.make_init_checkpoint_states(lambda self: self.states)
    train_step = rr.make_train_step(lambda self, samples, step: ({}, step + 1))
    ppo_train = rr.make_ppo_train(lambda self, step: dict(self.status))
    save = rr.make_save_logs_and_checkpoints(lambda self, step, logs, cs: calls.append(("save", step)))

    def best(self, metrics, step, cs):
        calls.append(("best", step))
        self.best_eval_metric_value = metrics["acc"]

    best = rr.make_save_best_checkpoint(best)
    return init, train_step, ppo_train, save, best, calls


def test_steps_eval_lines_shipped_metrics_and_checkpoints(tmp_path, fresh_state):
    init, train_step, ppo_train, save, best, calls = _wrappers()
    t = _trainer(tmp_path, eval_steps=2, save_steps=2, eval_data=[1])
    t.states = {"global_step": 0}
    init(t)
    for step in (1, 2):
        train_step(t, None, step - 1)
        assert rr.current_step() == step
        t.status = {"policy_loss": 0.1 * step, rr.SHIP_KEY: {
            "metrics": {"rollout_mismatch/probs_diff_mean": 0.001 * step},
            "events": [{"event": "mismatch_warning", "step": None, "value": 0.02}]}}  # fmt: skip
        status = ppo_train(t, step - 1)
        assert rr.SHIP_KEY not in status
        rr.add_metrics({"rlhf_ext/extra": step})
        save(t, step, {**status, "timing/step_total": 1.0, "generated_samples": ["x", 1.0]}, {})
        if step == 2:  # this step evaluates: its line waits for the eval metrics
            assert [r["step"] for r in runs.read_jsonl(tmp_path / runs.METRICS)] == [1]
            best(t, {"acc": 0.5}, step, {})
    lines = runs.read_jsonl(tmp_path / runs.METRICS)
    assert [r["step"] for r in lines] == [1, 2]
    assert lines[0]["train/policy_loss"] == pytest.approx(0.1) and lines[0]["rlhf_ext/extra"] == 1
    assert lines[0]["rollout_mismatch/probs_diff_mean"] == pytest.approx(0.001) and "eval/acc" not in lines[0]
    assert lines[1]["eval/acc"] == 0.5 and lines[1]["timing/step_total"] == 1.0
    events = runs.read_jsonl(tmp_path / runs.EVENTS)
    assert [(e["event"], e["step"]) for e in events] == [
        ("start", 0), ("mismatch_warning", 1), ("mismatch_warning", 2), ("checkpoint", 2), ("checkpoint", 2)]
    assert events[3]["path"] == "/ck/_actor/global_step2" and events[3]["hf_path"] == "/ck/global_step2_hf"
    assert events[4]["best"] is True and events[4]["path"] == "/ck/_actor/best_global_step2"
    assert calls == [("save", 1), ("save", 2), ("best", 2)]


def test_resume_drops_later_steps_and_a_fresh_start_moves_the_old_record_aside(tmp_path, fresh_state):
    init, train_step, ppo_train, save, best, calls = _wrappers()
    t = _trainer(tmp_path)
    t.states = {"global_step": 0}
    init(t)
    for step in (1, 2, 3):
        save(t, step, {"reward": float(step)}, {})
    with open(tmp_path / runs.METRICS, "ab") as f:
        f.write(b'{"step": 4, "rew')  # killed mid-line
    # resume from the step-2 checkpoint: step 3 is trained again, the torn line is gone
    t.states = {"global_step": 2}
    init(t)
    save(t, 3, {"reward": 30.0}, {})
    lines = runs.read_jsonl(tmp_path / runs.METRICS)
    assert [(r["step"], r["train/reward"]) for r in lines] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    resume = runs.read_jsonl(tmp_path / runs.EVENTS)[-1]
    assert resume["event"] == "resume" and resume["step"] == 2 and resume["dropped_steps"] == 1
    # a fresh run in the same directory starts a new record and keeps the old one beside it
    t.states = {"global_step": 0}
    init(t)
    assert not (tmp_path / runs.METRICS).exists()
    assert len(list(tmp_path.glob("metrics.jsonl.previous-*"))) == 1
    assert [e["event"] for e in runs.read_jsonl(tmp_path / runs.EVENTS)] == ["start"]


def test_actor_side_api_ships_with_fit_result(fresh_state):
    ship = rr.make_actor_ppo_train(lambda self, kl: {"policy_loss": 0.5})
    import torch

    rr.add_metrics({"rollout_mismatch/pearson": torch.tensor(0.99)})
    rr.add_event("mismatch_warning", metric="rollout_mismatch/probs_diff_mean", value=0.02)
    status = ship(None, 0.0)
    shipped = status[rr.SHIP_KEY]
    assert shipped["metrics"] == {"rollout_mismatch/pearson": pytest.approx(0.99)}
    assert shipped["events"] == [{"event": "mismatch_warning", "step": None,
                                  "metric": "rollout_mismatch/probs_diff_mean", "value": 0.02}]  # fmt: skip
    assert rr.SHIP_KEY not in ship(None, 0.0)  # nothing new: nothing shipped
    json.dumps(shipped)


def test_driver_config(tmp_path, monkeypatch):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1"}\n')
    ns = SimpleNamespace(**{"ckpt.path": str(tmp_path / "ck"), "data.prompt_dataset": f"{data},hub/dataset",
                            "rlhf_ext.run_dir": None, "rlhf_ext.guard": "stop", "algo.kl.clip": [-5.0, 5.0],
                            "ckpt.load_enable": False})  # fmt: skip
    path = rr.resolve_run_dir(ns)
    assert path == str(tmp_path / "ck" / "rlhf_ext_run")
    config = rr.build_config(ns, path, started_at=123.0)
    assert config["name"] == "ck" and config["schema"] == runs.SCHEMA and config["started_at"] == 123.0
    assert config["args"]["algo.kl.clip"] == [-5.0, 5.0] and config["plugin"]["guard"] == "stop"
    import hashlib

    assert config["data_sha256"] == {str(data): hashlib.sha256(data.read_bytes()).hexdigest()}
    assert config["versions"]["openrlhf"] == "0.11.2"
    json.dumps(config, allow_nan=False)
    setattr(ns, "rlhf_ext.run_dir", path)  # what the argparse hook leaves in args: still named after ckpt
    assert rr.build_config(ns, rr.resolve_run_dir(ns), started_at=0.0)["name"] == "ck"
    setattr(ns, "rlhf_ext.run_dir", str(tmp_path / "runs" / "exp7"))
    assert rr.build_config(ns, rr.resolve_run_dir(ns), started_at=0.0)["name"] == "exp7"
