"""The token-level estimators by name on verl 0.9.1 (runs in .venv-verl): ``rlhf_ext_tir_optimal_token_baseline``
and ``rlhf_ext_optimal_token_baseline`` through verl's (patched) ``compute_advantage`` equal verl's own
``tir_optimal_token_baseline`` / ``optimal_token_baseline`` on random multi-turn inputs (a response mask with
holes: tool outputs), with and without rollout IS weights; the start-up check asks for
``calculate_sum_pi_squared`` for both by name."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import verl  # noqa: F401  (activates the plugin, as in a run)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_verl_startup_masks import validate  # noqa: E402


def _batch(seed, with_is):
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 9
    lengths = torch.tensor([9, 3, 7, 9, 5, 6, 2, 8])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    holes = (torch.rand(B, T, generator=g) < 0.25) & (torch.arange(T)[None, :] > 0)
    mask = mask * (~holes).float()  # multi-turn: tool outputs inside the response are not the policy's tokens
    last = torch.tensor([int(row.nonzero().max()) for row in mask])
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), last] = torch.randint(0, 2, (B,), generator=g).float()
    tensors = {"token_level_rewards": rewards, "response_mask": mask,
               "old_log_probs": -torch.rand(B, T, generator=g) * 3, "sum_pi_squared": torch.rand(B, T, generator=g)}
    if with_is:
        tensors["rollout_is_weights"] = torch.rand(B, T, generator=g) + 0.5
    return tensors, np.array(["a", "b", "a", "b", "a", "b", "a", "b"], dtype=object)


def _run(name, tensors, uid):
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    data = DataProto.from_dict(tensors={k: v.clone() for k, v in tensors.items()}, non_tensors={"uid": uid})
    return ray_trainer.compute_advantage(data, adv_estimator=name, config=OmegaConf.create({}))


@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("name", ["tir_optimal_token_baseline", "optimal_token_baseline"])
def test_token_estimators_by_name_equal_verls_own(name, with_is):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import compute_advantage

    assert getattr(compute_advantage, "rlhf_ext_patched", False)
    assert core_algos.get_adv_estimator_fn("rlhf_ext_" + name).rlhf_ext_name == name
    tensors, uid = _batch(seed=7, with_is=with_is)
    ours, ref = _run("rlhf_ext_" + name, tensors, uid), _run(name, tensors, uid)
    torch.testing.assert_close(ours.batch["advantages"], ref.batch["advantages"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.batch["returns"], ref.batch["returns"])
    mask = tensors["response_mask"]
    assert not torch.equal(ours.batch["advantages"], ours.batch["returns"] * mask)  # the baseline did something
    del tensors["sum_pi_squared"]
    with pytest.raises(ValueError, match="did not get sum_pi_squared: set actor_rollout_ref.actor.calculate_sum"):
        _run("rlhf_ext_" + name, tensors, uid)


def test_the_two_differ_on_a_mask_with_holes():
    """tir aligns rows by generated token: with holes its baselines differ from the plain estimator's (so the
    test above tells the two names apart)."""
    tensors, uid = _batch(seed=7, with_is=False)
    tir = _run("rlhf_ext_tir_optimal_token_baseline", tensors, uid).batch["advantages"]
    plain = _run("rlhf_ext_optimal_token_baseline", tensors, uid).batch["advantages"]
    assert not torch.allclose(tir, plain)


@pytest.mark.parametrize("name", ["tir_optimal_token_baseline", "optimal_token_baseline"])
def test_start_up_asks_for_sum_pi_squared_by_name(name):
    with pytest.raises(ValueError, match=f"rlhf_ext_{name}: the token-level estimator needs each token's "
                                         "sum_pi_squared"):
        validate([f"algorithm.adv_estimator=rlhf_ext_{name}"])
    validate([f"algorithm.adv_estimator=rlhf_ext_{name}", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"])
