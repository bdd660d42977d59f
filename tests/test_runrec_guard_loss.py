"""The guard catches a non-finite loss from a policy loss registered by an installed third-party package.

The loss comes from a throwaway distribution installed with ``pip --target`` that registers it
through the ``rlhf_ext.algorithms`` entry-point group (as a user's package would; no monkey-patch).
It is PPO's per-token loss until its second call, then NaN on valid tokens of row 0. Each run is a
small process (or two, on gloo) that drives the real, patched OpenRLHF ``ActorPPOTrainer.training_step``
with a real ``DeepspeedStrategy`` (its patched ``backward`` / ``optimizer_step``; a tiny module stands
in for the DeepSpeed engine), wrapped in the run record's PPOTrainer-side patches, with a checkpoint
after every step, and with the run record's driver (``config.json``, the ``end`` event, the exit
code) on rank 0. Without the guard's deferral, the aggregation's input check would end this run with
``ValueError: per_token_loss contains ... NaN`` and exit code 1 (``--rlhf_ext.guard off`` still does).

No Ray, no model, no vLLM: one run takes seconds; the full CPU recipe's guard stop is the poisoned
run of tests/test_runrec_e2e.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlhf_ext import runs
from rlhf_ext.cli import main as cli_main
from rlhf_ext.patches.openrlhf.guard_stop import GUARD_EXIT_CODE, STOP_MARKER

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
LOSS = "test_nan_from_step2"

PLUGIN_SETUP = """
from setuptools import setup
setup(
    name="rlhf-ext-nan-loss-plugin",
    version="0.0.1",
    py_modules=["nan_loss_plugin"],
    entry_points={"rlhf_ext.algorithms": ["nan_loss = nan_loss_plugin"]},
)
"""

PLUGIN_MODULE = '''
import os

import torch

from rlhf_ext.algorithms import ppo, register_policy_loss

CALLS = {"n": 0}


def _rank():
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@register_policy_loss("test_nan_from_step2")
def nan_from_step2(log_probs, old_log_probs, advantages, mask, **kwargs):
    """PPO; from the NAN_LOSS_FROM_CALL-th call on, on the ranks in NAN_LOSS_RANKS: NaN on row 0's tokens 2.."""
    per_token, metrics = ppo(log_probs, old_log_probs, advantages, mask, **kwargs)
    CALLS["n"] += 1
    ranks = {int(r) for r in os.environ.get("NAN_LOSS_RANKS", "0").split(",")}
    if CALLS["n"] >= int(os.environ.get("NAN_LOSS_FROM_CALL", "2")) and _rank() in ranks:
        bad = torch.zeros_like(mask, dtype=torch.bool)
        bad[0, 2:] = mask[0, 2:].bool()
        per_token = torch.where(bad, torch.full_like(per_token, float("nan")), per_token)
    return per_token, metrics
'''

# argv: run_dir ckpt_dir mode steps; env RANK, WORLD_SIZE, PORT; rank 0 is also the driver
DRIVER = r'''
import json, os, sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

run_dir, ckpt, mode, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=rank,
                            world_size=world)

from rlhf_ext.patches import activate

activate(["rlhf_ext"], role="test")
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ray import ppo_actor
from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy

from rlhf_ext.patches.openrlhf import guard as g
from rlhf_ext.patches.openrlhf import run_record as rr
from rlhf_ext.patches.openrlhf.guard_stop import GuardStop
from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args

LOSS = "test_nan_from_step2"
if rank == 0:  # the driver: config.json now; the end event and the exit code at exit
    rr.start_driver_record(SimpleNamespace(**{
        "ckpt.path": ckpt, "rlhf_ext.run_dir": run_dir, "rlhf_ext.guard": mode, "ckpt.load_enable": False,
        "actor.policy_loss_type": LOSS, "actor.loss_agg_mode": "token-mean"}))


