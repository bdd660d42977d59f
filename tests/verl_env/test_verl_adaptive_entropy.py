"""``RLHF_EXT_VERL_ADAPTIVE_ENTROPY`` on verl 0.9.1 (.venv-verl): Skywork-OR1's adaptive entropy
coefficient through verl's real ``RayPPOTrainer._update_actor`` (DataProto -> no-padding TensorDict,
metrics renaming) and verl's real actor loss ``ppo_loss`` as ``init_model`` binds it
(``partial(engine_workers.ppo_loss, config=ActorConfig)``). The worker group is the one stand-in:
it runs that loss on a tiny real torch model's log-probs and entropies (one mini-batch, dp 1) and
returns the metrics the way verl's worker does; training itself needs GPUs and is not run here."""

from __future__ import annotations

import math
import os
import sys
from functools import partial
from types import SimpleNamespace

import pytest
import torch

import verl  # noqa: F401  (activates the plugin, as in a run)
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.workers import engine_workers
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from rlhf_ext.patches.verl import entropy_control

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_verl_examples import compose, overrides  # noqa: E402
from test_verl_startup_masks import validate  # noqa: E402

V, B, P, R = 11, 4, 3, 5  # vocabulary, responses, prompt and response widths


class _WorkerGroup:
    """Stands in for verl's actor worker group (Ray + FSDP): the loss is verl's, bound as init_model binds it."""

    def __init__(self, entropy_coeff):
        torch.manual_seed(0)
        self.model = torch.nn.Embedding(V, V)  # next-token logits from the current token
        self.config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                                  entropy_coeff=entropy_coeff, policy_loss=PolicyLossConfig(loss_mode="vanilla"))
        self.loss_fn = partial(engine_workers.ppo_loss, config=self.config)
        self.seen = []

    def update_actor(self, data):
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
        ids = data["input_ids"].values()
        logp_all = torch.log_softmax(self.model(ids), dim=-1)
        next_ids = torch.roll(ids, -1)  # position t predicts token t+1; the shift is no_padding_2_padding's
        log_probs = logp_all.gather(-1, next_ids[:, None])[:, 0]
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        offsets = data["input_ids"].offsets()
        nested = lambda x: torch.nested.nested_tensor_from_jagged(x, offsets=offsets)  # noqa: E731
        loss, metrics = self.loss_fn(model_output={"log_probs": nested(log_probs), "entropy": nested(entropy)},
                                     data=data)
        loss.backward()
        self.seen.append({"loss": loss.item(), "entropy": entropy.detach(),
                          "coef": tu.get_non_tensor_data(data=data, key=entropy_control.META_KEY, default=None)})
        plain = {k: [m.aggregate() if hasattr(m, "aggregate") else float(m)] for k, m in metrics.items()}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {**plain, "mfu": 0.0}})


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, V, (B, P), generator=g)
    responses = torch.randint(1, V, (B, R), generator=g)
    response_mask = torch.ones(B, R)
    response_mask[1, 3:] = 0  # a shorter response (right padding)
    attention_mask = torch.cat([torch.ones(B, P), response_mask], dim=1).long()
    return DataProto.from_dict(tensors={
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask, "old_log_probs": torch.full((B, R), -math.log(V)),
        "advantages": torch.randn(B, R, generator=g)})


@pytest.fixture(scope="module")
def grpo():
    return compose(overrides("grpo.sh") + ["actor_rollout_ref.actor.entropy_coeff=0.01"])


def _trainer(config, wg):
    return SimpleNamespace(config=config, actor_rollout_wg=wg)


def _masked_mean_entropy(seen, batch):
    # the response tokens' entropies, read back from the flat model output (the position before each token)
    mask = batch.batch["response_mask"]
    lens = batch.batch["attention_mask"].sum(1)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)[:-1]])
    rows = [seen["entropy"][s + P - 1: s + P - 1 + R] for s in starts.tolist()]
    ent = torch.stack([torch.nn.functional.pad(r, (0, R - len(r))) for r in rows])
    return ((ent * mask).sum() / mask.sum()).item()


def test_seams_are_patched_in_the_process():
    assert getattr(RayPPOTrainer._update_actor, "rlhf_ext_patched", False)
    assert getattr(engine_workers.ppo_loss, "rlhf_ext_patched", False)


