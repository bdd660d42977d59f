"""Correct the rollout/training mismatch: importance weights and rejection masks from rollout log-probs.

The rollout engine (vLLM) samples token ``y_t`` with probability ``pi_rollout``; the loss assumes
it came from the trainer's ``pi_old``. With different numerics (bf16 / FP8 rollouts, kernels,
NPU) the two differ and on-policy RL is silently off-policy. Per response token, with
``d_t = log pi_old(y_t) - log pi_rollout(y_t)`` (``log pi - log pi_rollout`` in *bypass* mode,
where the rollout policy is itself the behaviour policy of the PPO ratio; the caller passes the
current log-probs as ``train_log_probs`` then), this module returns

* **importance weights** ``w`` (detached; 0 on padding), at one of three levels:

  ===============  ==============================================  =================================
  ``token``        ``w_t = exp(d_t)``                              TIS (Yao et al. 2025, "Your
                                                                   efficient RL framework secretly
                                                                   brings you off-policy RL
                                                                   training"); verl ``rollout_is=token``
  ``sequence``     ``w = exp(sum_t d_t)`` (product of ratios)      verl ``rollout_is=sequence``
  ``geometric``    ``w = exp(mean_t d_t)`` (geometric mean)        GSPO-style length-normalised
                                                                   sequence weight (arXiv 2507.18071)
  ===============  ==============================================  =================================

  ``is_threshold=C`` truncates ``w <- min(w, C)`` (TIS, ``C = 2`` in Yao et al.); a pair
  ``(low, high)`` instead zeroes weights outside ``[low, high]`` (IcePop, Ling team 2025;
  verl's ``"low_high"`` threshold; masked IS / MIS, Liu et al. 2025 "When speed kills
  stability"); ``is_clamp_low=L`` also raises weights below ``L`` to ``L`` (OpenRLHF's
  ``is_correction_mode=clip``, which clamps to ``[low, high]``). ``batch_normalize`` rescales
  the weights to mean 1 over the batch (verl ``rollout_is_batch_normalize``).

* **a rejection mask**: tokens or whole sequences whose divergence statistic lies outside its
  bounds are dropped (``mask`` is ``response_mask`` with them cleared, and their weight is 0).
  Options (several may be combined; all must pass):

  ==========================  =====================================================  ===========
  ``token_k1``                ``-d_t`` in ``[log lo, log hi]`` (``hi`` alone: lo = 1/hi)  verl
  ``token_k2`` / ``_k3``      ``d^2/2`` / ``exp(d) - 1 - d`` <= hi                     verl
  ``seq_sum_k1..3``           sum over the sequence of the token statistic             verl
  ``seq_mean_k1..3``          mean over the sequence (k1: bounds in log space)         verl
  ``seq_max_k2`` / ``_k3``    max over the sequence                                    verl
  ``token_ratio``             ``exp(d_t)`` in ``[lo, hi]`` (IcePop / token MIS)        OpenRLHF token/mask/ratio
  ``seq_mean_ratio``          ``exp(mean d)`` in ``[lo, hi]`` (geometric-mean MIS)     OpenRLHF seq/mask/ratio
  ``seq_sum_ratio``           ``exp(sum d)`` in ``[lo, hi]`` (sequence MIS)            Liu et al. 2025 (seq-MIS)
  ``seq_max_abs_log_ratio``   ``max_t |d_t|`` <= hi                                    divergence gate
  ``token_tv`` / ``seq_mean_tv``  ``|P - Q|`` (P, Q clamped to [1e-6, 1-1e-6]) <= hi   OpenRLHF gating=tv
  ``token_binary_kl`` / ``seq_mean_binary_kl``  Bernoulli KL(Q || P) <= hi             OpenRLHF gating=binary_kl
  ==========================  =====================================================  ===========

  (``P = pi_old``, ``Q = pi_rollout`` of the sampled token.) The ``k`` statistics clamp ``d``
  to ``+-20`` first, as verl does (``SAFETY_BOUND``); the ``k3_kl`` metric does not, as verl's.

* **metrics** (0-dim tensors, ``rollout_corr/`` prefix added by the hosts); names that verl also
  reports are listed in :data:`VERL_METRIC_NAMES` (parity-tested against verl 0.9.1).

Applying it (:func:`apply_rollout_correction`): ``L_t <- w_t * L_t`` on kept tokens, 0 on rejected
and padded ones, the aggregation's mask and denominators unchanged (OpenRLHF's behaviour: a
rejected token counts as a zero-loss token). Padding never reaches a result: every reduction
selects with ``torch.where``, so NaN or inf in padded positions is ignored. With identical
rollout and training log-probs every ``d_t`` is exactly 0, every weight exactly 1 and nothing
is rejected (for any bounds containing the statistic's ideal value), so the corrected loss
equals the uncorrected one bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

from .checks import check_finite

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp: verl's SAFETY_BOUND
IS_LEVELS = ("token", "sequence", "geometric")
VERL_REJECTION_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
RLHF_EXT_REJECTION_OPTIONS = (
    "token_ratio", "seq_mean_ratio", "seq_sum_ratio", "seq_max_abs_log_ratio",
    "token_tv", "seq_mean_tv", "token_binary_kl", "seq_mean_binary_kl",
)  # fmt: skip
REJECTION_OPTIONS = VERL_REJECTION_OPTIONS + RLHF_EXT_REJECTION_OPTIONS
# options bounded on both sides (a ratio, or k1 = -log ratio); the others take an upper bound only
_TWO_SIDED = ("token_k1", "seq_sum_k1", "seq_mean_k1", "token_ratio", "seq_mean_ratio", "seq_sum_ratio")
_TOKEN_LEVEL = ("token_k1", "token_k2", "token_k3", "token_ratio", "token_tv", "token_binary_kl")
_PROB_EPS = 1e-6  # OpenRLHF's clamp keeping the Bernoulli KL's logs finite

# rlhf_ext metric -> verl 0.9.1 ``rollout_corr/<name>`` of the same quantity
VERL_METRIC_NAMES = {
    "is_mean": "rollout_is_mean",
    "is_max": "rollout_is_max",
    "is_min": "rollout_is_min",
    "is_std": "rollout_is_std",
    "is_fraction_high": "rollout_is_ratio_fraction_high",
    "is_fraction_low": "rollout_is_ratio_fraction_low",
    "ess": "rollout_is_eff_sample_size",
    "is_batch_norm_factor": "rollout_is_batch_norm_factor",
    "rejected_fraction": "rollout_rs_masked_fraction",
    "seq_rejected_fraction": "rollout_rs_seq_masked_fraction",
    "k1_kl": "kl",
    "k3_kl": "k3_kl",
}

Bounds = Tuple[Optional[float], float]
Threshold = Union[float, Tuple[float, float], str]


@dataclass(frozen=True)
class RolloutCorrection:
    """What to correct and how; see the module docstring. ``RolloutCorrection()`` corrects nothing."""

    is_level: Optional[str] = None
    is_threshold: Optional[Threshold] = 2.0
    is_clamp_low: Optional[float] = None
    batch_normalize: bool = False
    rejection: Mapping[str, Threshold] = field(default_factory=dict)

    def __post_init__(self):
        if self.is_level is not None and self.is_level not in IS_LEVELS:
            raise ValueError(f"unknown importance-sampling level {self.is_level!r}; choose from {', '.join(IS_LEVELS)}")
        if self.is_level is not None and self.is_threshold is not None:
            parse_is_threshold(self.is_threshold)
        if self.is_clamp_low is not None and not (self.is_clamp_low > 0 and math.isfinite(self.is_clamp_low)):
            raise ValueError(f"is_clamp_low must be a positive number, got {self.is_clamp_low!r}")
        for option, spec in self.rejection.items():
            rejection_bounds(option, spec)

    @property
    def active(self) -> bool:
        return self.is_level is not None or bool(self.rejection)


@dataclass
class CorrectionResult:
    """``weights``: detached IS weights (1 where no level is set; 0 on padding and rejected tokens);
    ``mask``: the response mask with rejected tokens cleared (bool); ``metrics``: 0-dim tensors."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: Dict[str, torch.Tensor]


