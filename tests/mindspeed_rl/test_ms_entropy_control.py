"""``rl_config.adaptive_entropy`` inside the real MindSpeed-RL 2.1.0 actor (issue 42).

The training engine is MindSpeed-RL's own ``Actor`` (``BaseTrainingEngine.update``: mini-batches,
micro-batches, the real GRPO loss with rlhf_ext's patches) on a tiny torch model. Stand-ins, as
the other loss tests: Megatron's vocab-parallel log-softmax and entropy (``compute_log_probs``)
computed on one rank with torch, its pipeline schedule (one rank, no pipelining), its optimizer
wrapper (``step()`` returning ``(ok, grad_norm, zeros)``) and the parallel state of one rank. The
transfer dock the worker reports to is a real Ray actor.
"""

import copy
import math
import os
import socket
from types import SimpleNamespace
from unittest.mock import patch

import pytest
import torch

from rlhf_ext.patches.mindspeed_rl import ConfigError, ConfiguredName
from rlhf_ext.patches.mindspeed_rl.config import extract_and_validate
from rlhf_ext.patches.mindspeed_rl.entropy_control import (
    APPLIED_KEY,
    NEXT_KEY,
    STATE_ATTR,
    data_parallel_sum,
    make_worker_update,
)

B, P, R, V = 4, 2, 3, 11


# ---- rl_config ----------------------------------------------------------------------------------


def test_the_key_reaches_the_settings_with_trls_defaults_and_the_initial_coefficient():
    _, settings = extract_and_validate({"adaptive_entropy": True, "entropy_coeff": 0.05})
    assert settings["adaptive_entropy"] == {"coef": 0.05, "target": 0.2, "delta": 0.005, "coef_min": 0.0,
                                            "coef_max": 1.0}
    _, settings = extract_and_validate({"adaptive_entropy": {"entropy_target": 0.5, "entropy_coef_delta": 0.01}})
    assert settings["adaptive_entropy"]["target"] == 0.5 and settings["adaptive_entropy"]["delta"] == 0.01
    assert settings["adaptive_entropy"]["coef"] == 0.0  # MindSpeed-RL's default entropy_coeff
    for off in ({"adaptive_entropy": False}, {"adaptive_entropy": {"enabled": False}}, {}):
        assert "adaptive_entropy" not in extract_and_validate(off)[1]


@pytest.mark.parametrize("config, message", [
    ({"adaptive_entropy": "yes"}, "rl_config.adaptive_entropy must be true, false or a mapping"),
    ({"adaptive_entropy": {"target": 0.3}}, "rl_config.adaptive_entropy has no key 'target'"),
    ({"adaptive_entropy": {"entropy_coef_delta": "0.01"}}, "rl_config.adaptive_entropy.entropy_coef_delta must be"),
    ({"adaptive_entropy": {"entropy_coef_delta": -0.01}}, "delta must be >= 0"),
    ({"adaptive_entropy": {"entropy_target": -1}}, "the target entropy must be >= 0"),
    ({"adaptive_entropy": {"enabled": "no"}}, "rl_config.adaptive_entropy.enabled must be true or false"),
    ({"adaptive_entropy": {"entropy_coef_max": 0.1}, "entropy_coeff": 0.5},
     "the initial coefficient 0.5 is outside [0.0, 0.1] (the initial coefficient is rl_config.entropy_coeff)"),
])
def test_bad_values_are_refused_naming_the_key(config, message):
    with pytest.raises(ConfigError) as err:
        extract_and_validate(config)
    assert message in str(err.value)


# ---- the real actor -----------------------------------------------------------------------------


class OneRank:
    """Megatron's parallel state of a single rank (the ``mpu`` MindSpeed-RL passes around)."""

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def is_pipeline_last_stage(self, ignore_virtual=False):
        return True

    def get_context_parallel_world_size(self):
        return 1

    def get_tensor_model_parallel_world_size(self):
        return 1

    def get_data_parallel_world_size(self):
        return 1

    def get_tensor_model_parallel_rank(self):
        return 0

    def get_context_parallel_rank(self):
        return 0


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, 8)
        self.out = torch.nn.Linear(8, V)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.out(torch.tanh(self.emb(input_ids)))

    def zero_grad_buffer(self):  # Megatron DDP's name for it
        self.zero_grad()


