"""Parity of rlhf_ext's newer policy losses with their reference implementations (runs in .venv-verl).

* verl 0.9.1: each ``rlhf_ext_<name>`` goes through verl's own dispatch (``get_policy_loss_fn``)
  next to verl's loss of the same algorithm, on random inputs, in every aggregation mode verl has:
  the loss value and its gradient with respect to the log-probs. CISPO and DPPO are written
  ``-sg(w) A exp(log pi - sg(log pi))`` (value ``-w A``) where verl writes ``-sg(w) A log pi``:
  for them the gradients are compared, and the values against the formula.
* TRL 1.16 (luspo and vespo exist only there; sapo and cispo too): ``GRPOTrainer._compute_loss``
  itself, called with a stand-in for the trainer object (the attributes that method reads, and a
  forward pass that returns the test's log-probs), against the rlhf_ext loss reduced as TRL reduces
  that loss type.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import verl  # noqa: F401  (loads the verl.plugins entry points, rlhf_ext's included)
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from rlhf_ext.algorithms import aggregate_loss, get_policy_loss

MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
B, T = 6, 7
LENGTHS = torch.tensor([7, 3, 5, 1, 6, 4])


def _inputs(seed=0, spread=0.3, adv_scale=1.0, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < LENGTHS[:, None]).to(torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    new = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    if token_adv:
        adv = adv_scale * torch.randn(B, T, generator=g, dtype=torch.float64)
    else:
        adv = (adv_scale * torch.randn(B, 1, generator=g, dtype=torch.float64)).expand(B, T).clone()
    return old, new, adv, mask


def _actor(loss_mode, policy_loss=None, **kw) -> ActorConfig:
    kw.setdefault("clip_ratio", 0.2)
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_torch_compile=False,
                      policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy_loss or {})), **kw)
    return cfg


def _run(name, old, new, adv, mask, mode, cfg, seed=None):
    lp = new.clone().requires_grad_(True)
    if seed is not None:
        torch.manual_seed(seed)
    loss, metrics = core_algos.get_policy_loss_fn(name)(old, lp, adv, mask, mode, cfg)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def _pair(verl_name, ours, mode, inputs, seed=None, **cfg):
    old, new, adv, mask = inputs
    ref = _run(verl_name, old, new, adv, mask, mode, _actor(verl_name, **cfg), seed)
    mine = _run("rlhf_ext_" + ours, old, new, adv, mask, mode, _actor("rlhf_ext_" + ours, **cfg), seed)
    return ref, mine


def _close(a, b, tol=1e-9):
    assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=tol, rtol=1e-7), (a, b)


# ---- verl: value and gradient in every mode ---------------------------------------------------

VALUE_AND_GRAD = {
    # ours, verl's, config (clip ranges that bind on these inputs)
    "clip_cov": ("clip_cov", dict(clip_ratio_low=0.1, clip_ratio_high=0.15,
                                  policy_loss=dict(clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=5.0))),
    "kl_cov": ("kl_cov", dict(policy_loss=dict(kl_cov_ratio=0.15, ppo_kl_coef=0.7))),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ours", sorted(VALUE_AND_GRAD))
@pytest.mark.parametrize("token_adv", [False, True])
def test_value_and_gradient_equal_verls(ours, mode, token_adv):
    verl_name, cfg = VALUE_AND_GRAD[ours]
    inputs = _inputs(seed=1, spread=0.4, adv_scale=2.0, token_adv=token_adv)
    (ref_loss, ref_grad, _), (loss, grad, metrics) = _pair(verl_name, ours, mode, inputs, seed=7, **cfg)
    _close(loss, ref_loss)
    _close(grad, ref_grad)
    frac = metrics["actor/cov_clip_frac" if ours == "clip_cov" else "actor/kl_cov_frac"]
    assert 0 < frac < 0.5  # the selection did something


def test_clip_cov_seed_argument_picks_verls_tokens():
    old, new, adv, mask = _inputs(seed=1, spread=0.4, adv_scale=2.0)
    cfg = dict(clip_ratio_low=0.1, clip_ratio_high=0.15,
               policy_loss=dict(clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=5.0))
    ref_loss, ref_grad, _ = _run("clip_cov", old, new, adv, mask, "token-sum", _actor("clip_cov", **cfg), seed=11)
    lp = new.clone().requires_grad_(True)
    per_token, _ = get_policy_loss("clip_cov")(lp, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.15,
                                               clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=5.0, seed=11)
    _close(per_token.sum(), ref_loss)
    _close(torch.autograd.grad(per_token.sum(), lp)[0], ref_grad)
    # another seed picks other tokens
    other, _ = get_policy_loss("clip_cov")(new, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.15,
                                           clip_cov_ratio=0.2, clip_cov_lb=0.05, clip_cov_ub=5.0, seed=12)
    assert not torch.allclose(other, per_token.detach())


GRAD_ONLY = {
    "cispo": ("cispo", dict(clip_ratio_low=0.1, clip_ratio_high=0.15)),
    "dppo_tv": ("dppo_tv", dict(clip_ratio_low=0.04, clip_ratio_high=0.06, clip_ratio_c=1.3)),
    "dppo_kl": ("dppo_kl", dict(clip_ratio_low=0.01, clip_ratio_high=0.02, clip_ratio_c=1.3)),
}


def _weighted_value(ours, inputs, mode, cfg):
    """The value rlhf_ext's form has: verl's loss with ``log pi`` replaced by 1 (hand formula)."""
    old, new, adv, mask = inputs
    ratio = torch.exp((new - old).clamp(-20, 20))
    if ours == "cispo":
        w = ratio.clamp(1 - cfg["clip_ratio_low"], 1 + cfg["clip_ratio_high"])
    else:
        p, p_old = new.exp(), old.exp()
        if ours == "dppo_tv":
            valid = torch.where(adv > 0, p - p_old <= cfg["clip_ratio_high"], p - p_old >= -cfg["clip_ratio_low"])
        else:
            bkl = p_old * (old - new) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
            valid = torch.where(adv > 0, (bkl <= cfg["clip_ratio_high"]) | (p <= p_old),
                                (bkl <= cfg["clip_ratio_low"]) | (p >= p_old))
        assert 0 < (~valid & mask.bool()).sum() < mask.sum()  # the region binds on some tokens
        w = ratio.clamp(max=cfg["clip_ratio_c"]) * valid
    return core_algos.agg_loss(-w * adv, mask, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ours", sorted(GRAD_ONLY))
def test_gradient_equals_verls_and_value_is_the_weighted_advantage(ours, mode):
    verl_name, cfg = GRAD_ONLY[ours]
    inputs = _inputs(seed=2, spread=0.5, token_adv=True)
    (_, ref_grad, _), (loss, grad, _) = _pair(verl_name, ours, mode, inputs, **cfg)
    _close(grad, ref_grad)
    _close(loss, _weighted_value(ours, inputs, mode, cfg))
    assert grad.abs().sum() > 0


# verl's sapo always reduces with seq-mean-token-mean, geo_mean always averages sequence losses:
# ours equals theirs in that mode, and in the other modes is the same per-token loss reduced as asked.

def _sapo_per_token(inputs, tau_pos, tau_neg):
    old, new, adv, mask = inputs
    ratio = torch.exp((new - old).clamp(-20, 20))
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=adv.dtype), torch.tensor(tau_neg, dtype=adv.dtype))
    return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv


@pytest.mark.parametrize("mode", MODES)
def test_sapo_matches_verl_in_its_mode_and_honours_the_others(mode, monkeypatch):
    inputs = _inputs(seed=3, spread=0.6, token_adv=True)
    cfg = dict(tau_pos=1.3, tau_neg=2.1)
    (ref_loss, ref_grad, _), (loss, grad, _) = _pair("sapo", "sapo", mode, inputs, **cfg)
    _close(loss, ref_loss)  # by default verl's numbers in every mode (issue 42)
    _close(grad, ref_grad)
    monkeypatch.setenv("RLHF_EXT_VERL_RLHF_EXT_DEFAULTS", "1")  # rlhf_ext's: loss_agg_mode honoured
    (ref_loss, ref_grad, _), (loss, grad, _) = _pair("sapo", "sapo", mode, inputs, **cfg)
    if mode == "seq-mean-token-mean":
        _close(loss, ref_loss)
        _close(grad, ref_grad)
    else:
        expected = core_algos.agg_loss(_sapo_per_token(inputs, 1.3, 2.1), inputs[3], mode)
        _close(loss, expected)
        # verl ignored the mode: its value is the seq-mean-token-mean one
        _close(ref_loss, core_algos.agg_loss(_sapo_per_token(inputs, 1.3, 2.1), inputs[3], "seq-mean-token-mean"))


@pytest.mark.parametrize("verl_name", ["geo_mean"])
@pytest.mark.parametrize("ours", ["gmpo", "geo_mean"])
def test_gmpo_matches_verls_geo_mean(ours, verl_name, monkeypatch):
    inputs = _inputs(seed=4, spread=0.5, token_adv=False)
    cfg = dict(clip_ratio_low=0.1, clip_ratio_high=0.15)
    for mode in MODES:  # by default verl's numbers in every mode (issue 42)
        (ref_loss, ref_grad, _), (loss, grad, _) = _pair(verl_name, ours, mode, inputs, **cfg)
        _close(loss, ref_loss)
        _close(grad, ref_grad)
    monkeypatch.setenv("RLHF_EXT_VERL_RLHF_EXT_DEFAULTS", "1")  # rlhf_ext's: loss_agg_mode honoured
    for mode in MODES:
        (ref_loss, ref_grad, _), (loss, grad, metrics) = _pair(verl_name, ours, mode, inputs, **cfg)
        if mode == "seq-mean-token-mean":
            _close(loss, ref_loss)
            _close(grad, ref_grad)
            assert metrics["actor/clip_frac_high"] + metrics["actor/clip_frac_low"] > 0
        else:
            old, new, adv, mask = inputs
            per_token, _ = get_policy_loss("gmpo")(new, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.15)
            _close(loss, core_algos.agg_loss(per_token, mask, mode))


def test_gmpo_token_level_advantages_match_verl():
    # verl clips each token by the sign of its own advantage and uses the sequence's mean advantage
    inputs = _inputs(seed=5, spread=0.5, token_adv=True)
    (ref_loss, ref_grad, _), (loss, grad, _) = _pair("geo_mean", "gmpo", "seq-mean-token-mean", inputs,
                                                      clip_ratio_low=0.1, clip_ratio_high=0.15)
    _close(loss, ref_loss)
    _close(grad, ref_grad)


def test_verl_config_keys_reach_the_losses():
    from rlhf_ext.patches.verl.policy_loss import loss_options

    cfg = _actor("rlhf_ext_clip_cov", clip_ratio_low=0.1, clip_ratio_high=0.3, tau_pos=1.5,
                 policy_loss=dict(clip_cov_ratio=0.01, clip_cov_lb=2.0, clip_cov_ub=4.0, kl_cov_ratio=0.05))
    assert loss_options(cfg, get_policy_loss("clip_cov")) == dict(
        clip_ratio_low=0.1, clip_ratio_high=0.3, clip_cov_ratio=0.01, clip_cov_lb=2.0, clip_cov_ub=4.0)
    assert loss_options(cfg, get_policy_loss("sapo")) == dict(tau_pos=1.5, tau_neg=1.05)
    assert loss_options(cfg, get_policy_loss("dppo_tv"))["clip_ratio_c"] == 3.0  # verl's ActorConfig default
    assert loss_options(cfg, get_policy_loss("kl_cov")) == dict(kl_cov_ratio=0.05, ppo_kl_coef=0.1)


# ---- TRL 1.16: GRPOTrainer._compute_loss -------------------------------------------------------

class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _trl_loss(loss_type, inputs, level="token", epsilon_low=0.2, epsilon_high=0.28, delta=None, **args):
    from trl.trainer.grpo_trainer import GRPOTrainer

    old, new, adv, mask = inputs
    lp = new.clone().requires_grad_(True)
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, torch.zeros_like(lp), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=0.0, loss_type=loss_type, epsilon_low=epsilon_low,
        epsilon_high=epsilon_high, use_vllm=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, accelerator=_Accelerator(), _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)), get_gamma_weights=GRPOTrainer.get_gamma_weights,
        args=SimpleNamespace(delta=delta, steps_per_generation=1, **args),  # delta: TRL's two-sided clip
    )
    batch = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv[:, 0], "old_per_token_logps": old, "num_items_in_batch": mask.sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, batch)
    return loss.detach(), torch.autograd.grad(loss, lp)[0]


def _ours(name, inputs, mode, **options):
    """rlhf_ext's framework function, reduced with ``mode`` by aggregate_loss."""
    old, new, adv, mask = inputs
    lp = new.clone().requires_grad_(True)
    per_token, _ = get_policy_loss(name)(lp, old, adv, mask, **options)
    loss = aggregate_loss(per_token, mask, mode)
    return loss.detach(), torch.autograd.grad(loss, lp)[0], per_token.detach()


