"""rlhf_ext.algorithms.rollout_correction: hand-computed cases, invariants, and parity with OpenRLHF 0.11.2.

verl 0.9.1 parity is in tests/verl_env/test_verl_rollout_correction_parity.py (run by test_verl_env.py).
"""

import math

import pytest
import torch

from rlhf_ext.algorithms import (
    REJECTION_OPTIONS,
    RolloutCorrection,
    apply_rollout_correction,
    aggregate_loss,
    available_policy_losses,
    get_policy_loss,
    openrlhf_correction,
    rollout_correction,
)


def _batch(seed=0, b=6, t=9, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    train = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.01
    rollout = train + torch.randn(b, t, generator=g, dtype=torch.float64) * scale
    rollout = rollout.clamp(max=-1e-4)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return train, rollout, mask


ALL_CONFIGS = [
    RolloutCorrection(is_level="token", is_threshold=2.0),
    RolloutCorrection(is_level="sequence", is_threshold=2.0),
    RolloutCorrection(is_level="geometric", is_threshold=2.0),
    RolloutCorrection(is_level="token", is_threshold=(0.5, 2.0)),
    RolloutCorrection(is_level="sequence", is_threshold="0.5_2.0", batch_normalize=True),
    RolloutCorrection(is_level="token", is_threshold=2.0, is_clamp_low=0.5, batch_normalize=True),
] + [RolloutCorrection(is_level="token", rejection={opt: ((0.5, 2.0) if "k1" in opt or "ratio" in opt and "abs" not in opt else 0.01)})
     for opt in REJECTION_OPTIONS]


def test_hand_computed_token_tis_and_sequence_levels():
    train = torch.tensor([[math.log(0.5), math.log(0.9), 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[math.log(0.1), math.log(0.9), 5.0]], dtype=torch.float64)  # last: padding
    mask = torch.tensor([[True, True, False]])
    tok = rollout_correction(train, rollout, mask, RolloutCorrection(is_level="token", is_threshold=2.0))
    assert tok.weights.tolist() == [[2.0, 1.0, 0.0]]  # rho = 5 truncated at C = 2
    assert float(tok.metrics["is_truncated_fraction"]) == 0.5
    assert float(tok.metrics["is_fraction_high"]) == 0.5
    seq = rollout_correction(train, rollout, mask, RolloutCorrection(is_level="sequence", is_threshold=10.0))
    assert torch.allclose(seq.weights, torch.tensor([[5.0, 5.0, 0.0]], dtype=torch.float64))
    geo = rollout_correction(train, rollout, mask, RolloutCorrection(is_level="geometric", is_threshold=10.0))
    assert torch.allclose(geo.weights, torch.tensor([[math.sqrt(5.0), math.sqrt(5.0), 0.0]], dtype=torch.float64))
    band = rollout_correction(train, rollout, mask, RolloutCorrection(is_level="token", is_threshold=(0.5, 2.0)))
    assert band.weights.tolist() == [[0.0, 1.0, 0.0]]  # IcePop: outside the band -> 0
    # seq_max_abs_log_ratio: max |d| = log 5 > 1 -> the whole sequence rejected
    rej = rollout_correction(train, rollout, mask, RolloutCorrection(rejection={"seq_max_abs_log_ratio": 1.0}))
    assert rej.mask.tolist() == [[False, False, False]] and rej.weights.tolist() == [[0.0, 0.0, 0.0]]
    assert float(rej.metrics["rejected_fraction"]) == 1.0 and float(rej.metrics["seq_rejected_fraction"]) == 1.0
    ok = rollout_correction(train, rollout, mask, RolloutCorrection(rejection={"seq_max_abs_log_ratio": 2.0}))
    assert ok.mask.tolist() == [[True, True, False]] and float(ok.metrics["rejected_fraction"]) == 0.0
    # k1 = log(q/p): token 0 has -log 5; bounds (0.5, 2) in ratio space -> rejected
    k1 = rollout_correction(train, rollout, mask, RolloutCorrection(rejection={"token_k1": 2.0}))
    assert k1.mask.tolist() == [[False, True, False]]
    assert math.isclose(float(k1.metrics["k1_kl"]), -math.log(5) / 2)


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: f"{c.is_level}-{c.is_threshold}-{sorted(c.rejection)}")
def test_identical_log_probs_give_unit_weights_and_no_rejection(config):
    train, _, mask = _batch(1)
    train = torch.where(mask, train, torch.nan)  # padding holds NaN: must not reach anything
    res = rollout_correction(train, train.clone(), mask, config)
    assert torch.equal(res.weights, mask.to(res.weights.dtype))  # exactly 1 on tokens, 0 on padding
    assert torch.equal(res.mask, mask)
    for key, value in res.metrics.items():
        assert math.isfinite(float(value)), key
        if "fraction" in key:
            assert float(value) == 0.0, key


@pytest.mark.parametrize("name", sorted(available_policy_losses()))
@pytest.mark.parametrize("config", [ALL_CONFIGS[0], ALL_CONFIGS[1], ALL_CONFIGS[2], ALL_CONFIGS[3],
                                    RolloutCorrection(is_level="token", rejection={"seq_mean_k3": 0.01, "token_k1": 2.0})],
                         ids=["token", "sequence", "geometric", "icepop", "rejection"])
def test_every_loss_is_bit_identical_with_identical_log_probs(name, config):
    train, _, mask = _batch(2)
    g = torch.Generator().manual_seed(3)
    old = torch.where(mask, train, torch.nan)
    logp = (train + 0.05 * torch.randn(train.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(train.shape, generator=g, dtype=torch.float64)
    fn = get_policy_loss(name)
    per_token, _ = fn(logp, torch.where(mask, old, 0.0), adv, mask)
    base = aggregate_loss(per_token, mask, "token-mean")
    res = rollout_correction(old, old.clone(), mask, config)
    corrected = aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean")
    assert torch.equal(base, corrected)
    g1, = torch.autograd.grad(base, logp, retain_graph=True)
    g2, = torch.autograd.grad(corrected, logp)
    assert torch.equal(g1, g2)


def test_nan_in_padding_never_reaches_weights_metrics_or_loss():
    train, rollout, mask = _batch(4, scale=0.5)
    cfg = RolloutCorrection(is_level="sequence", is_threshold=3.0, batch_normalize=True,
                            rejection={"seq_mean_k3": 0.05, "token_tv": 0.2, "seq_max_k2": 1.0})
    clean = rollout_correction(train, rollout, mask, cfg)
    dirty = rollout_correction(torch.where(mask, train, torch.nan), torch.where(mask, rollout, torch.inf), mask, cfg)
    assert torch.equal(clean.weights, dirty.weights) and torch.equal(clean.mask, dirty.mask)
    assert {k: float(v) for k, v in clean.metrics.items()} == {k: float(v) for k, v in dirty.metrics.items()}
    loss = torch.where(mask, torch.ones_like(train), torch.nan)
    assert torch.isfinite(apply_rollout_correction(loss, dirty)).all()


def test_nan_on_a_response_token_is_a_named_error():
    train, rollout, mask = _batch(5)
    rollout[0, 0] = torch.nan
    with pytest.raises(ValueError, match="rollout correction: rollout log-probabilities contains 1 NaN and 0 Inf"):
        rollout_correction(train, rollout, mask, RolloutCorrection(is_level="token"))
    # under the non-finite guard the finding is recorded and the NaN flows on to the loss the guard inspects
    from rlhf_ext.algorithms import deferred_finite_checks

    with deferred_finite_checks() as findings:
        res = rollout_correction(train, rollout, mask, RolloutCorrection(is_level="token"))
    assert findings[0]["name"] == "rollout correction: rollout log-probabilities" and findings[0]["nan_count"] == 1
    assert torch.isnan(res.weights[0, 0])
    # -inf (probability 0) is a legitimate value, not an error
    rollout[0, 0] = -torch.inf
    assert float(rollout_correction(train, rollout, mask, RolloutCorrection(is_level="token")).weights[0, 0]) == 2.0


@pytest.mark.parametrize("bad", [
    dict(is_level="tokens"), dict(is_level="token", is_threshold=0.0), dict(is_level="token", is_threshold=(2.0, 1.0)),
    dict(rejection={"seq_mean_k9": 1.0}), dict(rejection={"seq_mean_k3": (0.1, 1.0)}), dict(rejection={"token_k1": -1}),
    dict(is_level="token", is_threshold=True),
])
def test_bad_options_are_named(bad):
    with pytest.raises(ValueError):
        RolloutCorrection(**bad)


def test_weights_are_detached_and_metrics_report_the_mismatch():
    train, rollout, mask = _batch(6, scale=1.0)
    res = rollout_correction(train.requires_grad_(True), rollout, mask, RolloutCorrection(is_level="token"))
    assert not res.weights.requires_grad
    assert 0 < float(res.metrics["ess"]) < 1 and float(res.metrics["is_truncated_fraction"]) > 0
    assert float(res.metrics["weight_max"]) == 2.0


# --- OpenRLHF 0.11.2 parity: its PolicyLoss with is_correction_* vs rlhf_ext's ppo + this layer ----------


OPENRLHF_MODES = [
    ("token", "clip", "ratio", (0.5, 2.0)),
    ("token", "mask", "ratio", (0.5, 2.0)),
    ("seq", "mask", "ratio", (0.97, 1.03)),
    ("token", "mask", "binary_kl", (0.0, 0.01)),
    ("seq", "mask", "binary_kl", (0.0, 0.005)),
    ("token", "mask", "tv", (0.0, 0.05)),
    ("seq", "mask", "tv", (0.0, 0.03)),
]


@pytest.fixture(scope="module")
def OpenRLHFPolicyLoss():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")  # the flash_attn fallback OpenRLHF's imports need on CPU
    from openrlhf.models.loss import PolicyLoss  # OpenRLHF's own class (the plugin patches another name)

    yield PolicyLoss
    deactivate()


@pytest.mark.parametrize("level,mode,gating,threshold", OPENRLHF_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_openrlhf_is_correction(OpenRLHFPolicyLoss, level, mode, gating, threshold, seed):
    PolicyLoss = OpenRLHFPolicyLoss

    g = torch.Generator().manual_seed(seed)
    b, t = 8, 12
    old = -torch.rand(b, t, generator=g) * 2 - 0.05
    spread = torch.linspace(0.01, 0.6, b)[:, None]  # some rows close, some far: every gate splits the batch
    rollout = (old + torch.randn(b, t, generator=g) * spread).clamp(max=-1e-3)
    logp = (old + torch.randn(b, t, generator=g) * 0.1).requires_grad_(True)
    adv = torch.randn(b, t, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    ref = PolicyLoss(0.2, 0.2, is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
                     is_correction_threshold=list(threshold))
    loss_ref, _, _, vllm_kl, filt = ref(logp, old, adv, mask, rollout)
    grad_ref, = torch.autograd.grad(loss_ref, logp)

    res = rollout_correction(old, rollout, mask, openrlhf_correction(level, mode, gating, threshold))
    per_token, _ = get_policy_loss("ppo")(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    ours = aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean")
    grad, = torch.autograd.grad(ours, logp)
    torch.testing.assert_close(ours, loss_ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(res.metrics["k1_kl"].float(), vllm_kl.float(), rtol=1e-5, atol=1e-7)
    if mode == "clip":
        filtered = res.metrics["is_truncated_fraction"]
    elif level == "seq":
        filtered = res.metrics["seq_rejected_fraction"]
    else:
        filtered = res.metrics["rejected_fraction"]
    torch.testing.assert_close(filtered.float(), filt.float())
    assert 0 < float(filt) < 1, "the case should filter some but not all"


def test_openrlhf_flag_errors_match_openrlhf():
    with pytest.raises(ValueError, match="clip requires"):
        openrlhf_correction("seq", "clip", "ratio", (0.5, 2.0))
    with pytest.raises(ValueError, match="upper bound only"):
        openrlhf_correction("token", "mask", "tv", (0.5, 2.0))
    assert not openrlhf_correction("off", "mask", "ratio", (0.5, 5.0)).active
