"""Staleness-aware objectives inside OpenRLHF's actor: AReaL's decoupled PPO and M2PO.

The three policies of :mod:`rlhf_ext.algorithms.staleness` are, in OpenRLHF 0.11.2:

* behaviour ``pi_behav``: ``Experience.rollout_log_probs``, the log-probs vLLM returned with the
  tokens, never recomputed (with ``--train.async_enable`` from a policy up to
  ``--train.async_queue_size`` versions old, :mod:`.policy_lag`);
* proximal ``pi_prox``: ``Experience.action_log_probs`` (``old_log_probs`` in the loss), computed by
  the experience maker with the trainer's weights at the start of the step;
* current ``pi_theta``: the actor's log-probs in ``training_step``.

Flags (``--rlhf_ext.*``):

* ``decoupled_loss``: the policy loss -- any registered one, OpenRLHF's ``ppo`` / ``gspo`` then
  running as rlhf_ext's functions of the same name -- taken against ``pi_prox`` and weighted per token
  by ``w = pi_prox / pi_behav`` (arXiv 2505.24298), ``w > behave_imp_weight_cap`` (default 5) masked
  or clamped (``behave_imp_weight_mode``);
* ``prox_logp {recompute,loglinear,linear}``: ``recompute`` uses OpenRLHF's ``pi_prox`` as is;
  ``loglinear`` / ``linear`` replace it by AReaL's version interpolation between ``pi_behav`` and
  ``pi_theta`` with each sample's policy lag ``L`` (stamped by :mod:`.policy_lag`): AReaL's
  ``v_theta = v_prox + 1`` gives ``alpha = L / (L + 1)``. Async only (in synchronous mode every lag is
  0 and the approximation is the behaviour policy). OpenRLHF computes ``pi_prox`` anyway, so the
  approximation saves no forward pass here; it is there to train as AReaL does, and
  ``decoupled/prox_abs_error`` (mean ``|approx - recomputed|``) measures it (AReaL's ``metrics`` mode);
* ``m2po_threshold TAU``: M2PO's token mask (arXiv 2510.01161) from ``pi_prox`` (OpenRLHF's) and
  ``pi_behav``, per micro-batch as in AReaL; with every loss (OpenRLHF's own through the zeroed
  advantages of :mod:`.loss_masks`).

Both need vLLM's log-probs: the flags switch ``--rlhf_ext.mismatch_metrics`` on (its seams request
them). Metrics (``decoupled/*``, ``m2po/*``) join the actor's status, the console, wandb and the run
record's ``metrics.jsonl``; with ``--rlhf_ext.step_metrics off`` none is computed or logged.

Other hosts: verl 0.9.1 ships the decoupled three-policy loss itself (its rollout correction
without ``bypass_mode``, docs/rollout_correction.md); MindSpeed-RL has no asynchronous trainer. The
flags are OpenRLHF's only.
"""

from __future__ import annotations

import contextlib
import math
from typing import Dict, NamedTuple, Optional

from .config import rlhf_ext_view, setting

DECOUPLED_FLAG = "--rlhf_ext.decoupled_loss"
PROX_FLAG = "--rlhf_ext.prox_logp"
CAP_FLAG = "--rlhf_ext.behave_imp_weight_cap"
MODE_FLAG = "--rlhf_ext.behave_imp_weight_mode"
M2PO_FLAG = "--rlhf_ext.m2po_threshold"
LAG_INFO_KEY = "rlhf_ext/sample_policy_lag"  # per-sample, in Experience.info, popped before the status
METRICS_ATTR = "_rlhf_ext_staleness_metrics"
DEFAULT_CAP = 5.0  # rlhf_ext.algorithms.staleness.DEFAULT_WEIGHT_CAP (no torch import here)


class Settings(NamedTuple):
    decoupled: bool
    prox: str
    cap: Optional[float]
    action: str
    m2po: Optional[float]


