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


# Every combination OpenRLHF 0.11.2 accepts (its PolicyLoss refuses clip with seq or a divergence, and a
# divergence with LOW > 0), each threshold as typed on the command line: HIGH alone, LOW HIGH, LOW = 0 and
# LOW < 0 (both "no lower bound"). The bounds make every gate filter some but not all of the batch.
OPENRLHF_MODES = [
    ("token", "clip", "ratio", (2.0,)),
    ("token", "clip", "ratio", (0.5, 2.0)),
    ("token", "clip", "ratio", (0.0, 2.0)),
    ("token", "clip", "ratio", (-1.0, 1.5)),
    ("token", "mask", "ratio", (2.0,)),
    ("token", "mask", "ratio", (0.5, 2.0)),
    ("token", "mask", "ratio", (-1.0, 1.5)),
    ("seq", "mask", "ratio", (1.03,)),
    ("seq", "mask", "ratio", (0.97, 1.03)),
    ("seq", "mask", "ratio", (0.0, 1.03)),
    ("token", "mask", "binary_kl", (0.01,)),
    ("token", "mask", "binary_kl", (0.0, 0.01)),
    ("token", "mask", "binary_kl", (-1.0, 0.01)),
    ("seq", "mask", "binary_kl", (0.005,)),
    ("seq", "mask", "binary_kl", (-0.5, 0.005)),
    ("token", "mask", "tv", (0.05,)),
    ("token", "mask", "tv", (0.0, 0.05)),
    ("token", "mask", "tv", (-0.5, 0.05)),
    ("seq", "mask", "tv", (0.03,)),
    ("seq", "mask", "tv", (0.0, 0.03)),
]


def as_openrlhf_cli_gives(threshold):
    """What OpenRLHF 0.11.2's train_ppo_ray.py hands PolicyLoss: HIGH alone becomes [0.0, HIGH]."""
    return [0.0, *threshold] if len(threshold) == 1 else list(threshold)


@pytest.fixture(scope="module")
def OpenRLHFPolicyLoss():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")  # the flash_attn fallback OpenRLHF's imports need on CPU
    from openrlhf.models.loss import PolicyLoss  # OpenRLHF's own class (the plugin patches another name)

    yield PolicyLoss
    deactivate()


def _parity_batch(seed, b=8, t=12):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 2 - 0.05
    spread = torch.linspace(0.01, 0.6, b)[:, None]  # some rows close, some far: every gate splits the batch
    rollout = (old + torch.randn(b, t, generator=g) * spread).clamp(max=-1e-3)
    logp = old + torch.randn(b, t, generator=g) * 0.1
    adv = torch.randn(b, t, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return old, rollout, logp, adv, mask


def openrlhf_weights(ref, old, rollout, mask):
    """OpenRLHF's per-token correction coefficient (0 where it drops a token), read from its own loss:
    with log pi = log pi_old the PPO ratio is exactly 1, so the per-token loss is -A_t * coef_t and, summed
    (batch_num_tokens=1), d loss / d A_t = -coef_t on response tokens."""
    adv = torch.zeros_like(old, requires_grad=True)
    loss = ref(old.clone(), old, adv, mask, rollout, batch_num_tokens=1.0)[0]
    grad, = torch.autograd.grad(loss, adv)
    return -grad


@pytest.mark.parametrize("level,mode,gating,threshold", OPENRLHF_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_openrlhf_is_correction(OpenRLHFPolicyLoss, level, mode, gating, threshold, seed):
    old, rollout, logp, adv, mask = _parity_batch(seed)
    logp.requires_grad_(True)
    ref = OpenRLHFPolicyLoss(0.2, 0.2, is_correction_level=level, is_correction_mode=mode,
                             is_correction_gating=gating, is_correction_threshold=as_openrlhf_cli_gives(threshold))
    ours = openrlhf_correction(level, mode, gating, threshold)
    # the one-value form as typed and as OpenRLHF's CLI rewrites it configure the same correction
    assert openrlhf_correction(level, mode, gating, as_openrlhf_cli_gives(threshold)) == ours
    res = rollout_correction(old, rollout, mask, ours)

    # the same weights and mask
    w_ref = openrlhf_weights(ref, old, rollout, mask)
    torch.testing.assert_close(res.weights, w_ref, rtol=1e-6, atol=0)
    if mode == "mask":
        assert torch.equal(res.mask, mask & (w_ref != 0))
    else:
        assert torch.equal(res.mask, mask)  # clip drops nothing

    # the same loss, gradient, vllm_kl and is_filter_ratio
    loss_ref, _, _, vllm_kl, filt = ref(logp, old, adv, mask, rollout)
    grad_ref, = torch.autograd.grad(loss_ref, logp)
    per_token, _ = get_policy_loss("ppo")(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    loss = aggregate_loss(apply_rollout_correction(per_token, res), mask, "token-mean")
    grad, = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-7)
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


def test_one_value_threshold_hand_computed():
    """HIGH alone is [0, HIGH]: clip truncates at HIGH only (TIS), mask drops ratios above HIGH only."""
    old = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.5), 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[math.log(0.1), math.log(0.5), math.log(0.9), 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])  # ratios 5, 1, 5/9; last: padding
    clip = rollout_correction(old, rollout, mask, openrlhf_correction("token", "clip", "ratio", [2.0]))
    torch.testing.assert_close(clip.weights, torch.tensor([[2.0, 1.0, 5 / 9, 0.0]], dtype=torch.float64))
    assert float(clip.metrics["is_truncated_fraction"]) == pytest.approx(1 / 3)
    both = rollout_correction(old, rollout, mask, openrlhf_correction("token", "clip", "ratio", [0.8, 2.0]))
    torch.testing.assert_close(both.weights, torch.tensor([[2.0, 1.0, 0.8, 0.0]], dtype=torch.float64))
    icepop = rollout_correction(old, rollout, mask, openrlhf_correction("token", "mask", "ratio", [2.0]))
    assert icepop.mask.tolist() == [[False, True, True, False]]
    torch.testing.assert_close(icepop.weights, torch.tensor([[0.0, 1.0, 5 / 9, 0.0]], dtype=torch.float64))
    seq = rollout_correction(old, rollout, mask, openrlhf_correction("seq", "mask", "ratio", [2.0]))
    # geometric mean of (5, 1, 5/9) = (25/9)^(1/3) = 1.406 <= 2: the sequence stays, each token its own ratio
    assert seq.mask.tolist() == [[True, True, True, False]]
    torch.testing.assert_close(seq.weights, torch.tensor([[5.0, 1.0, 5 / 9, 0.0]], dtype=torch.float64))
    tv = rollout_correction(old, rollout, mask, openrlhf_correction("token", "mask", "tv", [0.3]))
    assert tv.mask.tolist() == [[False, True, False, False]]  # |0.1 - 0.5| = |0.9 - 0.5| = 0.4 > 0.3; 0 kept


