"""verl: the start-up checks (gdpo, optimal_token_baseline, k3_bias_corrected, the loss-mask
variables) through verl's real ``validate_config`` on its real Hydra config, the off-policy sequence
mask through verl's ``get_policy_loss_fn``, and token-sum against verl's ``agg_loss`` (.venv-verl)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import verl  # noqa: F401  (activates the plugin, as in a run)
from verl.trainer.ppo import core_algos

from rlhf_ext.algorithms import aggregate_loss, off_policy_sequence_mask
from rlhf_ext.patches.verl import startup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_verl_examples import compose, overrides  # noqa: E402
from test_verl_losses_parity import _Accelerator  # noqa: E402


def validate(extra, monkeypatch=None, env=None):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as verl_config

    cfg = compose(overrides("grpo.sh") + extra)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    verl_config.validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_the_grpo_example_passes_verls_validation_with_the_checks_on():
    from verl.utils import config as verl_config

    assert getattr(verl_config.validate_config, "rlhf_ext_patched", False)
    validate([])
    validate(["algorithm.adv_estimator=rlhf_ext_gpg"])


@pytest.mark.parametrize("extra, env, message", [
    (["algorithm.adv_estimator=rlhf_ext_gdpo"], {}, "use algorithm.adv_estimator=gdpo with algorithm.gdpo_reward_keys"),
    (["algorithm.adv_estimator=rlhf_ext_optimal_token_baseline"], {}, "calculate_sum_pi_squared=True"),
    (["algorithm.adv_estimator=rlhf_ext_nosuch"], {}, "is not an rlhf_ext estimator"),
    (["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=k3_bias_corrected"], {},
     "without the old log-probs"),
    ([], {startup.TOP_ENTROPY_ENV: "0.2"}, "without the token entropy"),
    ([], {startup.TRUNCATED_ENV: "1"}, "receives no truncation flag"),
    ([], {startup.OFF_POLICY_ENV: "-1"}, "must be a finite number >= 0"),
    ([], {startup.OFF_POLICY_ENV: "0.5"}, "use rlhf_ext_ppo or unset it"),
])
def test_runs_rlhf_ext_cannot_serve_stop_in_validate_config(monkeypatch, extra, env, message):
    with pytest.raises(ValueError, match="this verl run cannot start") as exc:
        validate(extra, monkeypatch, env)
    assert message in str(exc.value)


def test_optimal_token_baseline_with_sum_pi_squared_passes():
    validate(["algorithm.adv_estimator=rlhf_ext_optimal_token_baseline",
              "actor_rollout_ref.actor.calculate_sum_pi_squared=True"])


@pytest.mark.parametrize("with_is", [False, True])
def test_rlhf_ext_optimal_token_baseline_through_compute_advantage_equals_verls(with_is):
    """verl's compute_advantage (patched) hands rlhf_ext's estimator what it hands its own: same advantages."""
    import numpy as np
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    assert getattr(compute_advantage, "rlhf_ext_patched", False)  # importers by name get the patched function
    g = torch.Generator().manual_seed(4)
    B, T = 8, 6
    mask = (torch.arange(T)[None, :] < torch.tensor([6, 2, 4, 6, 3, 5, 1, 6])[:, None]).float()
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), mask.sum(-1).long() - 1] = torch.randint(0, 2, (B,), generator=g).float()
    tensors = {"token_level_rewards": rewards, "response_mask": mask,
               "old_log_probs": -torch.rand(B, T, generator=g) * 3, "sum_pi_squared": torch.rand(B, T, generator=g)}
    if with_is:
        tensors["rollout_is_weights"] = torch.rand(B, T, generator=g) + 0.5
    uid = np.array(["a", "b", "a", "b", "a", "b", "a", "b"], dtype=object)

    def run(name):
        data = DataProto.from_dict(tensors={k: v.clone() for k, v in tensors.items()}, non_tensors={"uid": uid})
        return ray_trainer.compute_advantage(data, adv_estimator=name, config=OmegaConf.create({}))

    ours, ref = run("rlhf_ext_optimal_token_baseline"), run(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
    torch.testing.assert_close(ours.batch["advantages"], ref.batch["advantages"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.batch["returns"], ref.batch["returns"])
    assert not torch.equal(ours.batch["advantages"], ours.batch["returns"] * mask)  # the baseline did something
    del tensors["sum_pi_squared"]
    with pytest.raises(ValueError, match="did not get sum_pi_squared: set actor_rollout_ref.actor.calculate_sum"):
        run("rlhf_ext_optimal_token_baseline")


def test_off_policy_mask_with_an_rlhf_ext_loss_passes(monkeypatch):
    validate(["actor_rollout_ref.actor.policy_loss.loss_mode=rlhf_ext_ppo"], monkeypatch,
             {startup.OFF_POLICY_ENV: "0.5"})


def test_main_ppo_uses_the_checked_validate_config():
    from verl.trainer import main_ppo

    assert getattr(main_ppo.validate_config, "rlhf_ext_patched", False)


def test_a_bad_mask_variable_stops_a_worker_importing_core_algos():
    code = "import verl\nfrom verl.trainer.ppo import core_algos\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_VERL")}
    env[startup.TOP_ENTROPY_ENV] = "0.2"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)
    assert proc.returncode != 0
    assert "without the token entropy" in proc.stderr


def _batch(seed=0, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 2, 6, 4])[:, None]
    old = -torch.rand(B, T, generator=g) * 2
    lp = old + torch.randn(B, T, generator=g) * 0.1
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    adv[0], lp[0] = -1.0, old[0] - 2.0  # negative advantage, far off-policy: dropped
    adv[1], lp[1] = 1.0, old[1] - 2.0   # far off-policy but positive: kept
    return mask, old, lp, adv


def _actor_config(mode):
    from omegaconf import OmegaConf

    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                             "policy_loss": {"loss_mode": "rlhf_ext_ppo"}, "global_batch_info": {},
                             "loss_scale_factor": None, "loss_agg_mode": mode})


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
def test_off_policy_mask_equals_verls_vanilla_loss_on_the_kept_sequences(monkeypatch, mode):
    """verl's vanilla PPO with the dropped sequences' advantages zeroed is the masked loss (PPO is A times a
    factor per token), counts from the full mask: value and gradient."""
    monkeypatch.setenv(startup.OFF_POLICY_ENV, "0.5")
    mask, old, lp, adv = _batch()
    keep = off_policy_sequence_mask(adv[:, 0], lp, old, mask, 0.5)
    assert keep.tolist() == [False, True, True, True, True, True]
    cfg = _actor_config(mode)
    ours_lp = lp.clone().requires_grad_()
    ours, _ = core_algos.get_policy_loss_fn("rlhf_ext_ppo")(old, ours_lp, adv, mask, mode, config=cfg)
    ref_lp = lp.clone().requires_grad_()
    ref, _ = core_algos.get_policy_loss_fn("vanilla")(old, ref_lp, adv * keep[:, None], mask, mode, config=cfg)
    torch.testing.assert_close(ours, ref)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours_lp.grad, ref_lp.grad)
    assert torch.count_nonzero(ours_lp.grad[0]) == 0 and torch.count_nonzero(ours_lp.grad[1]) > 0
    monkeypatch.delenv(startup.OFF_POLICY_ENV)
    unmasked, _ = core_algos.get_policy_loss_fn("rlhf_ext_ppo")(old, lp, adv, mask, mode, config=cfg)
    assert not torch.allclose(unmasked, ours)


@pytest.mark.parametrize("dp_size", [1, 2])
def test_token_sum_equals_verls_agg_loss(dp_size):
    """rlhf_ext's token-sum (which OpenRLHF's ppo/gspo use through the plugin, times the DP size as there)
    is verl's token-sum."""
    g = torch.Generator().manual_seed(3)
    loss = torch.randn(5, 6, generator=g)
    mask = torch.arange(6)[None, :] < torch.tensor([6, 2, 4, 1, 5])[:, None]
    ref = core_algos.agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode="token-sum", dp_size=dp_size,
                              batch_num_tokens=mask.sum(), global_batch_size=5 * dp_size)
    torch.testing.assert_close(aggregate_loss(loss, mask, "token-sum") * dp_size, ref)


