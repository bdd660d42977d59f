"""Outcome-level advantage estimators: one function per estimator, formula in the docstring.

Each takes ``scores`` of shape ``[P, N]`` -- P prompts, N sampled responses each, in the
row-major order OpenRLHF lays rollouts out (``rewards.reshape(-1, n_samples_per_prompt)``) --
and returns advantages of the same shape. Token-level work (spreading the outcome over the
response, batch whitening for the REINFORCE++ family) belongs to the caller; see :func:`whiten`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .checks import check_binary, check_scores, check_token_inputs
from .registry import register_advantage

DEFAULT_EPS = 1e-6


def _group_mean(scores: torch.Tensor) -> torch.Tensor:
    return scores.mean(dim=1, keepdim=True)


@register_advantage("grpo")
def grpo(scores, *, eps: float = DEFAULT_EPS, std_scope: str = "group") -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

    ``A_i = (r_i - mean_g) / (std + eps)`` with the unbiased (Bessel-corrected) standard
    deviation, as verl and OpenRLHF compute it. ``std_scope`` selects the std:

    * ``"group"`` (default): the std of the prompt's own group;
    * ``"batch"``: one std over every score in the batch (more stable when groups are small);
    * ``"none"``: no division, which is Dr.GRPO's advantage (arXiv 2503.20783).

    A group whose scores are all equal gets advantage 0 (its numerator is 0).
    """
    if std_scope not in ("group", "batch", "none"):
        raise ValueError(f"grpo: std_scope must be 'group', 'batch' or 'none', got {std_scope!r}")
    if not eps >= 0:
        raise ValueError(f"grpo: eps must be >= 0, got {eps!r}")
    scores = check_scores(scores, min_group_size=2, estimator="grpo")
    centered = scores - _group_mean(scores)
    if std_scope == "none":
        return centered
    if std_scope == "group":
        std = scores.std(dim=1, unbiased=True, keepdim=True)
    else:
        std = scores.std(unbiased=True) if scores.numel() > 1 else scores.new_zeros(())
    if eps == 0:
        # Without eps a zero-variance group would divide 0 by 0; its advantage is 0 by definition.
        return torch.where(std > 0, centered / torch.where(std > 0, std, 1.0), 0.0)
    return centered / (std + eps)


@register_advantage("dr_grpo")
def dr_grpo(scores) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

    ``A_i = r_i - mean_g``: GRPO without the std division, which biases learning toward
    questions that are too easy or too hard. The other half of Dr.GRPO is the constant loss
    normaliser: aggregate the loss with ``seq-mean-token-sum-norm`` (see :mod:`.aggregation`).
    """
    scores = check_scores(scores, min_group_size=2, estimator="dr_grpo")
    return scores - _group_mean(scores)


@register_advantage("rloo")
def rloo(scores) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740; Kool et al. 2019).

    ``A_i = r_i - (sum_g - r_i) / (N - 1)``: the baseline of each sample is the mean of the
    other N - 1 samples of its prompt, which equals ``N / (N - 1) * (r_i - mean_g)``.
    """
    scores = check_scores(scores, min_group_size=2, estimator="rloo")
    n = scores.shape[1]
    return scores - (scores.sum(dim=1, keepdim=True) - scores) / (n - 1)


@register_advantage("reinforce_pp")
def reinforce_pp(scores) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262).

    ``A_i = r_i``: the outcome reward itself. The baseline of REINFORCE++ is the token-level
    whitening over the whole batch (:func:`whiten`), applied after the KL penalty is added
    per token and returns are accumulated. Works with one sample per prompt.
    """
    return check_scores(scores, min_group_size=1, estimator="reinforce_pp").clone()


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(scores) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262, v3+).

    ``A_i = r_i - mean_g``, followed by token-level batch whitening (:func:`whiten`). The group
    mean removes the prompt's difficulty; the batch std (not the group std) keeps the scale
    stable without GRPO's per-prompt reweighting.
    """
    scores = check_scores(scores, min_group_size=2, estimator="reinforce_pp_baseline")
    return scores - _group_mean(scores)