class Engine(torch.nn.Module):
    """Stands in for the DeepSpeed engine: log pi = old log-probs + theta; backward / step / boundary."""

    def __init__(self, old):
        super().__init__()
        self.old = old
        self.theta = torch.nn.Parameter(torch.zeros_like(old))
        self.opt = torch.optim.SGD([self.theta], lr=0.5)

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **kwargs):
        return self.old + self.theta, SimpleNamespace(aux_loss=None, entropy=None)

    def backward(self, loss):
        loss.backward()

    def is_gradient_accumulation_boundary(self):
        return True

    def step(self):
        self.opt.step()
        self.opt.zero_grad()


ns = SimpleNamespace
args = ns(
    actor=ns(entropy_coef=None, aux_loss_coef=0.0, loss_agg_mode="token-mean", policy_loss_type=LOSS,
             loss_agg_max_len=None),
    algo=ns(kl=ns(use_loss=False, init_coef=0.0, estimator="k3", unbiased_gradient=False, clip=None)),
    train=ns(dynamic_batch_enable=False),
    rlhf_ext=ns(guard=mode, run_dir=run_dir),
    ckpt=ns(path=ckpt, save_steps=1, save_hf=False, disable_ds=False),
    eval=ns(steps=float("inf")),
)
gen = torch.Generator().manual_seed(0)
B, T = 4, 20
mask = torch.arange(T)[None, :] < torch.tensor([20, 12, 16, 8])[:, None]
old = -torch.rand(B, T, generator=gen)
advantages = torch.randn(B, T, generator=gen)

trainer = ppo_actor.ActorPPOTrainer.__new__(ppo_actor.ActorPPOTrainer)
trainer.args = args
trainer.actor = Engine(old)
trainer.actor_optim = trainer.actor.opt
trainer.actor_loss_fn = ppo_actor.PolicyLoss(policy_loss_type=LOSS)
configure_from_args(trainer.actor_loss_fn, args)  # looks the loss up: the entry point loads the plugin
strategy = DeepspeedStrategy.__new__(DeepspeedStrategy)


def cpu_all_reduce(data, op="mean"):  # OpenRLHF's moves CPU data to the CUDA device first
    t = torch.tensor([float(data)])
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(t) / (world if op == "mean" else 1)


strategy.all_reduce = cpu_all_reduce
trainer.strategy = strategy
trainer.actor_scheduler = ns(get_last_lr=lambda: [0.5])
trainer.ema_model = None
trainer.aux_loss = False


def one_actor_step(self, kl_ctl):
    experience = Experience(sequences=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                            action_mask=mask, action_log_probs=old, base_action_log_probs=old,
                            advantages=advantages, info={})
    info = {"dp_size": world, "batch_num_tokens": mask.sum().float() * world,
            "global_batch_size": torch.tensor(float(B * world))}
    status = self.training_step(experience, kl_ctl, 0, info)
    return {"policy_loss": float(status["metrics"]["policy_loss"])}


# the actor's ppo_train as patched (step count of the guard, shipped run-record data)
actor_ppo_train = rr.make_actor_ppo_train(g.make_actor_ppo_train(one_actor_step))

# the PPOTrainer side (rank 0): record start, one metrics line per step, checkpoints, the guard event
def save(self, global_step, logs_dict=None, client_states=None):
    tag = f"global_step{global_step}"
    os.makedirs(os.path.join(ckpt, "_actor", tag), exist_ok=True)
    torch.save({"theta": trainer.actor.theta.detach().clone()}, os.path.join(ckpt, "_actor", tag, "weights.pt"))
    with open(os.path.join(ckpt, "_actor", "latest"), "w") as f:
        f.write(tag)


