"""rlhf_ext.algorithms.rollout_correction against verl 0.9.1's rollout_corr_helper (in .venv-verl).

Every IS level (token, sequence) x threshold kind (TIS, IcePop) x batch normalisation, and every
rejection option verl has, alone and chained, on random batches: weights, rejection mask and the
metrics both report (rlhf_ext name -> verl name in VERL_METRIC_NAMES, plus the per-option ones).
"""

from __future__ import annotations

import pytest
import torch

from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from rlhf_ext.algorithms import RolloutCorrection, rollout_correction
from rlhf_ext.algorithms.rollout_correction import VERL_METRIC_NAMES, VERL_REJECTION_OPTIONS

B, T = 10, 12


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    spread = torch.linspace(0.01, 1.0, B, dtype=torch.float64)[:, None]  # near and far rows
    rollout = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread).clamp(max=-1e-4)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    return old, rollout, mask


def _verl(old, rollout, mask, **kwargs):
    proto, new_mask, metrics = compute_rollout_correction_and_rejection_mask(old, rollout, mask, **kwargs)
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    return weights, new_mask, {k[len("rollout_corr/"):]: v for k, v in metrics.items()}


def _compare_metrics(ours, theirs, names):
    compared = 0
    for mine, verls in names.items():
        if mine in ours and verls in theirs:
            assert float(ours[mine]) == pytest.approx(theirs[verls], rel=1e-6, abs=1e-9), (mine, verls)
            compared += 1
    return compared


IS_CASES = [(level, thr, norm) for level in ("token", "sequence") for thr in (2.0, "0.5_2.0", 1.5)
            for norm in (False, True)]


@pytest.mark.parametrize("level,threshold,normalize", IS_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_importance_weights_match_verl(level, threshold, normalize, seed):
    old, rollout, mask = _batch(seed)
    w_verl, mask_verl, m_verl = _verl(old, rollout, mask, rollout_is=level, rollout_is_threshold=threshold,
                                      rollout_is_batch_normalize=normalize)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(is_level=level, is_threshold=threshold,
                                                                    batch_normalize=normalize))
    torch.testing.assert_close(res.weights, w_verl, rtol=1e-7, atol=1e-10)
    assert torch.equal(res.mask, mask_verl.bool())
    n = _compare_metrics(res.metrics, m_verl, VERL_METRIC_NAMES)
    assert n >= 9 + int(normalize)
    if level == "token" and threshold == 2.0 and not normalize:
        assert 0 < m_verl["rollout_is_ratio_fraction_high"] < 1  # the case truncates some, not all


def _rs_threshold(option):
    if option == "seq_mean_k1":
        return "0.95_1.05"
    return "0.7_1.4" if option.endswith("k1") else {"token": "0.02", "seq_sum": "0.3", "seq_mean": "0.02",
                                                     "seq_max": "0.08"}[option.rsplit("_", 1)[0]]


@pytest.mark.parametrize("option", VERL_REJECTION_OPTIONS)
@pytest.mark.parametrize("seed", [0, 3])
def test_rejection_masks_match_verl(option, seed):
    old, rollout, mask = _batch(seed)
    thr = _rs_threshold(option)
    _, mask_verl, m_verl = _verl(old, rollout, mask, rollout_is=None, rollout_rs=option, rollout_rs_threshold=thr)
    spec = tuple(float(x) for x in thr.split("_")) if "_" in thr else float(thr)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(rejection={option: spec}))
    assert torch.equal(res.mask, mask_verl.bool())
    names = dict(VERL_METRIC_NAMES)
    for suffix in ("mean", "masked_fraction", "seq_masked_fraction"):
        names[f"rs_{option}_{suffix}"] = f"rollout_rs_{option}_{suffix}"
    assert _compare_metrics(res.metrics, m_verl, names) >= 7
    assert 0 < m_verl["rollout_rs_masked_fraction"] < 1, "the case should reject some tokens, not all"


def test_chained_rejection_and_weights_match_verl():
    old, rollout, mask = _batch(5)
    options = "token_k1,seq_mean_k3,seq_max_k2"
    thresholds = "0.5_2.0,0.02,0.08"
    w_verl, mask_verl, m_verl = _verl(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=3.0,
                                      rollout_rs=options, rollout_rs_threshold=thresholds)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(
        is_level="sequence", is_threshold=3.0,
        rejection={"token_k1": (0.5, 2.0), "seq_mean_k3": 0.02, "seq_max_k2": 0.08}))
    assert torch.equal(res.mask, mask_verl.bool())
    # verl keeps the weights of rejected tokens (its loss drops them through the mask); rlhf_ext zeroes them
    torch.testing.assert_close(res.weights, torch.where(mask_verl.bool(), w_verl, 0.0), rtol=1e-7, atol=1e-10)
    assert _compare_metrics(res.metrics, m_verl, VERL_METRIC_NAMES) >= 11


