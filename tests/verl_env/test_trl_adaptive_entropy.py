"""The adaptive entropy coefficient (rlhf_ext.algorithms.entropy_control, Skywork-OR1 arXiv 2505.22312) against
TRL 1.16's own controller: ``GRPOTrainer._compute_loss`` with ``use_adaptive_entropy=True`` run for several
optimizer steps (its state on a stand-in trainer, its model forward replaced by given log-probs and
entropies): the coefficient TRL applies and keeps at every step, the loss value and its gradient with respect
to the entropies equal rlhf_ext's controller and ``L = L_policy - c * mean H``."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import aggregate_loss, get_policy_loss
from rlhf_ext.algorithms.entropy_control import AdaptiveEntropyCoef

from test_verl_losses_parity import _Accelerator  # noqa: E402


@pytest.mark.parametrize("coef0, target, delta, hi", [(0.0, 0.5, 0.01, 1.0), (0.03, 0.9, 0.02, 0.05)])
def test_coefficient_loss_and_gradient_equal_trls_adaptive_entropy(coef0, target, delta, hi):
    from trl.trainer.grpo_trainer import GRPOTrainer

    B, T = 4, 6
    g = torch.Generator().manual_seed(3)
    mask = (torch.arange(T)[None, :] < torch.tensor([6, 3, 5, 2])[:, None]).to(torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    trainer = SimpleNamespace(
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=0.0, loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2,
        use_vllm=False, model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(), _metrics=defaultdict(lambda: defaultdict(list)),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        entropy_coef=coef0, use_adaptive_entropy=True, _entropy_bonus_enabled=True,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        args=SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=False, entropy_target=target,
                             entropy_coef_delta=delta, entropy_coef_min=0.0, entropy_coef_max=hi),
    )
    ours = AdaptiveEntropyCoef(coef=coef0, target=target, delta=delta, coef_min=0.0, coef_max=hi)
    applied_seen = []
    # entropies falling from above the target to below it and back: every branch of the controller
    for step, level in enumerate([1.2, 0.8, 0.4, 0.3, 0.2, 0.6, 1.5, 0.1]):
        entropy = (torch.rand(B, T, generator=g, dtype=torch.float64) * 0.2 + level - 0.1).requires_grad_()
        new = (old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
        trainer._get_per_token_logps_and_entropies = lambda *a, new=new, entropy=entropy, **k: (new, entropy, None)
        batch = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
                 "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
                 "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
        trl_loss = GRPOTrainer._compute_loss(trainer, None, batch)
        trl_grad = torch.autograd.grad(trl_loss, entropy)[0]

        applied = ours.applied()
        applied_seen.append(applied)
        maskb = mask.bool()
        policy, _ = get_policy_loss("ppo")(new.detach(), old, adv[:, None].expand(B, T), maskb, clip_ratio_low=0.2)
        ent = entropy.detach().clone().requires_grad_()
        mean_entropy = aggregate_loss(ent, maskb, "token-mean")
        loss = aggregate_loss(policy, maskb, "token-mean") - applied * mean_entropy
        torch.testing.assert_close(loss.detach(), trl_loss.detach())
        torch.testing.assert_close(torch.autograd.grad(loss, ent)[0], trl_grad)
        ours.update(float(mean_entropy))
        assert ours.coef == pytest.approx(trainer.entropy_coef, abs=1e-12), step
        assert ours.last_entropy == pytest.approx(trainer._last_world_entropy, abs=1e-12)
    assert any(a > 0 for a in applied_seen) and any(a == 0 for a in applied_seen)
    assert math.isfinite(ours.coef) and 0 <= ours.coef <= hi
