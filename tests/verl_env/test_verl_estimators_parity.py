"""Issue 22's estimators and KL terms against verl 0.9.1's own functions and TRL 1.16 (in .venv-verl).

Each rlhf_ext estimator runs through verl's ``compute_advantage`` dispatch as ``rlhf_ext_<name>``
and through the framework-free function, on random groups with rows interleaved by ``uid``, and is
compared with verl's implementation of the same algorithm called directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import verl  # noqa: F401  (loads the verl.plugins entry points, rlhf_ext's included)
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from rlhf_ext.algorithms import aggregate_loss, gpg, k3_bias_corrected, k3_plus, kl_estimate, opo, passk_best

P, N, T = 5, 4, 7


def _random_batch(seed: int, binary: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(P * N, generator=g) > 0.5).float() if binary else torch.randn(P * N, generator=g)
    scores[:N] = 1.0  # one all-equal group (all correct)
    lengths = torch.randint(1, T + 1, (P * N,), generator=g)
    perm = torch.randperm(P * N, generator=g)  # rows of a group are scattered over the batch
    uids = np.array([f"p{i // N}" for i in range(P * N)], dtype=object)[perm.numpy()]
    scores, lengths = scores[perm], lengths[perm]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(P * N, T)
    rewards[torch.arange(P * N), lengths - 1] = scores
    return rewards, mask, uids, scores, lengths


def _through_verl(name: str, rewards, mask, uids, **options) -> torch.Tensor:
    config = OmegaConf.create({"adv_estimator": name, "norm_adv_by_std_in_grpo": True,
                               **({"rlhf_ext": options} if options else {})})
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards.clone(), "response_mask": mask.clone()},
                               non_tensors={"uid": uids})
    return compute_advantage(data, adv_estimator=name, config=config).batch["advantages"]


def _grouped(values, uids):
    order = np.argsort(uids, kind="stable")
    return values[torch.as_tensor(order)].reshape(P, N), torch.as_tensor(order)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("binary", [False, True])
def test_gpg_with_verls_count_equals_verl(seed, binary):
    rewards, mask, uids, scores, _ = _random_batch(seed, binary)
    ref, _ = core_algos.compute_gpg_outcome_advantage(rewards.clone(), mask, uids)
    ours = _through_verl("rlhf_ext_gpg", rewards, mask, uids, alpha_count="nonzero_reward")
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grouped, order = _grouped(scores, uids)
    direct = gpg(grouped, alpha_count="nonzero_reward").reshape(-1)
    torch.testing.assert_close(ours[order, 0], direct, rtol=1e-5, atol=1e-6)


def test_gpg_paper_count_differs_from_verl_only_by_all_correct_groups(monkeypatch):
    rewards, mask, uids, scores, _ = _random_batch(0, binary=True)
    ref, _ = core_algos.compute_gpg_outcome_advantage(rewards.clone(), mask, uids)
    # by default rlhf_ext_gpg on verl counts as verl does (issue 42)
    torch.testing.assert_close(_through_verl("rlhf_ext_gpg", rewards, mask, uids), ref, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("RLHF_EXT_VERL_RLHF_EXT_DEFAULTS", "1")  # the paper's count, rlhf_ext's default
    ours = _through_verl("rlhf_ext_gpg", rewards, mask, uids)
    assert not torch.allclose(ours, ref)
    # same direction, different alpha: B / #nonzero rewards (verl) vs B / #samples in varied groups
    grouped, _ = _grouped(scores, uids)
    varied = int(((grouped.max(1).values != grouped.min(1).values)[:, None].expand_as(grouped)).sum())
    nonzero = int((scores != 0).sum())
    torch.testing.assert_close(ours * varied, ref * nonzero, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_opo_equals_verl(seed):
    rewards, mask, uids, scores, lengths = _random_batch(seed)
    ref, _ = core_algos.compute_opo_outcome_advantage(rewards.clone(), mask, uids)
    ours = _through_verl("rlhf_ext_opo", rewards, mask, uids)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grouped, order = _grouped(scores, uids)
    direct = opo(grouped, lengths=_grouped(lengths.float(), uids)[0]).reshape(-1)
    torch.testing.assert_close(ours[order, 0], direct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_passk_best_equals_verls_grpo_passk(seed, norm):
    rewards, mask, uids, scores, _ = _random_batch(seed)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": norm})
    ref, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards.clone(), mask, uids, config=config)
    ours = _through_verl("rlhf_ext_passk_best", rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grouped, order = _grouped(scores, uids)
    torch.testing.assert_close(ours[order, 0],
                               passk_best(grouped, norm_adv_by_std_in_grpo=norm).reshape(-1), rtol=1e-5, atol=1e-6)


def test_gdpo_through_verl_names_what_is_missing():
    rewards, mask, uids, _, _ = _random_batch(0)
    with pytest.raises(ValueError, match="algorithm.adv_estimator=gdpo with algorithm.gdpo_reward_keys"):
        _through_verl("rlhf_ext_gdpo", rewards, mask, uids)


def test_gdpo_function_equals_verls_per_component_grpo_before_its_whitening():
    from rlhf_ext.algorithms import gdpo

    g = torch.Generator().manual_seed(3)
    comps = {"acc": (torch.rand(P, N, generator=g) > 0.5).float(), "fmt": torch.rand(P, N, generator=g)}
    weights = {"acc": 1.0, "fmt": 0.5}
    uids = np.array([f"p{i // N}" for i in range(P * N)], dtype=object)
    mask = torch.ones(P * N, 1)
    ref = sum(w * core_algos.compute_grpo_outcome_advantage(comps[k].reshape(-1, 1), mask, uids)[0]
              for k, w in weights.items()).reshape(P, N)
    torch.testing.assert_close(gdpo(torch.zeros(P, N), components=comps, weights=weights), ref,
                               rtol=1e-5, atol=1e-6)


def test_token_sum_equals_verls_agg_loss():
    g = torch.Generator().manual_seed(4)
    loss = torch.randn(6, T, generator=g)
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (6, 1), generator=g)).float()
    loss_nan = torch.where(mask.bool(), loss, torch.full_like(loss, float("nan")))
    ref = core_algos.agg_loss(loss, mask, "token-sum")
    torch.testing.assert_close(aggregate_loss(loss_nan, mask, "token-sum"), ref)


@pytest.mark.parametrize("verl_name, ours", [("abs", "abs"), ("k3+", "k3+"), ("low_var_kl", "k3")])
def test_kl_estimators_equal_verls_kl_penalty_in_value_and_gradient(verl_name, ours):
    g = torch.Generator().manual_seed(5)
    lp = (torch.randn(4, T, generator=g) * 3).requires_grad_()
    with torch.no_grad():
        lp[0, :2] = torch.tensor([-40.0, 40.0])  # beyond verl's +-20 log-ratio clamp
    ref_lp = torch.randn(4, T, generator=g) * 3
    lp2 = lp.detach().clone().requires_grad_()
    ref = core_algos.kl_penalty(lp, ref_lp, verl_name)
    # verl clamps only k3's value (log ratio to +-20, value to [-10, 10]); abs is not clamped
    plain = ours == "abs"
    value, _ = kl_estimate(lp2, ref_lp, ours, clip=None if plain else (-10.0, 10.0),
                           log_ratio_clip=None if plain else 20.0)
    torch.testing.assert_close(value, ref)
    w = torch.randn(4, T, generator=g)
    (ref * w).sum().backward()
    (value * w).sum().backward()
    torch.testing.assert_close(lp2.grad, lp.grad)


def test_k3_plus_gradient_is_k2s():
    lp = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    ref_lp = torch.tensor([0.0, 0.5, -1.0])
    k3_plus(lp, ref_lp).sum().backward()
    torch.testing.assert_close(lp.grad, (lp - ref_lp).detach())


def test_k3_bias_corrected_equals_trl_use_bias_correction_kl():
    # TRL 1.16 GRPOTrainer._compute_loss: per_token_kl = (exp(ref - lp) - (ref - lp) - 1) * exp(lp - old)
    g = torch.Generator().manual_seed(6)
    lp = torch.randn(3, T, generator=g).requires_grad_()
    ref_lp, old_lp = torch.randn(3, T, generator=g), torch.randn(3, T, generator=g)
    lp2 = lp.detach().clone().requires_grad_()
    trl = (torch.exp(ref_lp - lp) - (ref_lp - lp) - 1) * torch.exp(lp - old_lp)
    ours = k3_bias_corrected(lp2, ref_lp, old_lp)
    torch.testing.assert_close(ours, trl)
    trl.sum().backward()
    ours.sum().backward()
    torch.testing.assert_close(lp2.grad, lp.grad)


def test_off_policy_sequence_mask_equals_trl():
    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlhf_ext.algorithms import off_policy_sequence_mask

    g = torch.Generator().manual_seed(7)
    B = 12
    lp, sample_lp = -torch.rand(B, T, generator=g) * 2, -torch.rand(B, T, generator=g) * 2
    sample_lp[0, 0] = float("nan")  # a token vLLM could not score
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1), generator=g)).float()
    adv = torch.randn(B, 1, generator=g)
    for threshold in (0.0, 0.1, 0.5):
        ref = GRPOTrainer.get_off_policy_mask(adv, lp, sample_lp, mask, threshold)
        ours = off_policy_sequence_mask(adv, lp, sample_lp, mask, threshold)
        assert torch.equal(ours.float(), ref.reshape(-1))


def test_top_entropy_mask_equals_trl():
    from types import SimpleNamespace

    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlhf_ext.algorithms import top_entropy_mask

    one_rank = SimpleNamespace(accelerator=SimpleNamespace(pad_across_processes=lambda x, dim, pad_index: x,
                                                           gather=lambda x: x))
    g = torch.Generator().manual_seed(8)
    ent = torch.rand(6, T, generator=g) * 3
    mask = (torch.arange(T)[None, :] < torch.randint(1, T + 1, (6, 1), generator=g)).float()
    for q in (0.2, 0.5, 1.0):
        # TRL's trainer calls get_high_entropy_mask(entropies, mask, 1 - top_entropy_quantile)
        ref = GRPOTrainer.get_high_entropy_mask(one_rank, ent, mask, 1 - q)
        padded = torch.where(mask.bool(), ent, torch.full_like(ent, float("nan")))
        assert torch.equal(top_entropy_mask(padded, mask, q), ref)


@pytest.mark.parametrize("with_is", [False, True])
def test_optimal_token_baseline_equals_verl(with_is):
    from rlhf_ext.algorithms import optimal_token_baseline

    rewards, mask, uids, _, _ = _random_batch(9)
    g = torch.Generator().manual_seed(10)
    old_lp = -torch.rand(P * N, T, generator=g) * 3
    spi2 = torch.rand(P * N, T, generator=g) * 0.5
    isw = torch.rand(P * N, T, generator=g) + 0.5 if with_is else None
    ref_adv, ref_ret = core_algos.compute_optimal_token_baseline_advantage(
        rewards, mask, uids, old_lp, spi2, rollout_is_weights=isw)
    # padding holds NaN in the log-probs: masked positions must not matter
    old_nan = torch.where(mask.bool(), old_lp, torch.full_like(old_lp, float("nan")))
    adv, ret = optimal_token_baseline(rewards, mask, uids, old_nan, spi2, is_weights=isw)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ret, ref_ret)
    assert not torch.equal(adv, ret * mask)  # the baseline did something
