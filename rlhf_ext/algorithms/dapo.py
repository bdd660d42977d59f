"""DAPO's sampling and shaping helpers (Yu et al. 2025, arXiv 2503.14476)."""

from __future__ import annotations

import torch

from .checks import as_float_tensor, check_finite, check_scores


def zero_variance_groups(scores) -> torch.Tensor:
    """Dynamic sampling: ``BoolTensor[P]``, True for prompts whose N scores are all equal.

    Such groups have zero advantage under every group-relative estimator and only dilute the
    batch; DAPO drops them and samples more prompts until the batch is full.
    """
    scores = check_scores(scores, min_group_size=1, estimator="zero_variance_groups")
    return scores.max(dim=1).values == scores.min(dim=1).values


def overlong_penalty(lengths, max_len: int, buffer_len: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, per response (lengths in tokens).

    With ``L_max = max_len`` and ``L_c = buffer_len``::

        0                                  if len <= L_max - L_c
        ((L_max - L_c) - len) / L_c        if L_max - L_c < len <= L_max
        -1                                 if len > L_max

    multiplied by ``factor``. The penalty is added to the task reward.
    """
    lengths = as_float_tensor(lengths, "lengths")
    check_finite(lengths, "lengths")
    if not (isinstance(max_len, (int, float)) and max_len > 0):
        raise ValueError(f"overlong_penalty: max_len must be > 0, got {max_len!r}")
    if not (isinstance(buffer_len, (int, float)) and 0 < buffer_len <= max_len):
        raise ValueError(f"overlong_penalty: buffer_len must be in (0, max_len={max_len}], got {buffer_len!r}")
    if bool((lengths < 0).any()):
        raise ValueError("overlong_penalty: lengths must be >= 0")
    expected = max_len - buffer_len
    penalty = ((expected - lengths) / buffer_len).clamp(min=-1.0, max=0.0)
    return penalty * factor


def truncated_completion_mask(mask: torch.Tensor, truncated) -> torch.Tensor:
    """DAPO's overlong filtering (arXiv 2503.14476, Sec. 3.4; TRL's ``mask_truncated_completions``):
    the loss mask with every token of a truncated response (one cut at the generation budget, no
    end-of-sequence token) set to 0, so a cut-off answer is neither rewarded nor punished.

    ``truncated``: bool per response ``[B]``. Returns a bool mask of ``mask``'s shape; an all-False
    row is legal here, and aggregation modes that divide per sequence then need it dropped.
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("truncated_completion_mask: mask must be a [batch, tokens] tensor")
    truncated = torch.as_tensor(truncated, device=mask.device)
    if truncated.shape != mask.shape[:1]:
        raise ValueError(f"truncated_completion_mask: truncated has shape {tuple(truncated.shape)}, "
                         f"expected ({mask.shape[0]},) (one flag per response)")
    return mask.bool() & ~truncated.bool()[:, None]


def off_policy_sequence_mask(advantages, log_probs: torch.Tensor, sampling_log_probs: torch.Tensor,
                             mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence masking (arXiv 2512.02556, Sec. 3.1; TRL 1.16's
    ``off_policy_mask_threshold``): ``BoolTensor[B]``, False for the sequences to drop.

    A sequence is dropped when its advantage is negative and its mean per-token KL to the policy
    that sampled it, ``(1/|y|) sum_t (log pi_sample - log pi)``, exceeds ``threshold``: a negative
    update on text the current policy would no longer write only destabilises it. Tokens whose
    sampling log-prob is NaN (unscored) count as KL 0, as in TRL; padding is ignored.
    """
    from .checks import check_token_inputs

    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"off_policy_sequence_mask: threshold must be a number >= 0, got {threshold!r}")
    maskb = check_token_inputs(mask, log_probs=log_probs)
    if sampling_log_probs.shape != mask.shape:
        raise ValueError(f"shape mismatch: sampling_log_probs {tuple(sampling_log_probs.shape)} vs mask "
                         f"{tuple(mask.shape)}")
    adv = torch.as_tensor(advantages).reshape(-1)
    if adv.numel() != mask.shape[0]:
        raise ValueError(f"off_policy_sequence_mask: {adv.numel()} advantages for {mask.shape[0]} sequences")
    kl = torch.nan_to_num(sampling_log_probs - log_probs.detach(), nan=0.0)
    kl = torch.where(maskb, kl, kl.new_zeros(()))
    mean_kl = kl.sum(dim=1) / maskb.sum(dim=1)
    return (adv >= 0) | (mean_kl <= threshold)


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float) -> torch.Tensor:
    """Only the highest-entropy tokens carry gradient (Wang et al. 2025, "Beyond the 80/20 Rule",
    arXiv 2506.01939; TRL's ``top_entropy_quantile``): bool ``[B, T]``, True for response tokens whose
    entropy is at least the ``1 - top_entropy_quantile`` quantile of the batch's response-token
    entropies. ``top_entropy_quantile=0.2`` is the paper's 20 % of "forking" tokens; 1.0 keeps all.

    Multiply the per-token policy loss by the mask (keep the aggregation's token counts from the
    full mask, as TRL does). For data parallelism the quantile must be taken over every rank's
    tokens; this function sees one rank.
    """
    from .checks import check_token_inputs

    if isinstance(top_entropy_quantile, bool) or not isinstance(top_entropy_quantile, (int, float)) \
            or not 0 < top_entropy_quantile <= 1:
        raise ValueError(f"top_entropy_quantile must be in (0, 1], got {top_entropy_quantile!r}")
    maskb = check_token_inputs(mask, entropy=entropy)
    threshold = torch.quantile(entropy[maskb].float(), 1.0 - top_entropy_quantile)
    return maskb & (torch.where(maskb, entropy, entropy.new_zeros(())) >= threshold)