class Optimizer:
    def __init__(self, params):
        self.opt = torch.optim.SGD(params, lr=0.5)
        self.param_groups = self.opt.param_groups

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        self.opt.step()
        return True, 0.0, 0


class Scheduler:
    def step(self, increment):
        pass


def no_pipelining(forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size,
                  forward_only, collect_non_loss_data):
    stats = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        loss, stat = loss_func(output)
        if not forward_only:
            loss.backward()
        stats.append(stat)
    return stats


def log_probs_and_entropy(self, output, batch, skip_entropy=True, **kwargs):
    """The response tokens' log-probs and entropies from the logits (one rank of the vocab-parallel kernels)."""
    logp = torch.log_softmax(output.float(), -1)
    token = torch.gather(logp, -1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    at = (batch["prompt_length"] - 1) + torch.arange(batch["responses"].shape[1])[None]
    log_probs = torch.gather(token, 1, at)
    return log_probs, (torch.zeros_like(log_probs) if skip_entropy else torch.gather(entropy, 1, at))


def make_actor(model, kl_penalty, entropy_coeff):
    from mindspeed_rl.models.actor import Actor

    return Actor([model], Optimizer(model.parameters()), Scheduler(), beta=0.0, mini_batch_size_per_dp=2, epochs=1,
                 shuffle_mini_batch=False, stage="ray_grpo", clip_ratio=0.2, temperature=1.0,
                 forward_backward_func=no_pipelining, micro_batch_size=1, entropy_coeff=entropy_coeff,
                 kl_penalty=kl_penalty, token_level_loss=True, clip_higher_enable=False, clip_ratio_low=0.2,
                 clip_ratio_high=0.2)


def batches(model, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, V, (B, P + R), generator=g)
    data = {"input_ids": ids, "responses": ids[:, P:], "prompt_length": torch.full((B, 1), P),
            "response_length": torch.tensor([[3], [2], [3], [1]]), "advantages": torch.randn(B, R, generator=g),
            "ref_log_prob": torch.zeros(B, R)}
    with torch.no_grad():
        batch = dict(data, labels=torch.cat([ids[:, 1:], torch.zeros(B, 1, dtype=ids.dtype)], 1))
        data["old_log_prob"] = log_probs_and_entropy(None, model(ids), batch)[0]
    return data


@pytest.fixture
def one_rank():
    from mindspeed_rl.utils.compute import get_parallel_state, set_parallel_state

    before = get_parallel_state()
    set_parallel_state(OneRank())
    yield
    set_parallel_state(before)


def make_worker(local_ray, settings, entropy_coeff):
    from ms_helpers import fresh_dock

    from mindspeed_rl.models.actor_rollout_hybrid import ActorRolloutHybrid
    from mindspeed_rl.workers.actor_hybrid_worker import ActorHybridWorkerBase

    model = TinyLM()
    penalty = ConfiguredName("low_var_kl", settings)
    worker = object.__new__(ActorHybridWorkerBase)  # the Megatron/NPU state is never built here
    worker.rl_config = SimpleNamespace(kl_penalty=penalty)
    worker.parallel_state = OneRank()
    worker.td = fresh_dock({"unused": [torch.zeros(1)]})
    worker.actor_hybrid = object.__new__(ActorRolloutHybrid)
    worker.actor_hybrid.train_actor = make_actor(model, penalty, entropy_coeff)
    return worker, model


def step_through(worker, seeds, seen):
    """MindSpeed-RL's ``update`` takes batches from the dock until it is empty: here one per seed."""
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    def original(self, kl_ctrl=None, skip_actor_log_prob=False):
        for seed in seeds:
            engine = self.actor_hybrid.train_actor
            metrics = self.actor_hybrid.update_actor(batches(engine.model[0], seed), kl_ctrl)
            seen.append((engine.loss_func.entropy_coeff, metrics))

    with patch("mindspeed_rl.models.loss.base_loss_func.BaseLossFunc.compute_log_probs", log_probs_and_entropy):
        make_worker_update(original)(worker, FixedKLController(0.0), False)


def test_the_coefficient_steps_with_the_measured_entropy_and_reaches_the_loss(local_ray, one_rank):
    import ray

    settings = {"adaptive_entropy": {"coef": 0.0, "target": 10.0, "delta": 0.01, "coef_min": 0.0, "coef_max": 1.0}}
    worker, model = make_worker(local_ray, settings, entropy_coeff=0.0)
    engine = worker.actor_hybrid.train_actor
    seen = []
    step_through(worker, (1, 2), seen)
    # step 1: nothing measured yet, so no bonus; the rlhf_ext loss measured the entropy all the same
    assert [coef for coef, _ in seen] == [0.0, 0.0]
    entropies = [e for _, m in seen for e in m["actor/entropy"]]
    assert len(entropies) == 2 * B and all(2.0 < e < math.log(V) + 1e-6 for e in entropies), entropies
    state = worker.__dict__[STATE_ATTR]
    assert state.last_entropy == pytest.approx(sum(entropies) / len(entropies), rel=1e-12)
    assert state.coef == pytest.approx(0.01) and engine.entropy_coeff == pytest.approx(0.01)

    # step 2 applies 0.01: the same loss and update as MindSpeed-RL's own loss with a fixed entropy_coeff 0.01
    reference_model = copy.deepcopy(model)
    reference = make_actor(reference_model, "low_var_kl", entropy_coeff=0.01)
    seen.clear()
    step_through(worker, (3,), seen)
    assert seen[0][0] == pytest.approx(0.01)
    from mindspeed_rl.trainer.utils.compute_utils import FixedKLController

    with patch("mindspeed_rl.models.loss.base_loss_func.BaseLossFunc.compute_log_probs", log_probs_and_entropy):
        want = reference.update_actor(batches(reference_model, 3), FixedKLController(0.0))
    got = seen[0][1]
    for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl"):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert state.coef == pytest.approx(0.02)
    assert ray.get(worker.td.metric.remote(APPLIED_KEY)) == pytest.approx([0.0, 0.01])
    assert ray.get(worker.td.metric.remote(NEXT_KEY)) == pytest.approx([0.01, 0.02])


def test_above_the_target_the_coefficient_falls_to_its_floor_and_no_bonus_applies(local_ray, one_rank):
    import ray

    settings = {"adaptive_entropy": {"coef": 0.015, "target": 0.5, "delta": 0.01, "coef_min": 0.0, "coef_max": 1.0}}
    worker, _ = make_worker(local_ray, settings, entropy_coeff=0.015)
    seen = []
    for seed in (1, 2, 3):
        step_through(worker, (seed,), seen)
    assert [coef for coef, _ in seen] == [0.0, 0.0, 0.0]  # the entropy (~2.3 nats) stays above 0.5
    assert worker.__dict__[STATE_ATTR].coef == 0.0  # 0.015 -> 0.005 -> 0 (floor) -> 0
    assert ray.get(worker.td.metric.remote(NEXT_KEY)) == [0.0, 0.0, 0.0]


def test_without_the_key_the_worker_update_is_mindspeed_rls(one_rank):
    calls = []
    worker = SimpleNamespace(rl_config=SimpleNamespace(kl_penalty="low_var_kl"))
    make_worker_update(lambda self, kl_ctrl, skip: calls.append((kl_ctrl, skip)) or "done")(worker, "kl", True)
    assert calls == [("kl", True)] and STATE_ATTR not in worker.__dict__


def test_the_seams_are_on_the_real_classes():
    from mindspeed_rl.models.actor import Actor
    from mindspeed_rl.workers.actor_hybrid_worker import ActorHybridWorkerBase

    assert ActorHybridWorkerBase.update.__rlhf_ext_patch__ == "adaptive entropy: the step's coefficient"
    assert Actor.update_actor.__rlhf_ext_patch__ == "adaptive entropy: the step's entropy"


# ---- every data-parallel rank takes the same step ------------------------------------------------


class WorldGroup:
    def get_data_parallel_group(self):
        import torch.distributed as dist

        return dist.group.WORLD


def _rank_sum(rank, port, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out[rank] = data_parallel_sum(WorldGroup(), torch.device("cpu"), total=[4.5, 2.25][rank], count=[3, 1][rank])
    finally:
        dist.destroy_process_group()


def test_data_parallel_ranks_sum_their_entropies_into_one_step():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_sum, args=(port, out), nprocs=2, join=True)
        assert dict(out) == {0: (6.75, 4), 1: (6.75, 4)}
    assert data_parallel_sum(WorldGroup(), None, 1.5, 2) == (1.5, 2)  # no process group: this rank's own