# ---- the convention the hosts implement, against TRL 1.16's GRPOTrainer._compute_loss ----------

@pytest.mark.parametrize("loss_type, level", [("dapo", "token"), ("grpo", "token")])
def test_masks_and_bias_corrected_kl_compose_as_trls_compute_loss(loss_type, level):
    """Policy loss x entropy mask x off-policy mask, counts from the full mask, plus beta x the
    bias-corrected k3 over the full mask: what the OpenRLHF and MindSpeed-RL glue compute (their own
    tests: host = this composition) equals TRL's loss, value and gradient."""
    from collections import defaultdict
    from types import SimpleNamespace

    from trl.trainer.grpo_trainer import GRPOTrainer

    from rlhf_ext.algorithms import get_policy_loss, k3_bias_corrected, top_entropy_mask

    g = torch.Generator().manual_seed(11)
    B, T = 6, 7
    mask = (torch.arange(T)[None, :] < torch.tensor([7, 3, 5, 2, 6, 4])[:, None]).to(torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    new = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    new[0] = old[0] - 1.5  # far off-policy
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64)
    adv[0] = -1.0
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    q, delta, beta = 0.4, 0.5, 0.1

    lp = new.clone().requires_grad_(True)

    one_rank = SimpleNamespace(accelerator=SimpleNamespace(pad_across_processes=lambda x, dim, pad_index: x,
                                                           gather=lambda x: x))
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, entropy, None),
        aux_loss_enabled=False, top_entropy_quantile=q, off_policy_mask_threshold=delta,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28,
        use_vllm=False, model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(), _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        get_high_entropy_mask=lambda e, m, t: GRPOTrainer.get_high_entropy_mask(one_rank, e, m, t),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        args=SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=True),
    )
    batch = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv[:, 0], "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    ref_loss = GRPOTrainer._compute_loss(trainer, None, batch)
    ref_grad = torch.autograd.grad(ref_loss, lp)[0]

    maskb = mask.bool()
    ours_lp = new.clone().requires_grad_(True)
    keep = top_entropy_mask(entropy, maskb, q)
    keep = keep & off_policy_sequence_mask(adv[:, 0], ours_lp, old, maskb, delta)[:, None]
    assert not keep[0].any() and 0 < int(keep.sum()) < int(maskb.sum())
    per_token, _ = get_policy_loss("ppo")(ours_lp, old, adv.expand(B, T), maskb, eps_low=0.2, eps_high=0.28)
    mode = "token-mean" if loss_type == "dapo" else "seq-mean-token-mean"
    ours = aggregate_loss(per_token * keep + beta * k3_bias_corrected(ours_lp, ref, old), maskb, mode)
    torch.testing.assert_close(ours.detach(), ref_loss.detach())
    torch.testing.assert_close(torch.autograd.grad(ours, ours_lp)[0], ref_grad)