def _comb_ratio(top: torch.Tensor, bottom: int, k: int) -> torch.Tensor:
    """``C(top, k) / C(bottom, k)`` elementwise for integer-valued ``top``, exactly 0 when top < k.

    Computed as ``prod_{i<k} (top - i) / (bottom - i)`` in float64, which never forms the huge
    binomials themselves (C(64, 32) overflows float32's mantissa).
    """
    ratio = torch.ones_like(top, dtype=torch.float64)
    for i in range(k):
        ratio = ratio * (top - i).clamp(min=0) / (bottom - i)
    return ratio


@register_advantage("passk")
def passk(scores, *, k: Optional[int] = None, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Analytic Pass@k advantage (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation", arXiv 2508.10751), binary rewards.

    For a group of N samples with N_neg wrong ones:

    * group reward ``R = 1 - C(N_neg, k) / C(N, k)`` (the unbiased pass@k of the group),
      ``sigma = sqrt(R (1 - R))``;
    * correct samples: ``A_pos = (1 - R) / (sigma + eps)``;
    * wrong samples: ``A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / (sigma + eps)``.

    Invariants: ``c A_pos + N_neg A_neg = 0`` per group; ``k = 1`` is GRPO with the population
    std; groups with fewer than k wrong samples (all-correct included) and all-wrong groups get
    advantage 0. ``k`` must satisfy ``1 <= k <= N``.
    """
    if k is None:
        raise ValueError("passk: option k is required (e.g. k=4; with OpenRLHF: --algo.advantage.passk_k 4)")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"passk: k must be a positive integer, got {k!r}")
    scores = check_scores(scores, min_group_size=2, estimator="passk")
    check_binary(scores, "passk")
    n = scores.shape[1]
    if k > n:
        raise ValueError(f"passk: k={k} is larger than the group size N={n} (samples per prompt)")
    dtype = scores.dtype
    s = scores.to(torch.float64)
    n_neg = (s == 0).sum(dim=1, keepdim=True).to(torch.float64)
    n_pos = n - n_neg
    group_pass = 1.0 - _comb_ratio(n_neg, n, k)
    sigma = torch.sqrt((group_pass * (1.0 - group_pass)).clamp(min=0.0))
    a_pos = (1.0 - group_pass) / (sigma + eps)
    a_neg = (1.0 - group_pass - _comb_ratio(n_neg - 1, n - 1, k - 1)) / (sigma + eps)
    adv = torch.where(s == 1, a_pos, a_neg)
    # All-wrong groups: the formula is 0/eps, exact only up to rounding; define it as exactly 0.
    adv = torch.where(n_pos == 0, torch.zeros_like(adv), adv)
    return adv.to(dtype)


@register_advantage("maxrl")
def maxrl(scores) -> torch.Tensor:
    """MaxRL (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710),
    binary rewards.

    Maximum likelihood maximises ``log p`` (p = the prompt's success probability) rather than
    ``p``; its gradient ``grad p / p`` is estimated on N samples with K successes by averaging
    ``grad log pi`` over the successful samples only, i.e. ``(1/N) sum_i (r_i / mean_g) grad log
    pi_i``. With the group mean as a control variate this gives ``A_i = (r_i - mean_g) / mean_g``,
    and ``A_i = 0`` for groups with no success (the estimator is undefined there and the paper
    drops them). Compared with GRPO, hard prompts (small ``mean_g``) get larger weight.
    """
    scores = check_scores(scores, min_group_size=2, estimator="maxrl")
    check_binary(scores, "maxrl")
    mean = _group_mean(scores)
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))
    return torch.where(mean > 0, (scores - mean) / safe, torch.zeros_like(scores))


@register_advantage("rft")
def rft(scores, *, threshold: float = 1.0) -> torch.Tensor:
    """Rejection-sampling fine-tuning (RFT; Yuan et al. 2023, "Scaling Relationship on Learning
    Mathematical Reasoning with Large Language Models", arXiv 2308.01825; RAFT, Dong et al. 2023,
    arXiv 2304.06767), as an advantage.

    ``A_i = 1 if r_i >= threshold else 0``: the likelihood of the correct samples is raised and
    the wrong ones are ignored, with no baseline (no group mean, no std). With the plain
    policy-gradient loss (``pg``, ``-A log pi``) this is supervised fine-tuning on the accepted
    samples. ``threshold`` (default 1.0) decides what counts as correct: with 0/1 correctness
    scores (OpenRLHF: ``--algo.advantage.input score`` with rlhf_ext's math reward) the default
    accepts exactly the correct samples; with a shaped reward (correctness 1.0 + format 0.2 -
    truncation 0.5) 1.0 still accepts exactly the correct, untruncated answers. Pass e.g.
    ``threshold=0.5`` for scores in [0, 1] that grade partial credit. Works with one sample per
    prompt. A batch with no accepted sample has advantage 0 everywhere (a zero-advantage update,
    counted by :class:`rlhf_ext.algorithms.UpdateCounter`).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"rft: threshold must be a finite number, got {threshold!r}")
    scores = check_scores(scores, min_group_size=1, estimator="rft")
    return (scores >= threshold).to(scores.dtype)


def whiten(values: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8, shift_mean: bool = True) -> torch.Tensor:
    """Token-level batch whitening for the REINFORCE++ family (arXiv 2501.03262).

    ``(v - mean) / sqrt(var + eps)`` with the mean and the (population) variance taken over every
    token where ``mask`` is set, across the whole batch; positions outside the mask are 0. With
    ``shift_mean=False`` only the scale is normalised. For data-parallel training the caller must
    gather the statistics across ranks first (OpenRLHF does this itself).
    """
    maskb = check_token_inputs(mask, values=values)
    # torch.where, not multiplication: padding may hold NaN/Inf and NaN * 0 is NaN.
    zero = values.new_zeros(())
    count = maskb.sum()
    mean = torch.where(maskb, values, zero).sum() / count
    var = torch.where(maskb, (values - mean) ** 2, zero).sum() / count
    out = (values - mean) if shift_mean else values
    return torch.where(maskb, out * torch.rsqrt(var + eps), zero)


# Per-sample inputs beyond the scores that an estimator may declare as keyword parameters; every
# host passes them grouped like the scores ([P, N]) when the estimator's signature names them.
# "turns" (a multi-turn agent's per-turn (reward, anchor state) pairs, rlhf_ext.algorithms.gigpo) only
# OpenRLHF's agent executor has; the other hosts refuse such an estimator at start-up.
HOST_INPUTS = ("lengths", "components", "turns")


def host_inputs(estimator) -> tuple:
    """The names in :data:`HOST_INPUTS` that ``estimator`` takes (hosts pass those, never as options)."""
    import inspect

    params = inspect.signature(estimator).parameters
    return tuple(name for name in HOST_INPUTS if name in params)


def _grouped_like(values, scores: torch.Tensor, name: str, estimator: str) -> torch.Tensor:
    from .checks import as_float_tensor, check_finite

    if values is None:
        raise ValueError(
            f"{estimator} needs {name}= (one value per sample, shaped like the scores); this host did not pass it"
        )
    values = as_float_tensor(values, f"{estimator}: {name}").to(scores.device)
    if values.shape != scores.shape:
        raise ValueError(
            f"{estimator}: {name} has shape {tuple(values.shape)} but the scores have {tuple(scores.shape)}"
        )
    check_finite(values, f"{estimator}: {name}")
    return values


@register_advantage("gpg")
def gpg(scores, *, f_norm: float = 1.0, alpha_count: str = "valid") -> torch.Tensor:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546).

    ``A_i = alpha * (r_i - mean_g) / f_norm``: the group mean as baseline, no std division, and the
    batch-level correction ``alpha = B / M`` with B the number of samples in the batch (the
    ``[P, N]`` the estimator is given) and M the samples that count:

    * ``alpha_count="valid"`` (default, the paper's Eq. for ``alpha = B / (B - M_invalid)``): M =
      samples of groups whose rewards are not all equal, the ones with a non-zero gradient;
    * ``alpha_count="nonzero_reward"``: M = samples with a non-zero reward, which is what verl
      0.9.1's ``compute_gpg_outcome_advantage`` counts (``torch.count_nonzero(scores)``). The two
      differ on all-correct groups (reward 1, advantage 0), which verl counts and the paper does not.

    M is clamped to >= 1 (a batch with no signal has advantage 0 anyway). ``f_norm`` is verl's
    ``f_norm`` (default 1.0). Use with the plain policy-gradient loss (``pg``) as the paper does.
    """
    if alpha_count not in ("valid", "nonzero_reward"):
        raise ValueError(f"gpg: alpha_count must be 'valid' or 'nonzero_reward', got {alpha_count!r}")
    if isinstance(f_norm, bool) or not isinstance(f_norm, (int, float)) or not f_norm > 0:
        raise ValueError(f"gpg: f_norm must be a number > 0, got {f_norm!r}")
    scores = check_scores(scores, min_group_size=2, estimator="gpg")
    if alpha_count == "valid":
        low, high = torch.aminmax(scores, dim=1, keepdim=True)
        counted = (low != high).expand_as(scores).sum()
    else:
        counted = torch.count_nonzero(scores)
    alpha = scores.numel() / counted.clamp(min=1).to(scores.dtype)
    return alpha * (scores - _group_mean(scores)) / f_norm


@register_advantage("opo")
def opo(scores, *, lengths=None) -> torch.Tensor:
    """OPO, On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv 2505.23585).

    ``A_i = r_i - b``, ``b = sum_j |y_j| r_j / sum_j |y_j|``: the group's length-weighted mean
    reward, the variance-minimising baseline for a sequence-level policy gradient when the gradient
    norm grows with the response length. ``lengths`` (response lengths in tokens, one per sample,
    shaped like ``scores``) is passed by every host. Matches verl 0.9.1's
    ``compute_opo_outcome_advantage`` (algorithm.adv_estimator=opo) on groups of two or more;
    single-sample groups are refused as for every group estimator here (verl uses baseline 0).
    """
    scores = check_scores(scores, min_group_size=2, estimator="opo")
    lengths = _grouped_like(lengths, scores, "lengths", "opo")
    if bool((lengths <= 0).any()):
        raise ValueError("opo: lengths must be > 0 (every response has at least one token)")
    baseline = (lengths * scores).sum(dim=1, keepdim=True) / lengths.sum(dim=1, keepdim=True)
    return scores - baseline


@register_advantage("passk_best")
def passk_best(scores, *, norm_adv_by_std_in_grpo: bool = True, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Pass@k training as a max over the group (Walder & Karkhanis 2025, "Pass@K Policy
    Optimization", arXiv 2503.19595); verl's ``grpo_passk``.

    Only each group's best sample gets an advantage, ``A_best = (r_max - r_second) / (std_g + eps)``
    (the gain its presence brings to the group's max reward), every other sample 0. With
    ``norm_adv_by_std_in_grpo=False`` (verl's key) there is no std division. Ties for the best go
    to the first such sample (as ``torch.topk``), and then ``r_max - r_second = 0``. ``std`` is the
    unbiased group std. Matches verl 0.9.1's ``compute_grpo_passk_outcome_advantage``.
    """
    if not eps >= 0:
        raise ValueError(f"passk_best: eps must be >= 0, got {eps!r}")
    scores = check_scores(scores, min_group_size=2, estimator="passk_best")
    top, top_idx = torch.topk(scores, 2, dim=1)
    gain = top[:, :1] - top[:, 1:2]
    if norm_adv_by_std_in_grpo:
        gain = gain / (scores.std(dim=1, unbiased=True, keepdim=True) + eps)
    out = torch.zeros_like(scores)
    return out.scatter(1, top_idx[:, :1], gain)


@register_advantage("gdpo")
def gdpo(scores, *, components=None, weights=None, eps: float = DEFAULT_EPS,
         norm_adv_by_std_in_grpo: bool = True) -> torch.Tensor:
    """GDPO, group reward-decoupled normalisation (Liu et al. 2026, arXiv 2601.05242).

    ``A_i = sum_k w_k (r_ik - mean_g(r_k)) / (std_g(r_k) + eps)``: each reward component is
    normalised within its group before the weighted sum, so a component with a large spread does
    not drown the others (GRPO normalises the sum). ``components``: mapping name -> values shaped
    like ``scores`` (rlhf_ext's weighted rewards carry their unweighted components; hosts pass
    them). ``weights``: mapping name -> weight, default 1 each (verl's ``gdpo_reward_weights``,
    given as a list there). ``scores`` are not used except for their shape. verl 0.9.1's ``gdpo``
    then whitens the token advantages over the batch; hosts here leave that to the caller (see
    docs/algorithms.md). Each component's all-equal groups contribute 0.
    """
    scores = check_scores(scores, min_group_size=2, estimator="gdpo")
    if not components:
        raise ValueError(
            "gdpo needs components= (reward name -> per-sample values); use a weighted rlhf_ext reward "
            "such as accuracy:1.0,format:0.2 so the host can pass its components"
        )
    if weights is None:
        weights = {}
    if not hasattr(weights, "items"):
        raise ValueError(f"gdpo: weights must map component names to numbers, got {weights!r}")
    unknown = sorted(set(weights) - set(components))
    if unknown:
        raise ValueError(f"gdpo: weights name unknown components {unknown}; components: {sorted(components)}")
    total = torch.zeros_like(scores)
    for name, values in components.items():
        values = _grouped_like(values, scores, f"components[{name!r}]", "gdpo")
        total = total + float(weights.get(name, 1.0)) * grpo(
            values, eps=eps, std_scope="group" if norm_adv_by_std_in_grpo else "none")
    return total


def optimal_token_baseline(token_rewards: torch.Tensor, mask: torch.Tensor, groups, old_log_probs: torch.Tensor,
                           sum_pi_squared: torch.Tensor, *, is_weights: Optional[torch.Tensor] = None,
                           handle_zero_tail: bool = True, eps: float = 1e-8):
    """Optimal token baseline (OTB, arXiv 2602.07078; verl 0.9.1's ``optimal_token_baseline``),
    token-level: returns ``(advantages, returns)``, both ``[B, T]``.

    ``G_t`` = reward-to-go; per token ``w_t = 1 - 2 pi_t + sum_v pi_v^2`` (the squared norm of the
    score of the sampled token, ``pi_t = exp(old_log_probs)``), times ``is_weights^2`` when given;
    ``W_t = sum_{j<=t} w_j`` (cumulative path variance). Within each prompt group (``groups``: one
    id per row) ``B_t = sum_i G_it W_it / (sum_i W_it + eps)`` over the rows that reach t, and
    ``A_t = G_t - B_t``. A group of one has no baseline. ``handle_zero_tail`` (verl's key): the part
    of a group's unique longest response beyond the second longest gets baseline 0.

    Needs the per-token ``sum_pi_squared`` over the vocabulary, which only verl's actor computes
    (``actor.calculate_sum_pi_squared``); registered by name as a token-level estimator
    (:mod:`.token_estimators`), run on verl as ``rlhf_ext_optimal_token_baseline``.
    """
    maskb = check_token_inputs(mask, token_rewards=token_rewards, old_log_probs=old_log_probs,
                               sum_pi_squared=sum_pi_squared)
    m = maskb.to(token_rewards.dtype)
    zero = token_rewards.new_zeros(())
    rewards = torch.where(maskb, token_rewards, zero)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * torch.exp(torch.where(maskb, old_log_probs, zero)) + torch.where(maskb, sum_pi_squared, zero)
    if is_weights is not None:
        w = w * torch.where(maskb, is_weights, zero) ** 2
    w_cum = (w * m).cumsum(-1)
    ids = list(groups)
    if len(ids) != mask.shape[0]:
        raise ValueError(f"optimal_token_baseline: {len(ids)} group ids for {mask.shape[0]} rows")
    rows_of = {}
    for row, gid in enumerate(ids):
        rows_of.setdefault(gid.item() if hasattr(gid, "item") else gid, []).append(row)
    baselines = torch.zeros_like(returns)
    for rows in rows_of.values():
        if len(rows) < 2:
            continue
        idx = torch.tensor(rows, device=mask.device)
        mg = m[idx]
        base = (returns[idx] * w_cum[idx] * mg).sum(0) / ((w_cum[idx] * mg).sum(0) + eps)
        baselines[idx] = base.expand(len(rows), -1)
        if handle_zero_tail:
            lengths = mg.sum(-1)
            top2 = torch.topk(lengths, 2).values
            longest = (lengths == top2[0]).nonzero().flatten()
            if longest.numel() == 1 and top2[0] > top2[1]:
                baselines[rows[int(longest[0])], int(top2[1]):] = 0.0
    return (returns - baselines) * m, returns