def test_luspo_equals_trls_value_and_gradient():
    inputs = _inputs(seed=6, spread=0.15)
    ref_loss, ref_grad = _trl_loss("luspo", inputs, level="sequence", epsilon_low=0.02, epsilon_high=0.03)
    loss, grad, _ = _ours("luspo", inputs, "seq-mean-token-mean", clip_ratio_low=0.02, clip_ratio_high=0.03)
    _close(loss, ref_loss)
    _close(grad, ref_grad)
    # through verl's dispatch too (clip_ratio_low/high from the actor config)
    old, new, adv, mask = inputs
    v_loss, v_grad, _ = _run("rlhf_ext_luspo", old, new, adv, mask, "seq-mean-token-mean",
                             _actor("rlhf_ext_luspo", clip_ratio_low=0.02, clip_ratio_high=0.03))
    _close(v_loss, ref_loss)
    _close(v_grad, ref_grad)
    # the clip binds on some sequences, so the test could tell a wrong bound
    s = torch.exp(((new - old) * mask).sum(1) / mask.sum(1))
    assert ((s < 0.98) | (s > 1.03)).any() and ((s > 0.98) & (s < 1.03)).any()


@pytest.mark.parametrize("ks", [(2.0, 3.0, 3.0, 2.0), (1.0, 0.5, 4.0, 1.5)])
def test_vespo_equals_trls_gradient_and_weights(ks):
    k_pos, lam_pos, k_neg, lam_neg = ks
    from trl.trainer.grpo_trainer import GRPOTrainer

    inputs = _inputs(seed=7, spread=0.2)
    options = dict(vespo_k_pos=k_pos, vespo_lambda_pos=lam_pos, vespo_k_neg=k_neg, vespo_lambda_neg=lam_neg)
    _, ref_grad = _trl_loss("vespo", inputs, **options)
    loss, grad, per_token = _ours("vespo", inputs, "token-mean", **options)
    _close(grad, ref_grad)
    old, new, adv, mask = inputs
    phi = GRPOTrainer.get_gamma_weights(adv[:, :1], new - old, mask, None, k_pos=k_pos, lambda_pos=lam_pos,
                                        k_neg=k_neg, lambda_neg=lam_neg)
    _close(per_token, (-phi * adv) * mask)
    assert phi.std() > 0.05  # the weights differ between sequences
    if ks == (2.0, 3.0, 3.0, 2.0):  # TRL's defaults, the ones verl's dispatch uses (verl has no keys for them)
        _, v_grad, metrics = _run("rlhf_ext_vespo", old, new, adv, mask, "token-mean", _actor("rlhf_ext_vespo"))
        _close(v_grad, ref_grad)
        assert "actor/phi_mean" in metrics


def test_sapo_equals_trls_value_and_gradient():
    inputs = _inputs(seed=8, spread=0.6)
    ref_loss, ref_grad = _trl_loss("sapo", inputs, sapo_temperature_pos=1.2, sapo_temperature_neg=1.9)
    loss, grad, _ = _ours("sapo", inputs, "seq-mean-token-mean", tau_pos=1.2, tau_neg=1.9)
    _close(loss, ref_loss)
    _close(grad, ref_grad)


def test_cispo_equals_trls_gradient():
    # TRL caps the weight at epsilon_high itself and has no lower bound: clip_ratio_low None, high = cap - 1
    inputs = _inputs(seed=9, spread=0.6)
    _, ref_grad = _trl_loss("cispo", inputs, epsilon_high=1.25)
    _, grad, _ = _ours("cispo", inputs, "token-mean", clip_ratio_low=None, clip_ratio_high=0.25)
    _close(grad, ref_grad)
    old, new, _, mask = inputs
    assert ((torch.exp(new - old) > 1.25) & mask.bool()).any()
