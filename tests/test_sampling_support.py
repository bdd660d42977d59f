"""Top-p / top-k truncation and the rollout correction: vLLM's processed log-probs carry log S (the kept
mass) on every token; rlhf_ext's replay (truncated_log_probs) matches vLLM's own truncation and removes it."""

import math

import pytest
import torch

from rlhf_ext.algorithms import RolloutCorrection, kept_log_mass, rollout_correction, truncated_log_probs

CASES = [(None, 0.9), (None, 0.5), (20, None), (5, None), (20, 0.8), (1, None), (None, 1.0)]


def _vllm_processed_logprobs(logits, top_k, top_p):
    """What vLLM 0.32 reports with logprobs_mode=processed_logprobs (its CPU / native sampler path)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    b = logits.shape[0]
    k = None if top_k is None else torch.full((b,), top_k, dtype=torch.long)
    p = None if top_p is None else torch.full((b,), top_p, dtype=torch.float32)
    return apply_top_k_top_p_pytorch(logits.clone(), k, p).log_softmax(dim=-1, dtype=torch.float32)


def _sample(logits, top_k, top_p, seed):
    g = torch.Generator().manual_seed(seed)
    probs = _vllm_processed_logprobs(logits, top_k, top_p).exp()
    return torch.multinomial(probs, 1, generator=g).squeeze(-1)


@pytest.mark.parametrize("top_k,top_p", CASES)
def test_replay_matches_vllm_truncation(top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 200, generator=g) * 3
    ref = _vllm_processed_logprobs(logits, top_k, top_p)
    tokens = torch.arange(200).expand(16, 200)
    ours = truncated_log_probs(logits.unsqueeze(1).expand(16, 200, 200), tokens, top_k=top_k, top_p=top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))  # the same support
    finite = torch.isfinite(ref)
    torch.testing.assert_close(ours[finite], ref[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k,top_p", [c for c in CASES if c != (None, 1.0)])
def test_truncation_bias_is_log_kept_mass_and_the_replay_removes_it(top_k, top_p):
    g = torch.Generator().manual_seed(1)
    b, t, v = 6, 10, 100
    logits = torch.randn(b * t, v, generator=g) * 2
    tokens = _sample(logits, top_k, top_p, seed=2)
    rollout = _vllm_processed_logprobs(logits, top_k, top_p).gather(-1, tokens[:, None]).squeeze(-1)
    full = logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)  # a trainer without the replay
    log_s = kept_log_mass(logits, top_k=top_k, top_p=top_p)
    torch.testing.assert_close(full - rollout, log_s, rtol=1e-5, atol=1e-5)  # the same shift for every token
    assert bool((log_s < 0).all())  # something was cut at every position

    mask = torch.ones(b, t, dtype=torch.bool)
    cfg = RolloutCorrection(is_level="token", is_threshold=2.0, rejection={"token_ratio": (0.9, 1.1)})
    biased = rollout_correction(full.view(b, t), rollout.view(b, t), mask, cfg)
    # every weight is the kept mass S < 1: the correction "corrects" the truncation, not the numerics
    torch.testing.assert_close(biased.weights[biased.mask], log_s.view(b, t)[biased.mask].exp(), rtol=1e-4, atol=1e-5)
    assert float(biased.metrics["is_mean"]) < 1
    replayed = truncated_log_probs(logits, tokens, top_k=top_k, top_p=top_p)
    fixed = rollout_correction(replayed.view(b, t), rollout.view(b, t), mask, cfg)
    torch.testing.assert_close(fixed.weights, torch.ones(b, t, dtype=fixed.weights.dtype), rtol=1e-5, atol=1e-5)
    assert float(fixed.metrics["rejected_fraction"]) == 0.0
    assert float(biased.metrics["rejected_fraction"]) >= float(fixed.metrics["rejected_fraction"])


def test_no_truncation_means_no_shift_and_bad_options_are_named():
    logits = torch.randn(4, 50)
    torch.testing.assert_close(kept_log_mass(logits), torch.zeros(4), rtol=0, atol=1e-6)
    for bad in (dict(top_p=0.0), dict(top_p=1.5), dict(top_k=0), dict(temperature=0.0)):
        with pytest.raises(ValueError):
            truncated_log_probs(logits, torch.zeros(4, dtype=torch.long), **bad)
    assert math.isinf(float(truncated_log_probs(logits, logits.argmin(-1), top_k=1)[0]))