ppo_trainer = ns(args=args, eval_dataloader=None, best_eval_metric_value=float("-inf"))
ppo_train = rr.make_ppo_train(lambda self, global_steps: actor_ppo_train(trainer, 0.0))
train_step = rr.make_train_step(lambda self, samples, global_step: ppo_train(self, global_step + 1))
save_logs = rr.make_save_logs_and_checkpoints(save)
losses, stop = [], None
try:
    if rank == 0:
        rr.make_init_checkpoint_states(lambda self: {"global_step": 0})(ppo_trainer)
    for step in range(1, steps + 1):
        status = train_step(ppo_trainer, None, step - 1) if rank == 0 else actor_ppo_train(trainer, 0.0)
        losses.append(status["policy_loss"])
        if rank == 0:
            save_logs(ppo_trainer, step, dict(status))
except GuardStop as exc:
    stop = exc.with_traceback(None)  # the traceback's frames hold the loss's autograd graph
finally:
    del trainer.actor.theta.grad
    if world > 1:
        dist.barrier()  # gloo: no rank tears down while its peer still talks to it
        dist.destroy_process_group()
with open(os.path.join(os.path.dirname(run_dir), f"result-rank{rank}.json"), "w") as f:
    json.dump({"losses": losses, "stop": str(stop) if stop else None,
               "theta": trainer.actor.theta.detach().tolist()}, f)
if stop is not None and rank == 0:
    raise stop  # to the driver's hook: the end event and the guard's exit code
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A really installed distribution that registers ``test_nan_from_step2`` through the entry point."""
    base = tmp_path_factory.mktemp("nan_loss_plugin")
    src = base / "src"
    src.mkdir()
    (src / "setup.py").write_text(PLUGIN_SETUP)
    (src / "nan_loss_plugin.py").write_text(PLUGIN_MODULE)
    target = base / "site"
    subprocess.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target),
                    str(src)], check=True, capture_output=True, timeout=300)  # fmt: skip
    assert list(target.glob("rlhf_ext_nan_loss_plugin-*.dist-info/entry_points.txt"))
    (base / "driver.py").write_text(DRIVER)
    return target


def _env(plugin_path, **extra):
    extra_path = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    path = os.pathsep.join([str(ROOT), str(plugin_path)] + extra_path)
    return dict(os.environ, PYTHONPATH=path, **{k: str(v) for k, v in extra.items()})


def _driver(plugin_path):
    return str(plugin_path.parent / "driver.py")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(plugin_path, work, mode, *, world=1, nan_ranks="0", steps=3):
    """Start ``world`` ranks; returns ([(rc, output) per rank], [result per rank])."""
    work.mkdir(parents=True, exist_ok=True)
    port = _port()
    procs = [subprocess.Popen([PY, _driver(plugin_path), str(work / "run"), str(work / "ckpt"), mode, str(steps)],
                              env=_env(plugin_path, RANK=r, WORLD_SIZE=world, PORT=port, NAN_LOSS_RANKS=nan_ranks),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]  # fmt: skip
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out))
    results = []
    for r in range(world):
        f = work / f"result-rank{r}.json"
        results.append(json.loads(f.read_text()) if f.exists() else None)
    return outs, results


def _checkpoints(work):
    return sorted(p.name for p in (work / "ckpt" / "_actor").glob("global_step*"))


def _assert_stopped_at_step2(work, outs, results, *, rank):
    """Exit code 3, an incident naming the loss's output, the step-1 checkpoint kept, nothing after it."""
    rc, out = outs[0]
    assert rc == GUARD_EXIT_CODE, out[-4000:]
    assert "ValueError" not in out, out[-4000:]
    assert "the non-finite guard stopped the run" in out
    run = work / "run"
    incident = json.loads((run / runs.INCIDENT).read_text())
    assert incident["tensor"] == "policy_loss" and incident["step"] == 2 and incident["micro_batch"] == 0
    assert incident["rank"] == rank and incident["mode"] == "stop" and incident["policy_loss_type"] == LOSS
    # the loss's output, as the aggregation's input check saw it: row 0's 18 valid tokens from index 2
    assert incident["origin"] == {"name": "per_token_loss", "nan_count": 18, "inf_count": 0, "first_index": [0, 2]}
    assert incident["nan_count"] == 1 and incident["inf_count"] == 0 and incident["first_index"] == []  # the scalar
    assert incident["sample_indices"] == [0, 1, 2, 3]  # a scalar loss: the micro-batch's samples
    ckpt1 = work / "ckpt" / "_actor" / "global_step1"
    assert incident["last_good_checkpoint"] == str(ckpt1)
    assert _checkpoints(work) == ["global_step1"]  # kept, and nothing saved after it
    # no optimizer step after the checkpoint: the weights at the stop are the checkpoint's
    saved = torch.load(ckpt1 / "weights.pt")["theta"]
    for r, res in enumerate(results):
        assert res["stop"] and "non-finite policy_loss" in res["stop"] and "at step 2" in res["stop"], res
        assert res["theta"] == saved.tolist(), f"rank {r} stepped after the checkpoint"
        assert len(res["losses"]) == 1
    assert saved.abs().sum() > 0  # step 1 did update: the comparison above could fail
    from rlhf_ext.patches.openrlhf.guard import tensor_digest

    assert incident["weights_sha256"]["theta"] == tensor_digest(saved)

    assert [r["step"] for r in runs.read_metrics(run / runs.METRICS)] == [1]
    events = runs.read_jsonl(run / runs.EVENTS)
    assert [e["event"] for e in events] == ["start", "checkpoint", "guard_incident", "end"]
    assert events[2]["step"] == 2 and events[2]["tensor"] == "policy_loss" and events[2]["rank"] == rank
    assert events[3]["status"] == "stopped_by_guard" and events[3]["exit_code"] == GUARD_EXIT_CODE
    return run, incident


