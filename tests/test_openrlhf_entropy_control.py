"""The adaptive entropy coefficient (Skywork-OR1, arXiv 2505.22312): hand-computed controller steps, and its
OpenRLHF seam (``ActorPPOTrainer.ppo_train``: the coefficient OpenRLHF's ``training_step`` reads, stepped with
the step's entropy). TRL 1.16 parity: tests/verl_env/test_trl_adaptive_entropy.py."""

from types import SimpleNamespace

import pytest

from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef


def test_controller_hand_computed():
    c = AdaptiveEntropyCoef(coef=0.01, target=0.5, delta=0.01, coef_min=0.0, coef_max=0.02)
    assert c.applied() == 0.0  # nothing measured yet (entropy +inf): no bonus
    assert c.update(0.7) == 0.0  # above the target: down, floored at 0
    assert c.applied() == 0.0
    assert c.update(0.4) == pytest.approx(0.01)  # at or below: up, and now applied
    assert c.applied() == pytest.approx(0.01)
    assert c.update(0.5) == pytest.approx(0.02)  # the target itself counts as below
    assert c.update(0.1) == pytest.approx(0.02)  # capped
    state = c.state_dict()
    d = AdaptiveEntropyCoef(coef=0.0, target=0.5, delta=0.01, coef_max=0.02)
    d.load_state_dict(state)
    assert d.applied() == pytest.approx(0.02)
    with pytest.raises(ValueError, match="outside"):
        AdaptiveEntropyCoef(coef=2.0)
    with pytest.raises(ValueError, match="not finite"):
        c.update(float("nan"))


def _trainer(entropies, coef=0.0, **flags):
    options = dict(adaptive_entropy=True, entropy_target=0.5, entropy_coef_delta=0.1, entropy_coef_min=None,
                   entropy_coef_max=None)
    options.update(flags)
    args = SimpleNamespace(actor=SimpleNamespace(entropy_coef=coef), rlhf_ext=SimpleNamespace(**options))
    seen = []

    def original(self, kl_ctl):
        seen.append(self.args.actor.entropy_coef)  # what OpenRLHF's training_step reads this step
        return {"entropy_loss": entropies[len(seen) - 1], "policy_loss": 0.0}

    return SimpleNamespace(args=args, strategy=SimpleNamespace()), original, seen


def test_ppo_train_seam_applies_then_steps_the_coefficient():
    from rlhf_ext.patches.openrlhf.entropy_control import APPLIED_KEY, NEXT_KEY, make_ppo_train

    trainer, original, seen = _trainer([0.9, 0.3, 0.2, 0.8])
    ppo_train = make_ppo_train(original)
    statuses = [ppo_train(trainer, 0.0) for _ in range(4)]
    # coef 0 -> (0.9 > 0.5) 0 -> (0.3) 0.1 -> (0.2) 0.2 -> (0.8) 0.1; applied only after a step at/below target
    assert seen == [0.0, 0.0, pytest.approx(0.1), pytest.approx(0.2)]
    assert [s[APPLIED_KEY] for s in statuses] == seen
    assert [s[NEXT_KEY] for s in statuses] == [0.0, pytest.approx(0.1), pytest.approx(0.2), 0.0]


def test_ppo_train_seam_is_inert_without_the_flag():
    from rlhf_ext.patches.openrlhf.entropy_control import APPLIED_KEY, make_ppo_train

    trainer, original, seen = _trainer([0.1], coef=0.3, adaptive_entropy=False)
    status = make_ppo_train(original)(trainer, 0.0)
    assert seen == [0.3] and APPLIED_KEY not in status


@pytest.mark.parametrize("argv, message", [
    (["--rlhf_ext.adaptive_entropy"], "needs --actor.entropy_coef"),
    (["--rlhf_ext.entropy_target", "0.3"], "add --rlhf_ext.adaptive_entropy"),
    (["--rlhf_ext.adaptive_entropy", "--actor.entropy_coef", "0.5", "--rlhf_ext.entropy_coef_max", "0.1"], "outside"),
])  # fmt: skip
def test_bad_flags_are_argparse_errors(parse, capfd, argv, message):
    from test_openrlhf_staleness import assert_argparse_error

    assert_argparse_error(parse, capfd, argv, message)


def test_flags_parse(parse):
    args = parse("--rlhf_ext.adaptive_entropy", "--actor.entropy_coef", "0", "--rlhf_ext.entropy_target", "0.3")
    assert args.rlhf_ext.adaptive_entropy is True and args.rlhf_ext.entropy_target == 0.3