# --- thresholds ----------------------------------------------------------------------------------


def rejection_options(options) -> Tuple[str, ...]:
    """A ``rollout_rs`` setting (``"a,b"``, a list, or empty / None / False) as its option names."""
    if options is None or options is False or options == "":
        return ()
    parts = options.split(",") if isinstance(options, str) else [str(o) for o in options]
    return tuple(name.strip() for name in parts if name.strip())


def rejection_thresholds(options, thresholds, *, options_key: str = "rollout_rs",
                         thresholds_key: str = "rollout_rs_threshold",
                         thresholds_alone: bool = False) -> Dict[str, Threshold]:
    """Every host's ``rollout_rs`` / ``rollout_rs_threshold`` pair -> ``{option: threshold}`` (the
    :attr:`RolloutCorrection.rejection` mapping; each threshold is checked there).

    ``options``: ``"a,b"`` or a list. ``thresholds``: one value for all the options, a comma string
    as verl writes it, or a sequence with one entry per option; an entry is a number, ``"lo_hi"`` or
    ``[lo, hi]``. ``options_key`` / ``thresholds_key`` name the two settings as the host spells them,
    in the ``ValueError`` messages; ``thresholds_alone``: a threshold without options is ignored
    (verl's config carries one by default) instead of refused."""
    names = rejection_options(options)
    if not names:
        if thresholds is not None and not thresholds_alone:
            raise ValueError(f"{thresholds_key} needs {options_key}")
        return {}
    if thresholds is None:
        raise ValueError(f"{options_key} needs {thresholds_key} (one bound per option, or one for all)")
    if isinstance(thresholds, str):
        values = [v.strip() for v in thresholds.split(",") if v.strip()]
    elif isinstance(thresholds, Sequence):
        values = list(thresholds)
    else:
        values = [thresholds]
    if len(values) == 1:
        values = values * len(names)
    if len(values) != len(names):
        raise ValueError(f"{thresholds_key}: {len(values)} thresholds for {len(names)} rollout_rs options "
                         f"({', '.join(names)})")
    return {name: (list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v)
            for name, v in zip(names, values)}