def add_arguments(group) -> None:
    group.add_argument(
        DECOUPLED_FLAG, action="store_true", default=False,
        help="AReaL's decoupled PPO objective (arXiv 2505.24298): the policy loss around the proximal policy "
        "(the trainer's), weighted by pi_prox / pi_behav (vLLM's log-probs); for --train.async_enable",
    )  # fmt: skip
    group.add_argument(
        PROX_FLAG, default="recompute", choices=("recompute", "loglinear", "linear"),
        help="the proximal log-probs: OpenRLHF's recomputed ones, or AReaL's interpolation by policy version "
        "(async only)",
    )  # fmt: skip
    group.add_argument(
        CAP_FLAG, default=None, metavar="C|none",
        help=f"cap of the decoupled behaviour weight pi_prox / pi_behav (default {DEFAULT_CAP}; none: uncapped)",
    )  # fmt: skip
    group.add_argument(
        MODE_FLAG, default="mask", choices=("mask", "clamp"),
        help="a behaviour weight above the cap: its token carries no gradient (mask) or the weight is the cap",
    )  # fmt: skip
    group.add_argument(
        M2PO_FLAG, type=float, default=None, metavar="TAU",
        help="M2PO (arXiv 2510.01161): mask the tokens with the largest squared log-ratio between the proximal "
        "and the behaviour policy until the micro-batch's second moment is below TAU; any loss",
    )  # fmt: skip


def _cap(text) -> Optional[float]:
    if text is None:
        return DEFAULT_CAP
    if isinstance(text, str) and text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{CAP_FLAG} must be a number > 1 or 'none', got {text!r}") from None
    if not (value > 1 and math.isfinite(value)):
        raise ValueError(f"{CAP_FLAG} must be a finite number > 1 or 'none', got {text!r}")
    return value


def settings(args) -> Optional[Settings]:
    """The flags as :class:`Settings`, ``None`` when neither objective is asked for."""
    decoupled = bool(setting(args, "rlhf_ext.decoupled_loss", False))
    m2po = setting(args, "rlhf_ext.m2po_threshold")
    if not decoupled and m2po is None:
        return None
    return Settings(decoupled, setting(args, "rlhf_ext.prox_logp", "recompute"),
                    _cap(setting(args, "rlhf_ext.behave_imp_weight_cap")),
                    setting(args, "rlhf_ext.behave_imp_weight_mode", "mask"), m2po)


def finalize(namespace) -> Dict[str, str]:
    """Validate the flags (driver, before the mismatch flags are finalized); switch vLLM's log-probs on."""
    def get(dotted, default=None):
        value = getattr(namespace, dotted, None)
        return default if value is None else value

    view = rlhf_ext_view(namespace)
    decoupled_only = (get("rlhf_ext.prox_logp", "recompute") != "recompute"
                      or get("rlhf_ext.behave_imp_weight_cap") is not None)
    if decoupled_only and not get("rlhf_ext.decoupled_loss", False):
        raise ValueError(f"{PROX_FLAG} / {CAP_FLAG} set the decoupled objective: add {DECOUPLED_FLAG}")
    chosen = settings(view)
    if chosen is None:
        return {}
    if chosen.m2po is not None and not (chosen.m2po > 0 and math.isfinite(chosen.m2po)):
        raise ValueError(f"{M2PO_FLAG} must be a finite number > 0, got {chosen.m2po}")
    if chosen.decoupled:
        if chosen.prox != "recompute" and not get("train.async_enable", False):
            raise ValueError(f"{PROX_FLAG} {chosen.prox} interpolates by policy version, which only "
                             "--train.async_enable has (in synchronous mode every sample's lag is 0 and the "
                             "approximation is the behaviour policy); use --rlhf_ext.prox_logp recompute")
        if (get("rlhf_ext.rollout_is") is not None or get("rlhf_ext.rollout_rs") is not None
                or get("algo.advantage.is_correction_level", "off") != "off"):
            raise ValueError(f"{DECOUPLED_FLAG} already weights every token by pi_prox / pi_behav (vLLM's log-probs); "
                             "a rollout correction (--rlhf_ext.rollout_is/_rs, --algo.advantage.is_correction_*) "
                             "would weight it twice: choose one")
    if float(get("rollout.top_p", 1.0)) < 1.0:
        raise ValueError(f"{DECOUPLED_FLAG if chosen.decoupled else M2PO_FLAG} with --rollout.top_p "
                         f"{get('rollout.top_p')}: vLLM's log-probs are those of the top-p-truncated distribution, "
                         "so pi_prox / pi_behav would mostly measure the truncation, not the staleness; sample with "
                         "--rollout.top_p 1.0")
    setattr(namespace, "rlhf_ext.mismatch_metrics", True)  # its seams request vLLM's log-probs
    return {}


