"""The non-finite guard's checks and plumbing, on real tensors and a real (single-process gloo) torch.distributed."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_ext.patches.openrlhf import guard as g


def test_bad_rows_looks_only_at_masked_entries():
    adv = torch.tensor([[1.0, float("nan"), 0.0], [0.5, 0.5, float("inf")], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert g.bad_rows(adv, mask).tolist() == [False, True, False]  # row 0's NaN sits on padding
    assert g.bad_rows(adv).tolist() == [True, True, False]
    assert g.bad_rows(torch.tensor(float("nan"))).tolist() == [True]
    assert g.bad_rows(torch.tensor(1.5)).tolist() == [False]
    assert g.bad_rows(None) is None


def test_max_abs_log_ratio_hand_computed():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    old = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert g.max_abs_log_ratio(lp, old, mask).tolist() == pytest.approx([0.5, 0.3])
    lp[1, 0] = -float("inf")
    r = g.max_abs_log_ratio(lp, old, mask)
    assert g.bad_rows(r).tolist() == [False, True]


def test_grads_nonfinite_finds_one_bad_entry_in_any_dtype():
    grads = [torch.randn(64, 64), torch.randn(7, dtype=torch.bfloat16), torch.zeros(3)]
    assert g.grads_nonfinite(grads) is False
    assert g.grads_nonfinite([]) is False
    for i, bad in ((0, float("nan")), (1, float("inf")), (2, -float("inf"))):
        poisoned = [t.clone() for t in grads]
        poisoned[i].view(-1)[-1] = bad
        assert g.grads_nonfinite(poisoned) is True
    # huge but finite values overflow the fast 2-norm; the exact pass clears them
    assert g.grads_nonfinite([torch.full((10,), 3e38), torch.ones(2, dtype=torch.bfloat16)]) is False


def test_grad_tensors_reads_param_grads_without_touching_them():
    model = torch.nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    grads = g.grad_tensors(model)
    assert len(grads) == 2 and all(a is p.grad for a, p in zip(grads, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(grads, before))


def test_parse_poison():
    assert g.parse_poison(None) is None and g.parse_poison("") is None
    assert g.parse_poison("step=2,tensor=grad") == {"step": 2, "tensor": "grad", "rank": 0}
    assert g.parse_poison("step=3, tensor=loss, rank=1") == {"step": 3, "tensor": "loss", "rank": 1}
    for bad in ("step=2", "tensor=loss", "step=2,tensor=weights", "step=x,tensor=loss", "step=1,tensor=loss,foo=1"):
        with pytest.raises(ValueError, match="RLHF_EXT_TEST_POISON"):
            g.parse_poison(bad)


def test_guard_stop_is_recognised_through_ray_wrapping():
    from ray.exceptions import RayTaskError

    stop = g.GuardStop(f"{g.STOP_MARKER}: non-finite grad at step 2")
    wrapped = RayTaskError("fit", "traceback text", stop)
    outer = RayTaskError("fit", "traceback text", wrapped)
    assert g.is_guard_stop(stop) and g.is_guard_stop(wrapped) and g.is_guard_stop(outer)
    try:
        try:
            raise stop
        except g.GuardStop as exc:
            raise RuntimeError("outer") from exc
    except RuntimeError as chained:
        assert g.is_guard_stop(chained)
    assert not g.is_guard_stop(RuntimeError("loss is nan"))
    assert g.GUARD_EXIT_CODE not in (0, 1, 2)


class _Args:
    class rlhf_ext:  # noqa: N801 - mirrors OpenRLHF's nested args
        guard = "warn"
        run_dir = None

    class ckpt:  # noqa: N801
        path = None


class _Trainer:
    def __init__(self, mode):
        self.args = _Args()
        self.args.rlhf_ext.guard = mode
        self.strategy = object()
        self.actor = torch.nn.Linear(2, 2)


class _Exp:
    def __init__(self, adv):
        self.advantages = adv
        self.action_mask = torch.ones_like(adv, dtype=torch.bool)
        self.action_log_probs = torch.zeros_like(adv)
        self.index = [10, 11]
        self.prompts = ["p10", "p11"]


@pytest.fixture()
def gloo_world():
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_guard_names_the_first_bad_tensor_and_stops_or_warns(gloo_world, tmp_path):
    from rlhf_ext.patches.openrlhf import run_record

    trainer = _Trainer("stop")
    trainer.args.rlhf_ext.run_dir = str(tmp_path)
    guard = g.Guard(trainer)
    guard.train_calls = 4
    mb = g._MicroBatch(trainer, _Exp(torch.tensor([[1.0, 2.0], [float("nan"), 0.0]])), step=1)
    mb.log_probs = torch.zeros(2, 2)
    mb.policy_loss = torch.tensor(float("nan"))  # also bad, but advantages come first
    with pytest.raises(g.GuardStop, match="non-finite advantages at step 4, micro-batch 1"):
        guard.before_backward(mb, torch.tensor(float("nan")))
    import json

    incident = json.loads((tmp_path / "incident.json").read_text())
    assert incident["tensor"] == "advantages" and incident["step"] == 4 and incident["micro_batch"] == 1
    assert incident["sample_indices"] == [11] and incident["prompts"] == ["p11"] and incident["rank"] == 0
    assert set(incident["weights_sha256"]) == {"weight", "bias"}

    # a finite micro-batch passes and records the largest |log-ratio|
    ok = g._MicroBatch(trainer, _Exp(torch.ones(2, 2)), step=0)
    ok.log_probs = torch.tensor([[0.0, -0.25], [0.5, 0.0]])
    ok.policy_loss = torch.tensor(0.1)
    guard.before_backward(ok, torch.tensor(0.3))
    assert guard.max_log_ratio == 0.5

    # warn: no exception, a counted incident and an event shipped with the step's results
    warn = g.Guard(_Trainer("warn"))
    run_record._take_events()
    mb = g._MicroBatch(warn, _Exp(torch.ones(2, 2)), step=0)
    warn.before_backward(mb, torch.tensor(float("inf")))
    assert warn.incidents == 1
    (event,) = run_record._take_events()
    assert event["event"] == "guard_incident" and event["tensor"] == "loss" and event["mode"] == "warn"


def test_guard_checks_gradients_and_poison_hook(gloo_world, monkeypatch, tmp_path):
    monkeypatch.setenv(g.POISON_ENV, "step=2,tensor=grad")
    trainer = _Trainer("stop")
    trainer.args.rlhf_ext.run_dir = str(tmp_path)
    guard = g.Guard(trainer)
    model = torch.nn.Linear(3, 1)
    model(torch.randn(2, 3)).sum().backward()
    mb = g._MicroBatch(trainer, _Exp(torch.ones(2, 2)), step=3)
    guard.train_calls = 1
    guard.before_step(mb, model)  # step 1: not poisoned, finite
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    guard.train_calls = 2
    with pytest.raises(g.GuardStop, match="non-finite grad at step 2"):
        guard.before_step(mb, model)
    assert math.isnan(float(model.weight.grad.view(-1)[0]))


def test_patches_reach_the_ray_actor_class_of_the_ppo_trainer():
    """``@ray.remote`` copies every method (inherited ones too) into tracing wrappers at decoration time,
    so BasePPOTrainer's patches must be in place before ``PPOTrainer`` is decorated; check in a fresh process."""
    import subprocess
    import sys

    code = (
        "import inspect\n"
        "from rlhf_ext.patches import activate\n"
        "activate(['rlhf_ext'], role='test')\n"
        "import openrlhf.trainer.ppo_trainer as m\n"
        "cls = m.PPOTrainer.__ray_metadata__.modified_class\n"
        "for name in ('init_checkpoint_states', 'train_step', 'ppo_train', 'save_logs_and_checkpoints',"
        " 'save_best_checkpoint'):\n"
        "    wrapper = cls.__dict__[name]\n"
        "    inner = inspect.getclosurevars(wrapper).nonlocals['method']\n"
        "    assert getattr(inner, '__rlhf_ext_patch__', None), name\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _two_rank_worker(rank, port, run_dir, results):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        trainer = _Trainer("stop")
        trainer.args.rlhf_ext.run_dir = run_dir
        guard = g.Guard(trainer)
        guard.train_calls = 5
        adv = torch.ones(2, 2)
        ok = g._MicroBatch(trainer, _Exp(adv), step=0)
        guard.before_backward(ok, torch.tensor(0.5))  # both healthy: both go on
        loss = torch.tensor(float("nan")) if rank == 1 else torch.tensor(0.5)
        try:
            guard.before_backward(g._MicroBatch(trainer, _Exp(adv), step=1), loss)
            results[rank] = "went on"
        except g.GuardStop as exc:
            results[rank] = str(exc)
        # gloo can abort the process when one rank tears down while the peer still talks to it
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_verdict_is_shared_by_all_ranks(tmp_path):
    """Only rank 1 sees a NaN; rank 0 must stop too (else it would hang in the next collective),
    and the record names rank 1 (written by rank 1, which has the samples)."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_two_rank_worker, args=(port, str(tmp_path), results), nprocs=2, join=True)
    assert set(results.keys()) == {0, 1}
    for rank in (0, 1):
        assert "non-finite loss at step 5, micro-batch 1, rank 1" in results[rank], dict(results)
    incident = json.loads((tmp_path / "incident.json").read_text())
    assert incident["rank"] == 1 and incident["tensor"] == "loss"