def check_adaptive_entropy_run(metrics_rows, *, initial: float, delta: float, target: float):
    """The assertions for a real run with ``--rlhf_ext.adaptive_entropy --actor.entropy_coef INITIAL
    --rlhf_ext.entropy_coef_delta DELTA --rlhf_ext.entropy_target TARGET``: every step logs the applied and the
    next coefficient, each step's applied coefficient is the previous step's next one, and the coefficient moved
    by DELTA in the direction the logged entropy says."""
    assert metrics_rows, "the run logged no step"
    previous_next = None
    for i, row in enumerate(metrics_rows):
        value = {k[len("train/"):] if k.startswith("train/") else k: v for k, v in row.items()}
        applied, nxt = value["rlhf_ext/entropy_coef"], value["rlhf_ext/entropy_coef_next"]
        entropy = value["entropy_loss"]
        assert applied == pytest.approx(0.0 if i == 0 else previous_next), (i, value)
        expected = (initial if i == 0 else previous_next) + (delta if entropy <= target else -delta)
        assert nxt == pytest.approx(min(max(expected, 0.0), 1.0)), (i, value)  # within the default bounds [0, 1]
        previous_next = nxt


# A real DeepSpeed engine (gloo, one rank) saved and loaded through OpenRLHF's DeepspeedStrategy as patched:
# a resumed run's controller continues where the saved one stopped.
_CHECKPOINT_ROUND_TRIP = """
import json, os, sys
from types import SimpleNamespace as ns

import deepspeed
import torch

from rlhf_ext.npu.cpu_shim import transfer_to_cpu
from rlhf_ext.patches import activate

transfer_to_cpu()  # the CPU target's shim, as in a CPU run: OpenRLHF's save syncs CUDA
activate(["rlhf_ext"], role="test")
from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy

from rlhf_ext.patches.openrlhf.entropy_control import controller, make_ppo_train

ckpt = sys.argv[1]
deepspeed.init_distributed(dist_backend="gloo")


def engine():
    torch.manual_seed(0)
    model, *_ = deepspeed.initialize(model=torch.nn.Linear(2, 2), config={"train_micro_batch_size_per_gpu": 1})
    return model


def trainer(coef=0.0):
    args = ns(actor=ns(entropy_coef=coef), rlhf_ext=ns(adaptive_entropy=True, entropy_target=0.5,
              entropy_coef_delta=0.1, entropy_coef_min=None, entropy_coef_max=None))
    strategy = DeepspeedStrategy.__new__(DeepspeedStrategy)
    strategy.args = args
    return ns(args=args, strategy=strategy)


first = trainer()
entropies = iter([0.3, 0.2, 0.4])
ppo_train = make_ppo_train(lambda self, kl_ctl: {"entropy_loss": next(entropies)})
for _ in range(3):
    ppo_train(first, 0.0)  # coef 0 -> 0.1 -> 0.2 -> 0.3, each step at or below the target
model = engine()
first.strategy.save_ckpt(model, os.path.join(ckpt, "_actor"), tag="global_step3", client_state={"global_step": 3})
first.strategy.save_ckpt(model, os.path.join(ckpt, "_critic"), tag="global_step3", client_state={"global_step": 3})

resumed = trainer()
_, states = resumed.strategy.load_ckpt(engine(), os.path.join(ckpt, "_actor"))
_, critic_states = resumed.strategy.load_ckpt(engine(), os.path.join(ckpt, "_critic"))
state = controller(resumed)
fresh = controller(trainer())
print(json.dumps({"saved": states.get("rlhf_ext_entropy_controller"), "global_step": states.get("global_step"),
                  "critic_has_it": "rlhf_ext_entropy_controller" in critic_states,
                  "resumed": [state.coef, state.last_entropy, state.applied()], "fresh": [fresh.coef, fresh.applied()]}))
"""


def test_the_controller_is_saved_with_the_actor_checkpoint_and_restored_on_resume(tmp_path, free_port):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", _CHECKPOINT_ROUND_TRIP, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["saved"] == {"coef": pytest.approx(0.3), "last_entropy": 0.4} and out["global_step"] == 3
    assert not out["critic_has_it"]  # only the actor's checkpoint carries it
    assert out["resumed"] == [pytest.approx(0.3), 0.4, pytest.approx(0.3)]
    assert out["fresh"] == [0.0, 0.0]  # without a checkpoint: --actor.entropy_coef, no bonus before a measurement