def summary(namespace) -> str:
    parts = []
    if getattr(namespace, "rlhf_ext.decoupled_loss", False):
        cap = getattr(namespace, "rlhf_ext.behave_imp_weight_cap", None)
        parts.append(f"decoupled_loss(prox={getattr(namespace, 'rlhf_ext.prox_logp', 'recompute')}, "
                     f"cap={DEFAULT_CAP if cap is None else cap} "
                     f"{getattr(namespace, 'rlhf_ext.behave_imp_weight_mode', 'mask')})")
    tau = getattr(namespace, "rlhf_ext.m2po_threshold", None)
    if tau is not None:
        parts.append(f"m2po_threshold={tau}")
    return ", ".join(parts)


# --- trainer side (PPOTrainer actor): each sample's lag travels in its info ------------------------------


def attach_lags(args, rollout_samples, lags_by_sample) -> None:
    """Put each sample's policy lag into ``Experience.info`` (only for a version-interpolated ``pi_prox``)."""
    chosen = settings(args)
    if chosen is None or not chosen.decoupled or chosen.prox == "recompute":
        return
    import torch

    for exp, lag in zip(rollout_samples, lags_by_sample):
        n = exp.sequences.shape[0] if getattr(exp, "sequences", None) is not None else 1
        exp.info[LAG_INFO_KEY] = torch.full((n,), float(lag), dtype=torch.float32)


# --- actor side (PolicyModelActor) --------------------------------------------------------------------------


def configure(loss_fn, args, call_kwargs) -> None:
    """After ``configure_from_args``: the settings on ``loss_fn``; OpenRLHF's ``ppo`` / ``gspo`` run as
    rlhf_ext's functions (called with ``call_kwargs(loss_fn, fn)``) under the decoupled objective."""
    chosen = settings(args)
    loss_fn.staleness = chosen
    if chosen is None or not chosen.decoupled:
        return
    from .rollout_correction import run_as_registered

    run_as_registered(loss_fn, call_kwargs)


@contextlib.contextmanager
def micro_batch(trainer, experience):
    """Around ``training_step``: hand the loss the micro-batch's per-sample lags (out of ``info``, so they
    are not averaged into the status) and collect the objectives' metrics."""
    loss_fn = getattr(trainer, "actor_loss_fn", None)
    lag = experience.info.pop(LAG_INFO_KEY, None)
    if loss_fn is None or getattr(loss_fn, "staleness", None) is None:
        yield
        return
    loss_fn.pending_lag = _as_tensor(lag)
    setattr(loss_fn, METRICS_ATTR, {})
    try:
        yield
    finally:
        loss_fn.pending_lag = None


def _as_tensor(values):
    """The replay buffer hands ``info`` to a micro-batch as a tensor or as a list of per-sample values."""
    if values is None:
        return None
    import torch

    if isinstance(values, torch.Tensor):
        return values.reshape(-1).float()
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def take_metrics(loss_fn) -> Dict[str, object]:
    """The objectives' metrics of the last micro-batch (emptied)."""
    metrics = getattr(loss_fn, METRICS_ATTR, None) or {}
    setattr(loss_fn, METRICS_ATTR, {})
    return metrics