def test_binary_kl_rounding_below_zero_keeps_the_token(OpenRLHFPolicyLoss):
    """The one documented difference: OpenRLHF also compares a divergence with the lower bound (0 for HIGH
    alone), and its float32 Bernoulli KL of two nearly equal probabilities rounds below 0, so it drops tokens
    whose policies agree. Here a divergence has an upper bound only (OpenRLHF's documented meaning)."""
    old = torch.full((1, 4), math.log(0.3))
    rollout = old + torch.tensor([[1e-4, -1e-4, 3e-5, 0.5]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    p, q = rollout.exp().clamp(1e-6, 1 - 1e-6), old.exp().clamp(1e-6, 1 - 1e-6)
    kl = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()  # as float32 computes it
    assert (kl[0, :3] < 0).any(), "the case needs a token whose float32 KL rounds below 0"
    ref = OpenRLHFPolicyLoss(0.2, 0.2, is_correction_level="token", is_correction_mode="mask",
                             is_correction_gating="binary_kl", is_correction_threshold=[0.0, 0.01])
    w_ref = openrlhf_weights(ref, old, rollout, mask)
    res = rollout_correction(old, rollout, mask, openrlhf_correction("token", "mask", "binary_kl", [0.01]))
    assert res.mask.tolist() == [[True, True, True, False]]  # KL(0.5 nats apart) = 0.046 > 0.01
    assert torch.equal(w_ref[0, :3] == 0, kl[0, :3] < 0)  # OpenRLHF drops exactly the rounded-negative ones
    agree = (kl >= 0) & res.mask
    torch.testing.assert_close(res.weights[agree], w_ref[agree], rtol=1e-6, atol=0)


@pytest.mark.parametrize("level,mode,gating,threshold,message", [
    ("seq", "clip", "ratio", (0.5, 2.0), "clip requires"),
    ("token", "clip", "tv", (2.0,), "clip requires"),
    ("token", "mask", "tv", (0.5, 2.0), "upper bound only"),
    ("token", "mask", "ratio", (), "takes HIGH or LOW HIGH"),
    ("token", "mask", "ratio", (0.5, 1.0, 2.0), "takes HIGH or LOW HIGH"),
    ("token", "mask", "ratio", (2.0, 0.5), "lower bound 2.0 > upper bound 0.5"),
    ("token", "clip", "ratio", (0.0,), "upper bound must be > 0"),
    ("token", "mask", "ratio", (float("nan"),), "finite numbers"),
    ("token", "mask", "ratio", ("x",), "finite numbers"),
    ("tok", "mask", "ratio", (2.0,), "must be off/token/seq"),
    ("token", "drop", "ratio", (2.0,), "must be mask/clip"),
    ("token", "mask", "kl", (2.0,), "must be ratio/binary_kl/tv"),
])  # fmt: skip
def test_openrlhf_flag_errors_are_named(level, mode, gating, threshold, message):
    with pytest.raises(ValueError, match=message):
        openrlhf_correction(level, mode, gating, threshold)


def test_openrlhf_off_corrects_nothing():
    assert not openrlhf_correction("off", "mask", "ratio", (0.5, 5.0)).active
    assert not openrlhf_correction("off", "clip", "tv", (0.5, 5.0)).active  # OpenRLHF ignores the rest when off


def test_ratio_rejection_lower_bound_zero_means_none():
    old = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-30.0, 30.0]], dtype=torch.float64)  # ratios e^30 and e^-30
    mask = torch.ones(1, 2, dtype=torch.bool)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(rejection={"token_ratio": "0_2"}))
    assert res.mask.tolist() == [[False, True]]
    with pytest.raises(ValueError, match="token_ratio lower bound must be a positive"):
        RolloutCorrection(rejection={"token_ratio": (-1.0, 2.0)})