def _positive(value, what: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return value


def _pair(spec) -> Optional[Tuple[str, str]]:
    if isinstance(spec, str) and "_" in spec:
        low, high = spec.split("_", 1)
        return low, high
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ValueError(f"a threshold pair is (low, high), got {spec!r}")
        return spec[0], spec[1]
    return None


def parse_is_threshold(spec: Threshold) -> Tuple[Optional[float], float]:
    """``C`` (or ``"C"``) -> ``(None, C)``: truncate; ``(lo, hi)`` or ``"lo_hi"`` -> zero outside ``[lo, hi]``."""
    if isinstance(spec, bool):
        raise ValueError("the importance-sampling threshold is a number or a (low, high) pair, not a boolean")
    pair = _pair(spec)
    if pair is None:
        return None, _positive(spec, "importance-sampling threshold")
    low, high = _positive(pair[0], "importance-sampling lower bound"), _positive(pair[1], "importance-sampling upper bound")
    if low > high:
        raise ValueError(f"importance-sampling bounds: lower {low} > upper {high}")
    return low, high


def _ratio_lower_bound(value, option: str) -> float:
    """A ratio's lower bound: positive, or exactly 0 for "no lower bound" (a ratio is never below 0)."""
    try:
        if float(value) == 0.0:
            return 0.0
    except (TypeError, ValueError):
        pass
    return _positive(value, f"{option} lower bound")


def rejection_bounds(option: str, spec: Threshold) -> Bounds:
    """``(low, high)`` for ``option`` (``low`` ``None`` for upper-bound-only statistics).

    Two-sided options take ``(lo, hi)`` / ``"lo_hi"``, or ``hi`` alone meaning ``lo = 1/hi``
    (verl's rule for k1). The k1 options' bounds are on ``exp(k1) = pi_rollout / pi_old``
    and compared in log space, as verl does. Their bounds are on a ratio, so ``lo = 0`` means
    no lower bound (OpenRLHF's one-value ``is_correction_threshold HIGH`` is ``[0, HIGH]``).
    """
    if option not in REJECTION_OPTIONS:
        raise ValueError(f"unknown rejection option {option!r}; choose from {', '.join(REJECTION_OPTIONS)}")
    if isinstance(spec, bool) or spec is None:
        raise ValueError(f"rejection option {option!r} needs a threshold, got {spec!r}")
    pair = _pair(spec)
    if option in _TWO_SIDED:
        if pair is None:
            high = _positive(spec, f"{option} threshold")
            return 1.0 / high, high
        low, high = _ratio_lower_bound(pair[0], option), _positive(pair[1], f"{option} upper bound")
        if low > high:
            raise ValueError(f"{option}: lower bound {low} > upper bound {high}")
        return low, high
    if pair is not None:
        raise ValueError(f"rejection option {option!r} takes an upper bound only, got {spec!r}")
    return None, _positive(spec, f"{option} threshold")


# --- masked reductions that never read padding -----------------------------------------------------


def _zero(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _msum(x, mask, dim=None):
    return _zero(x, mask).sum() if dim is None else _zero(x, mask).sum(dim=dim)


def _mmean(x, mask, dim=None):
    n = mask.sum() if dim is None else mask.sum(dim=dim)
    return _msum(x, mask, dim) / n.clamp(min=1).to(x.dtype)


def _mmax(x, mask, dim=None):
    filled = torch.where(mask, x, torch.full((), -math.inf, dtype=x.dtype, device=x.device))
    return filled.max() if dim is None else filled.max(dim=dim).values


def _mmin(x, mask, dim=None):
    filled = torch.where(mask, x, torch.full((), math.inf, dtype=x.dtype, device=x.device))
    return filled.min() if dim is None else filled.min(dim=dim).values


# --- the correction ------------------------------------------------------------------------------


def _token_statistic(kind: str, d: torch.Tensor, train_lp: torch.Tensor, rollout_lp: torch.Tensor):
    ds = d.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if kind == "k1":
        return -ds
    if kind == "k2":
        return 0.5 * ds * ds
    if kind == "k3":
        return ds.exp() - 1.0 - ds
    if kind in ("ratio", "log_ratio"):
        return ds
    if kind == "abs_log_ratio":
        return d.abs()
    q = rollout_lp.exp().clamp(_PROB_EPS, 1 - _PROB_EPS)
    p = train_lp.exp().clamp(_PROB_EPS, 1 - _PROB_EPS)
    if kind == "tv":
        return (q - p).abs()
    # binary_kl: KL(Bernoulli(q) || Bernoulli(p)), rollout first, as OpenRLHF 0.11.2 computes it
    return q * (q / p).log() + (1 - q) * ((1 - q) / (1 - p)).log()


def _option_parts(option: str) -> Tuple[str, str]:
    """``(aggregation, statistic)``: ``seq_mean_k3`` -> ``("seq_mean", "k3")``."""
    if option.startswith("token_"):
        return "token", option[len("token_"):]
    for agg in ("seq_sum", "seq_mean", "seq_max"):
        if option.startswith(agg + "_"):
            return agg, option[len(agg) + 1:]
    raise ValueError(f"unknown rejection option {option!r}")


def _rejection_keep(option, bounds, d, train_lp, rollout_lp, mask, metrics):
    agg, kind = _option_parts(option)
    low, high = bounds
    stat = _token_statistic(kind, d, train_lp, rollout_lp)
    if agg == "seq_sum":
        stat = _msum(stat, mask, -1).unsqueeze(-1)
    elif agg == "seq_mean":
        stat = _mmean(stat, mask, -1).unsqueeze(-1)
    elif agg == "seq_max":
        m = _mmax(stat, mask, -1)
        stat = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m).unsqueeze(-1)
    # where the bounds are ratios, compare in log space (k1 = -log ratio, ratio via log ratio)
    if kind in ("k1", "ratio"):
        keep = (stat >= (math.log(low) if low > 0 else -math.inf)) & (stat <= math.log(high))
    else:
        keep = stat <= high
    keep = keep.expand_as(mask) & mask
    token_stat = stat.expand_as(mask)
    rejected = mask & ~keep
    metrics[f"rs_{option}_mean"] = _mmean(token_stat, mask)
    metrics[f"rs_{option}_masked_fraction"] = _mmean(rejected.to(d.dtype), mask)
    valid = mask.any(dim=-1)
    seq_rej = rejected.any(dim=-1) & valid
    metrics[f"rs_{option}_seq_masked_fraction"] = seq_rej.to(d.dtype).sum() / valid.sum().clamp(min=1).to(d.dtype)
    return keep | ~mask


def rollout_correction(
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrection,
) -> CorrectionResult:
    """Weights, rejection mask and metrics for one batch ``[batch, response_len]`` (module docstring).

    ``train_log_probs`` is ``log pi_old`` (or the current ``log pi`` in bypass mode); it is
    detached here, so the weights carry no gradient. Computed in the inputs' dtype promoted to
    at least float32. A NaN or +inf log-probability on a response token is an error that names
    how many (inside :func:`rlhf_ext.algorithms.deferred_finite_checks`, i.e. under the run's
    non-finite guard, a recorded finding instead); padding may hold anything.
    """
    train_lp = torch.as_tensor(train_log_probs).detach()
    rollout_lp = torch.as_tensor(rollout_log_probs).detach()
    mask = torch.as_tensor(response_mask).bool()
    if train_lp.shape != rollout_lp.shape or train_lp.shape != mask.shape:
        raise ValueError(
            f"rollout correction: shapes differ: train_log_probs {tuple(train_lp.shape)}, rollout_log_probs "
            f"{tuple(rollout_lp.shape)}, response_mask {tuple(mask.shape)}"
        )
    if train_lp.dim() != 2:
        raise ValueError(f"rollout correction expects [batch, response_len] tensors, got {tuple(train_lp.shape)}")
    dtype = torch.promote_types(torch.promote_types(train_lp.dtype, rollout_lp.dtype), torch.float32)
    train_lp, rollout_lp = train_lp.to(dtype), rollout_lp.to(device=train_lp.device, dtype=dtype)
    mask = mask.to(train_lp.device)
    for name, lp in (("training", train_lp), ("rollout", rollout_lp)):
        # -inf is a legitimate log-probability (probability 0); NaN and +inf are not. Under the
        # non-finite guard the finding is recorded and the NaN flows on for the guard to report.
        check_finite(torch.where(lp == -math.inf, torch.zeros_like(lp), lp),
                     f"rollout correction: {name} log-probabilities", mask)

    # both -inf (a token neither policy could sample) counts as agreement
    d = _zero(torch.where(train_lp == rollout_lp, torch.zeros_like(train_lp), train_lp - rollout_lp), mask)
    metrics: Dict[str, torch.Tensor] = {}
    valid = mask.any(dim=-1)

    ones = mask.to(dtype)
    weights = ones
    if config.is_level is not None:
        weights = _importance_weights(d, mask, config, metrics)

    keep = mask
    if config.rejection:
        keep_all = torch.ones_like(mask)
        for option, spec in config.rejection.items():
            keep_all = keep_all & _rejection_keep(
                option, rejection_bounds(option, spec), d, train_lp, rollout_lp, mask, metrics)
        keep = mask & keep_all
        rejected = mask & ~keep
        metrics["rejected_fraction"] = _mmean(rejected.to(dtype), mask)
        metrics["seq_rejected_fraction"] = rejected.any(dim=-1).to(dtype).mean()
        weights = _zero(weights, keep)

    # the mismatch itself (the same tokens as rollout_mismatch/*; verl's off-policy metrics)
    metrics["k1_kl"] = _mmean(-d, mask)
    # verl's k3_kl (rollout_corr_helper.compute_offpolicy_metrics): d not clamped, so an extreme ratio gives
    # a huge (or inf) mean, as verl's; d = +inf (a rollout probability of 0) is inf, where verl's inf - inf is NaN
    metrics["k3_kl"] = _mmean((d.exp() - 1.0 - d).nan_to_num(nan=math.inf), mask)
    metrics["weight_mean"] = _mmean(weights, mask)
    metrics["weight_max"] = _mmax(weights, mask) if bool(mask.any()) else torch.zeros((), dtype=dtype)
    metrics["tokens"] = mask.sum().to(dtype)
    metrics["sequences"] = valid.sum().to(dtype)
    return CorrectionResult(weights=weights.detach(), mask=keep, metrics={k: v.detach() for k, v in metrics.items()})


def _importance_weights(d, mask, config: RolloutCorrection, metrics) -> torch.Tensor:
    dtype = d.dtype
    low, high = (None, math.inf) if config.is_threshold is None else parse_is_threshold(config.is_threshold)
    level = config.is_level
    if level == "token":
        log_w = d
        raw = _zero(d.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp(), mask)
    else:
        agg = _msum(d, mask, -1) if level == "sequence" else _mmean(d, mask, -1)
        log_w = agg.unsqueeze(-1)
        raw = _zero(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(d), mask)

    if low is None:
        w = raw.clamp(max=high)
    else:
        inside = (raw >= low) & (raw <= high)
        w = torch.where(inside, raw, torch.zeros_like(raw))
    if config.is_clamp_low is not None:
        w = _zero(w.clamp(min=config.is_clamp_low), mask)
    metrics["is_truncated_fraction"] = _mmean((w != raw).to(dtype), mask)

    lower = (1.0 / high if math.isfinite(high) else 0.0) if low is None else low
    if level == "token":
        metrics["is_mean"] = _mmean(w, mask)
        metrics["is_max"] = _mmax(w, mask)
        metrics["is_min"] = _mmin(w, mask)
        metrics["is_fraction_high"] = _mmean((raw > high).to(dtype), mask)
        metrics["is_fraction_low"] = _mmean((raw < lower).to(dtype), mask)
    else:
        # per-sequence statistics over every row, as verl reports them (log space, before truncation)
        metrics["is_mean"] = _mmean(w, mask)
        metrics["is_max"] = log_w.max().clamp(max=SAFETY_BOUND).exp()
        metrics["is_min"] = log_w.min().exp()
        metrics["is_fraction_high"] = (log_w > math.log(high)).to(dtype).mean()
        metrics["is_fraction_low"] = (log_w < math.log(lower) if lower > 0 else torch.zeros_like(log_w, dtype=torch.bool)).to(dtype).mean()

    # spread and Kish's effective sample size of the applied weights, capped at the upper bound as verl does
    capped = w.clamp(min=0.0, max=high)
    mean_c = _mmean(capped, mask)
    if int(mask.sum()) > 1:
        metrics["is_std"] = (_mmean(capped * capped, mask) - mean_c * mean_c).clamp(min=0).sqrt()
    else:
        metrics["is_std"] = torch.zeros((), dtype=dtype)
    second = _mmean(capped * capped, mask)
    metrics["ess"] = torch.where(second > 0, mean_c * mean_c / second.clamp(min=1e-300), torch.zeros_like(second))

    if config.batch_normalize:
        if level == "token":
            mean = _mmean(w, mask)
        else:
            valid = mask.any(dim=-1)
            seq_w = _mmean(w, mask, -1)
            mean = _msum(seq_w, valid) / valid.sum().clamp(min=1).to(dtype)
        if float(mean) > 1e-8:
            w = w / mean
            metrics["is_batch_norm_factor"] = mean
        else:
            metrics["is_batch_norm_factor"] = torch.ones((), dtype=dtype)
    return w


def apply_rollout_correction(per_token_loss: torch.Tensor, result: CorrectionResult) -> torch.Tensor:
    """``w_t * L_t`` on kept tokens, 0 elsewhere (NaN in dropped positions never propagates)."""
    w = result.weights.to(device=per_token_loss.device, dtype=per_token_loss.dtype)
    return torch.where(result.mask, per_token_loss * w, torch.zeros((), dtype=per_token_loss.dtype,
                                                                     device=per_token_loss.device))


# --- OpenRLHF 0.11.2's --algo.advantage.is_correction_* in these terms ---------------------------


def openrlhf_thresholds(threshold) -> Tuple[float, float]:
    """``(low, high)`` of ``--algo.advantage.is_correction_threshold``: ``HIGH`` alone is ``[0, HIGH]``
    (OpenRLHF 0.11.2's ``train_ppo_ray.py`` inserts the 0.0), ``LOW HIGH`` as given.

    Refused with one line: no value or more than two, a non-number, a non-finite bound, ``HIGH <= 0``
    (every token would be dropped) and ``LOW > HIGH`` (OpenRLHF accepts these and drops everything).
    """
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        threshold = [threshold]
    values = list(threshold) if isinstance(threshold, (list, tuple)) else None
    if not values or len(values) > 2:
        raise ValueError(f"is_correction_threshold takes HIGH or LOW HIGH, got {threshold!r}")
    try:
        numbers = [float(v) for v in values if not isinstance(v, bool)]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != len(values) or not all(math.isfinite(v) for v in numbers):
        raise ValueError(f"is_correction_threshold takes finite numbers, got {threshold!r}")
    low, high = (0.0, numbers[0]) if len(numbers) == 1 else (numbers[0], numbers[1])
    if not high > 0:
        raise ValueError(f"is_correction_threshold: the upper bound must be > 0, got {high} (it would drop every token)")
    if low > high:
        raise ValueError(f"is_correction_threshold: lower bound {low} > upper bound {high} (it would drop every token)")
    return low, high


def openrlhf_correction(level: str, mode: str, gating: str, threshold) -> RolloutCorrection:
    """The correction OpenRLHF 0.11.2's ``PolicyLoss`` applies for its flags (``models/loss.py``);
    ``threshold`` is ``[HIGH]`` or ``[LOW, HIGH]`` (:func:`openrlhf_thresholds`):

    * ``mode=clip`` (token level, ratio gating): the token ratio clamped to ``[low, high]``
      (``low <= 0``: truncated at ``high`` only, TIS);
    * ``mode=mask``: survivors keep their *untruncated* token ratio; the gate drops tokens
      (``level=token``) or whole sequences (``level=seq``, on the ratio's geometric mean or the
      divergence's mean) whose statistic is outside ``[low, high]`` (``low <= 0`` on the ratio:
      no lower bound, as a ratio is never negative). Divergence gates (``binary_kl``, ``tv``)
      take an upper bound only (``low <= 0``, else refused as OpenRLHF refuses it).

    One deliberate difference: OpenRLHF compares a divergence with ``low`` too, and in float32 its
    Bernoulli KL of two nearly equal probabilities rounds below 0 (about -1e-7) on a good share of
    tokens, so with ``low = 0`` (the one-value form) it drops tokens whose policies *agree*. Here a
    divergence has an upper bound only, as OpenRLHF's help documents ("a trust region, upper bound
    only"); the results are otherwise identical (tests/test_rollout_correction.py).
    """
    if level == "off":
        return RolloutCorrection()
    if level not in ("token", "seq"):
        raise ValueError(f"is_correction_level must be off/token/seq, got {level!r}")
    if mode not in ("mask", "clip"):
        raise ValueError(f"is_correction_mode must be mask/clip, got {mode!r}")
    if gating not in ("ratio", "binary_kl", "tv"):
        raise ValueError(f"is_correction_gating must be ratio/binary_kl/tv, got {gating!r}")
    if mode == "clip" and (level != "token" or gating != "ratio"):
        raise ValueError("is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio")
    low, high = openrlhf_thresholds(threshold)
    if mode == "clip":
        return RolloutCorrection(is_level="token", is_threshold=high, is_clamp_low=low if low > 0 else None)
    prefix = "token" if level == "token" else "seq_mean"
    if gating == "ratio":
        return RolloutCorrection(is_level="token", is_threshold=None,
                                 rejection={f"{prefix}_ratio": (max(low, 0.0), high)})
    if low > 0:
        raise ValueError(f"is_correction_gating={gating} takes an upper bound only (a single delta): give "
                         f"is_correction_threshold HIGH, not the lower bound {low}")
    return RolloutCorrection(is_level="token", is_threshold=None, rejection={f"{prefix}_{gating}": high})