def _record(loss_fn, metrics) -> None:
    store = getattr(loss_fn, METRICS_ATTR, None)
    if store is None:
        store = {}
        setattr(loss_fn, METRICS_ATTR, store)
    store.update({k: v.detach() for k, v in metrics.items()})


def m2po_keep(loss_fn, old_log_probs, rollout_log_probs, action_mask):
    """M2PO's bool ``[B, T]`` keep mask for the micro-batch, or None when M2PO is off."""
    chosen = getattr(loss_fn, "staleness", None)
    if chosen is None or chosen.m2po is None:
        return None
    import torch

    from rlhf_ext.algorithms.staleness import m2po_mask

    if rollout_log_probs is None:
        raise ValueError(f"{M2PO_FLAG} needs vLLM's log-probs (Experience.rollout_log_probs is None; the flag "
                         "switches --rlhf_ext.mismatch_metrics on, which requests them)")
    mask = action_mask.bool()
    behaviour = rollout_log_probs.to(old_log_probs.dtype)
    if mask.numel() == 0:
        return mask.clone()
    fewest, most = torch.stack(mask.view(torch.uint8).amax(dim=-1).aminmax()).tolist()
    if fewest:  # every row has a token (the usual case): no copies of the rows
        keep, metrics = m2po_mask(behaviour, old_log_probs, mask, float(chosen.m2po))
    else:
        rows = mask.any(dim=-1)
        keep = mask.clone()
        if not most:
            return keep
        keep_rows, metrics = m2po_mask(behaviour[rows], old_log_probs[rows], mask[rows], float(chosen.m2po))
        keep[rows] = keep_rows
    if getattr(loss_fn, "side_metrics", True):  # --rlhf_ext.step_metrics off: none logged
        _record(loss_fn, metrics)
    return keep


def decoupled_loss(loss_fn, fn, kwargs, log_probs, old_log_probs, advantages, mask, rollout_log_probs, lag):
    """The registered loss ``fn`` under the decoupled objective; returns ``(per_token, metrics)``.
    ``lag``: the rows' policy lags (``[B]``), needed for a version-interpolated ``pi_prox``."""
    from rlhf_ext.algorithms.metric_requests import metric_wanted
    from rlhf_ext.algorithms.staleness import decoupled_objective, proximal_log_probs

    chosen = loss_fn.staleness
    if rollout_log_probs is None:
        raise ValueError(f"{DECOUPLED_FLAG} needs vLLM's log-probs (Experience.rollout_log_probs is None; the "
                         "flag switches --rlhf_ext.mismatch_metrics on, which requests them)")
    behaviour = rollout_log_probs.to(log_probs.dtype)
    prox = old_log_probs
    extra = {}
    if chosen.prox != "recompute":
        if lag is None:
            raise ValueError(f"{PROX_FLAG} {chosen.prox}: this micro-batch carries no policy lag (are the rollouts "
                             "stamped? --train.async_enable with the plugin on the generator actor)")
        lag = lag.to(device=log_probs.device, dtype=log_probs.dtype)
        prox = proximal_log_probs(behaviour, log_probs, -lag, 1.0, chosen.prox)
        if metric_wanted("decoupled/prox_abs_error"):  # not with --rlhf_ext.step_metrics off
            m = mask.bool()
            extra["decoupled/prox_abs_error"] = ((prox - old_log_probs).abs() * m).sum() / m.sum().clamp(min=1)
        if metric_wanted("decoupled/prox_alpha"):
            extra["decoupled/prox_alpha"] = (lag / (lag + 1)).mean()
    per_token, metrics = decoupled_objective(fn, log_probs, prox, behaviour, advantages, mask, cap=chosen.cap,
                                             action=chosen.action, **kwargs)
    metrics.update(extra)
    return per_token, metrics