def test_registered_loss_nan_stops_the_run_with_the_guards_code_shown_by_runs_show_report_and_queue(
        plugin_path, tmp_path, capsys, monkeypatch):
    """One rank, run as a queue run: the queue marks it ``failed (guard)``; ``runs show`` and the report show it."""
    from rlhf_ext.queue import run_queue
    from rlhf_ext.queue.control import status as queue_status
    from rlhf_ext.report import collect, incident_rows

    work = tmp_path / "w"
    suite = tmp_path / "s.toml"
    suite.write_text(textwrap.dedent(f"""
        [suite]
        name = "guarded"
        [[runs]]
        name = "nanloss"
        commands = [["{PY}", "{_driver(plugin_path)}", "{work / 'run'}", "{work / 'ckpt'}", "stop", "3"]]
        record_dir = "{work / 'run'}"
        expect = ["{work / 'run'}"]
        [[runs]]
        name = "after"
        commands = [["bash", "-c", "true"]]
        expect = ["{tmp_path}"]
    """))
    # the queue puts its snapshot of rlhf_ext first on this path; the plugin is found through it
    monkeypatch.setenv("PYTHONPATH", str(plugin_path))
    monkeypatch.setenv("NAN_LOSS_RANKS", "0")
    work.mkdir()
    assert run_queue(suite, tmp_path / "q", out=None) == 1
    entry = {r["name"]: r for r in json.loads((tmp_path / "q" / "manifest.json").read_text())["runs"]}
    nanloss = entry["nanloss"]
    log = Path(nanloss["logs"][0]).read_text()
    assert nanloss["status"] == "failed" and nanloss["failure"] == "guard", log[-4000:]
    assert nanloss["exit_code"] == GUARD_EXIT_CODE
    assert nanloss["reason"].startswith("command 1 was stopped by the non-finite guard (exit code 3): "
                                        "non-finite policy_loss (from per_token_loss) at step 2, rank 0")
    assert entry["after"]["status"] == "pending"
    result = json.loads((work / "result-rank0.json").read_text())
    run, incident = _assert_stopped_at_step2(work, [(nanloss["exit_code"], log)], [result], rank=0)

    import io

    shown = io.StringIO()
    queue_status(tmp_path / "q", out=shown)
    line = next(x for x in shown.getvalue().splitlines() if " nanloss " in x)
    assert "failed (guard)" in line and " 3 " in line

    assert cli_main(["runs", "show", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "status: stopped_by_guard (exit code 3); last step 1" in shown
    assert "guard incident at step 2: tensor policy_loss (rank 0, mode stop)" in shown
    assert "incident.json: step 2, micro-batch 0, tensor policy_loss, rank 0" in shown
    assert f"from per_token_loss: 18 NaN and 0 Inf value(s), first at index (0, 2) (policy loss {LOSS})" in shown

    data = collect([run], resamples=50)
    rows = [r for r in incident_rows(data.runs) if r[2] == "guard incident"]
    assert len(rows) == 1 and rows[0][1] == 2
    assert "non-finite policy_loss on rank 0, mode stop" in rows[0][3]
    assert f"from per_token_loss (18 NaN, 0 Inf, first at (0, 2)) of policy loss {LOSS}" in rows[0][3]
    assert "last good checkpoint: " + str(work / "ckpt" / "_actor" / "global_step1") in rows[0][3]


def test_two_ranks_nan_on_one_rank_only_stops_both(plugin_path, tmp_path):
    """Only rank 1's loss is NaN: both ranks stop at step 2 before any optimizer step; rank 1 writes the record."""
    work = tmp_path / "w"
    outs, results = _run(plugin_path, work, "stop", world=2, nan_ranks="1")
    assert results[1] is not None, outs[1][1][-4000:]
    assert "ValueError" not in outs[1][1], outs[1][1][-4000:]
    _, incident = _assert_stopped_at_step2(work, outs, results, rank=1)
    assert STOP_MARKER in results[0]["stop"] and "rank 1" in results[0]["stop"]
    # rank 1 has the finding and says so; rank 0 only knows the verdict
    assert "(first met by the input check of per_token_loss)" in results[1]["stop"]


def test_warn_records_the_incident_and_goes_on(plugin_path, tmp_path):
    work = tmp_path / "w"
    outs, results = _run(plugin_path, work, "warn", steps=3)
    rc, out = outs[0]
    assert rc == 0, out[-4000:]
    assert results[0]["stop"] is None and len(results[0]["losses"]) == 3
    loss1, loss2, loss3 = results[0]["losses"]
    assert loss1 == loss1 and loss2 != loss2 and loss3 != loss3  # NaN from step 2 on, and the run went on
    assert not (work / "run" / runs.INCIDENT).exists()
    events = runs.read_jsonl(work / "run" / runs.EVENTS)
    warned = [e for e in events if e["event"] == "guard_incident"]
    assert all(e["mode"] == "warn" for e in warned) and warned
    # the loss at steps 2 and 3, from the registered loss's output; no gradient incident: the NaN is a
    # constant put in by torch.where, so no gradient flows through it and the gradients stay finite
    assert [(e["step"], e["tensor"], e["origin"]) for e in warned] == [
        (2, "policy_loss", "per_token_loss"), (3, "policy_loss", "per_token_loss")]
    assert events[-1]["status"] == "finished" and events[-1]["exit_code"] == 0
    metrics = runs.read_metrics(work / "run" / runs.METRICS)
    assert [m["rlhf_ext/guard/incidents"] for m in metrics][0] == 0 and metrics[-1]["rlhf_ext/guard/incidents"] >= 2


def test_guard_off_keeps_the_input_checks_error(plugin_path, tmp_path):
    work = tmp_path / "w"
    outs, results = _run(plugin_path, work, "off")
    rc, out = outs[0]
    assert rc == 1, out[-4000:]
    assert "ValueError: per_token_loss contains 18 NaN and 0 Inf value(s) (first at index (0, 2))" in out
    assert not (work / "run" / runs.INCIDENT).exists()
    assert _checkpoints(work) == ["global_step1"]
    assert runs.read_jsonl(work / "run" / runs.EVENTS)[-1]["status"] == "crashed"