def test_coefficient_steps_toward_the_target_and_is_applied_and_logged(grpo, monkeypatch):
    monkeypatch.setenv(entropy_control.ENV, "target=10,delta=0.05,min=0,max=0.08")  # ln 11 < 10: always below
    wg, trainer = _WorkerGroup(entropy_coeff=0.01), None
    trainer = _trainer(grpo, wg)
    logged = []
    for step in range(3):
        batch = _batch(step)
        out = RayPPOTrainer._update_actor(trainer, batch)
        metrics = out.meta_info["metrics"]
        logged.append(metrics)
        seen = wg.seen[-1]
        # verl's entropy_loss is the token-mean entropy of the response tokens (hand-computed from the model)
        assert metrics["actor/entropy_loss"][0] == pytest.approx(_masked_mean_entropy(seen, batch), rel=1e-5)
        # the loss the worker back-propagated: pg_loss - applied * entropy_loss, applied from the driver
        assert seen["coef"] == metrics[entropy_control.APPLIED_KEY]
        expected = metrics["actor/pg_loss"][0] - seen["coef"] * metrics["actor/entropy_loss"][0]
        assert seen["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        assert entropy_control.META_KEY not in batch.meta_info
    # no measurement before step 1: no bonus; then 0.01 + 0.05 = 0.06; then 0.11 clipped to max 0.08
    assert [m[entropy_control.APPLIED_KEY] for m in logged] == pytest.approx([0.0, 0.06, 0.08])
    assert [m[entropy_control.NEXT_KEY] for m in logged] == pytest.approx([0.06, 0.08, 0.08])
    assert wg.config.entropy_coeff == 0.01  # verl's frozen config is not mutated


def test_above_the_target_no_bonus_and_the_coefficient_shrinks_to_its_floor(grpo, monkeypatch):
    monkeypatch.setenv(entropy_control.ENV, "target=0.2,delta=0.004,min=0.003")
    wg = _WorkerGroup(entropy_coeff=0.01)
    trainer = _trainer(grpo, wg)
    logged = [RayPPOTrainer._update_actor(trainer, _batch(s)).meta_info["metrics"] for s in range(3)]
    assert all(m["actor/entropy_loss"][0] > 0.2 for m in logged)
    assert [m[entropy_control.APPLIED_KEY] for m in logged] == [0.0, 0.0, 0.0]
    assert [s["loss"] for s in wg.seen] == pytest.approx([m["actor/pg_loss"][0] for m in logged], rel=1e-6)
    state = trainer.__dict__[entropy_control.STATE_ATTR]
    assert state.coef == pytest.approx(0.003)  # 0.01 - 0.004 = 0.006, then 0.002 -> floor 0.003


def test_unset_leaves_verl_untouched(grpo, monkeypatch):
    monkeypatch.delenv(entropy_control.ENV, raising=False)
    wg = _WorkerGroup(entropy_coeff=0.01)
    metrics = RayPPOTrainer._update_actor(_trainer(grpo, wg), _batch(0)).meta_info["metrics"]
    assert entropy_control.APPLIED_KEY not in metrics and wg.seen[0]["coef"] is None
    expected = metrics["actor/pg_loss"][0] - 0.01 * metrics["actor/entropy_loss"][0]  # verl's fixed coefficient
    assert wg.seen[0]["loss"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("value, extra, message", [
    ("target=x", [], "target must be a number"),
    ("tgt=0.2", [], "expected 1 or key=value pairs"),
    ("max=0.005", ["actor_rollout_ref.actor.entropy_coeff=0.01"], "initial coefficient 0.01 is outside"),
    ("1", ["actor_rollout_ref.actor.entropy_coeff=0"], "calculate_entropy=True"),
])
def test_bad_settings_stop_the_run_in_validate_config(monkeypatch, value, extra, message):
    with pytest.raises(ValueError, match="this verl run cannot start") as exc:
        validate(extra, monkeypatch, {entropy_control.ENV: value})
    assert message in str(exc.value)


def test_good_settings_pass_validate_config(monkeypatch):
    validate(["actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.calculate_entropy=True"],
             monkeypatch, {entropy_control.ENV: "1"})
    validate(["actor_rollout_ref.actor.entropy_coeff=0.01"], monkeypatch,
             {entropy_control.ENV: "target=0.3,delta=0.01,min=0,max=0.1"})