def test_identical_log_probs_match_verl_and_are_exactly_one():
    old, _, mask = _batch(6)
    w_verl, mask_verl, _ = _verl(old, old.clone(), mask, rollout_is="sequence", rollout_is_threshold=2.0,
                                 rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
    res = rollout_correction(old, old.clone(), mask, RolloutCorrection(is_level="sequence",
                                                                        rejection={"seq_mean_k3": 0.01}))
    assert torch.equal(res.weights, mask) and torch.equal(w_verl, mask) and torch.equal(res.mask, mask_verl.bool())


# --- the verl glue: rlhf_ext's modes under verl's keys, rlhf_ext's losses honour weights and masks -------


def _data(seed):
    from verl import DataProto

    old, rollout, mask = _batch(seed)
    return DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": rollout,
                                        "response_mask": mask.clone()}), old, rollout, mask


def test_verl_values_pass_through_and_rlhf_ext_values_are_computed_by_rlhf_ext():
    import verl  # noqa: F401  (loads the rlhf_ext plugin)
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper as helper

    seam = helper.compute_rollout_correction_and_add_to_batch
    assert getattr(seam, "rlhf_ext_patched", False), "the plugin did not patch verl's rollout_corr_helper"
    own = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3",
                                  rollout_rs_threshold=0.02)
    a, m_a = seam(_data(0)[0], own)
    b, m_b = seam.__wrapped__(_data(0)[0], own)
    assert torch.equal(a.batch["rollout_is_weights"], b.batch["rollout_is_weights"]) and m_a == m_b

    cfg = RolloutCorrectionConfig(rollout_is="geometric", rollout_is_threshold=2.0,
                                  rollout_rs="seq_max_abs_log_ratio,seq_mean_k3", rollout_rs_threshold="0.8,0.02")
    data, old, rollout, mask = _data(1)
    out, metrics = seam(data, cfg)
    expected = rollout_correction(old, rollout, mask, RolloutCorrection(
        is_level="geometric", is_threshold=2.0, rejection={"seq_max_abs_log_ratio": 0.8, "seq_mean_k3": 0.02}))
    assert torch.equal(out.batch["rollout_is_weights"], expected.weights)
    assert torch.equal(out.batch["response_mask"], expected.mask.to(mask.dtype))
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1
    assert "rollout_corr/rollout_is_eff_sample_size" in metrics and "rollout_corr/k3_kl" in metrics


@pytest.mark.parametrize("name", ["cispo", "ppo", "gspo"])
def test_rlhf_ext_losses_in_verl_honour_weights_and_rejection_mask(name):
    import verl  # noqa: F401
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo import rollout_corr_helper as helper
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    from rlhf_ext.algorithms import apply_rollout_correction, get_policy_loss
    from rlhf_ext.patches.verl.policy_loss import loss_options

    data, old, rollout, mask = _data(2)
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3",
                                  rollout_rs_threshold=0.02)
    data, _ = helper.compute_rollout_correction_and_add_to_batch(data, cfg)
    weights, new_mask = data.batch["rollout_is_weights"], data.batch["response_mask"]
    assert 0 < float(new_mask.sum()) < float(mask.sum())
    g = torch.Generator().manual_seed(7)
    logp = (old + 0.05 * torch.randn(old.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_torch_compile=False,
                        clip_ratio=0.2, policy_loss=PolicyLossConfig(loss_mode=f"rlhf_ext_{name}"))
    loss, _ = core_algos.get_policy_loss_fn(f"rlhf_ext_{name}")(old, logp, adv, new_mask, "token-mean", actor,
                                                                rollout_is_weights=weights)
    fn = get_policy_loss(name)
    rows = new_mask.bool().any(-1)  # whole sequences rejected: rlhf_ext's loss sees the other rows
    assert not bool(rows.all())
    part, _ = fn(logp[rows], old[rows], adv[rows], new_mask.bool()[rows], **loss_options(actor, fn))
    per_token = torch.zeros_like(old).index_put((rows.nonzero(as_tuple=True)[0],), part)
    res = rollout_correction(old, rollout, mask, RolloutCorrection(is_level="token", is_threshold=2.0,
                                                                    rejection={"seq_mean_k3": 0.02}))
    # token-mean over the tokens the rejection kept (rlhf_ext's aggregate_loss refuses emptied rows)
    expected = apply_rollout_correction(per_token, res).sum() / res.mask.sum()
    torch.testing.assert_close(loss, expected)
