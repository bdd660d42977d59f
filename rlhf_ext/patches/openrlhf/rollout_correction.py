"""Rollout/training mismatch correction for every policy loss inside OpenRLHF's actor.

Two ways to ask for it (docs/rollout_correction.md):

* OpenRLHF's own ``--algo.advantage.is_correction_{level,mode,gating,threshold}``: with
  OpenRLHF's ``ppo`` / ``gspo`` OpenRLHF applies them itself, unchanged; with any rlhf_ext loss
  the same correction (:func:`rlhf_ext.algorithms.openrlhf_correction`, parity-tested against
  OpenRLHF 0.11.2's ``PolicyLoss``) is applied to that loss's per-token terms.
* rlhf_ext's levels: ``--rlhf_ext.rollout_is {token,sequence,geometric}`` with
  ``--rlhf_ext.rollout_is_threshold C`` (TIS) or ``LOW_HIGH`` (IcePop / MIS),
  ``--rlhf_ext.rollout_rs OPT[,OPT]`` with ``--rlhf_ext.rollout_rs_threshold`` (rejection, verl's
  option names plus rlhf_ext's), ``--rlhf_ext.rollout_is_batch_normalize`` and
  ``--rlhf_ext.rollout_correction_bypass`` (the PPO ratio is taken against the rollout
  log-probs, which become the behaviour policy; the weights use the current ``log pi``). These
  work for every loss: OpenRLHF's ``ppo`` / ``gspo`` then run as rlhf_ext's functions of the same
  name (the same formulas; tests/test_openrlhf_losses.py).

Both need vLLM's log-probs of the sampled tokens: OpenRLHF requests them for its own flags, and
rlhf_ext's flags switch on ``--rlhf_ext.mismatch_metrics``, whose seams request them
(:mod:`.mismatch`). The step's ``rollout_corr/*`` metrics (:mod:`rlhf_ext.algorithms.rollout_correction`)
join the actor's status, hence the console, wandb / TensorBoard and the run record's
``metrics.jsonl``; OpenRLHF's ``vllm_kl`` / ``is_filter_ratio`` are filled as OpenRLHF fills them.

Top-p: vLLM's ``processed_logprobs`` are those of the truncated, renormalised distribution,
while the trainer's are over the full vocabulary, so every ratio carries the kept mass ``S <= 1``
(``log pi_old - log pi_rollout = log S`` on every token, huggingface/trl#6789). A correction would
then mostly correct the truncation, not the numerics: a correction applied by rlhf_ext refuses
``--rollout.top_p < 1``; OpenRLHF's own flags with its own losses get a warning (its behaviour).
"""

from __future__ import annotations

import sys
from typing import Dict, Optional, Tuple

from .config import OPENRLHF_POLICY_LOSSES, rlhf_ext_view, setting

METRIC_PREFIX = "rollout_corr/"
# test hook (tests/test_e2e_cpu_train.py): "SIGMA@BATCH" lowers vLLM's log-probs of the response tokens by
# |N(0, SIGMA^2)| from rollout batch BATCH on, to inject a known rollout/training mismatch
TEST_NOISE_ENV = "RLHF_EXT_TEST_ROLLOUT_LOGPROB_NOISE"


def add_arguments(group) -> None:
    group.add_argument(
        "--rlhf_ext.rollout_is", default=None, choices=("token", "sequence", "geometric"),
        help="importance-sampling correction of the rollout/training mismatch for any policy loss: per-token "
        "ratio (TIS), product over the sequence, or its geometric mean (docs/rollout_correction.md); "
        "turns on --rlhf_ext.mismatch_metrics",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_is_threshold", default=None, metavar="C|LOW_HIGH",
        help="C truncates the weights at C (TIS, default 2); LOW_HIGH zeroes weights outside [LOW, HIGH] (IcePop)",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_is_batch_normalize", action="store_true", default=False,
        help="rescale the IS weights to mean 1 over each micro-batch (verl's rollout_is_batch_normalize)",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_rs", default=None, metavar="OPT[,OPT]",
        help="reject tokens/sequences whose divergence is out of bounds: verl's token_k1..3, seq_sum_k1..3, "
        "seq_mean_k1..3, seq_max_k2..3, and token_ratio, seq_mean_ratio, seq_sum_ratio, seq_max_abs_log_ratio, "
        "token_tv, seq_mean_tv, token_binary_kl, seq_mean_binary_kl",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_rs_threshold", default=None, metavar="T[,T]",
        help="one threshold per --rlhf_ext.rollout_rs option (or one for all): an upper bound, or LOW_HIGH "
        "for the ratio and k1 options",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_correction_bypass", action="store_true", default=False,
        help="bypass mode: the rollout log-probs are the behaviour policy of the PPO ratio and the weights "
        "use the current policy (needs --rlhf_ext.rollout_is or --rlhf_ext.rollout_rs)",
    )  # fmt: skip


def correction_from_args(args) -> Tuple[Optional[object], bool]:
    """``(RolloutCorrection or None, bypass)`` from rlhf_ext's flags (``None``: none given)."""
    from rlhf_ext.algorithms import RolloutCorrection
    from rlhf_ext.algorithms.rollout_correction import rejection_thresholds

    level = setting(args, "rlhf_ext.rollout_is")
    rs = rejection_thresholds(setting(args, "rlhf_ext.rollout_rs"), setting(args, "rlhf_ext.rollout_rs_threshold"),
                              options_key="--rlhf_ext.rollout_rs", thresholds_key="--rlhf_ext.rollout_rs_threshold")
    bypass = bool(setting(args, "rlhf_ext.rollout_correction_bypass", False))
    threshold = setting(args, "rlhf_ext.rollout_is_threshold")
    if level is None and not rs:
        if bypass or threshold is not None or setting(args, "rlhf_ext.rollout_is_batch_normalize", False):
            raise ValueError("--rlhf_ext.rollout_is_threshold / _batch_normalize / --rlhf_ext.rollout_correction_bypass "
                             "need --rlhf_ext.rollout_is or --rlhf_ext.rollout_rs")
        return None, False
    config = RolloutCorrection(
        is_level=level,
        is_threshold=2.0 if threshold is None else threshold,
        batch_normalize=bool(setting(args, "rlhf_ext.rollout_is_batch_normalize", False)),
        rejection=rs,
    )
    return config, bypass


def finalize(namespace) -> Dict[str, str]:
    """Validate the flags (driver, before the mismatch flags are finalized); no environment of its own."""
    def get(dotted, default=None):
        value = getattr(namespace, dotted, None)
        return default if value is None else value

    view = rlhf_ext_view(namespace)
    try:
        config, _ = correction_from_args(view)
    except ValueError as exc:
        raise ValueError(f"rollout correction: {exc}") from None
    openrlhf_on = get("algo.advantage.is_correction_level", "off") != "off"
    if config is not None and openrlhf_on:
        raise ValueError("--algo.advantage.is_correction_* and --rlhf_ext.rollout_is/_rs both ask for a rollout "
                         "correction; choose one (docs/rollout_correction.md)")
    top_p = float(get("rollout.top_p", 1.0))
    reason = (f"rollout correction with --rollout.top_p {top_p}: vLLM's log-probs are those of the top-p-truncated "
              "distribution, so every importance ratio carries the kept probability mass (log pi_train - log "
              "pi_rollout = log S < 0 on every token) and the correction would mostly undo the truncation, not the "
              "numerical mismatch. Sample with --rollout.top_p 1.0 (docs/rollout_correction.md, 'Top-p / top-k')")
    openrlhf_for_ours = openrlhf_on and get("actor.policy_loss_type", "ppo") not in OPENRLHF_POLICY_LOSSES
    if openrlhf_for_ours:
        # the actor builds the same correction (policy_loss.py); a bad combination fails here, before Ray
        from rlhf_ext.algorithms.rollout_correction import openrlhf_correction

        try:
            openrlhf_correction(get("algo.advantage.is_correction_level"), get("algo.advantage.is_correction_mode", "mask"),
                                get("algo.advantage.is_correction_gating", "ratio"),
                                get("algo.advantage.is_correction_threshold", [0.5, 5.0]))
        except ValueError as exc:
            raise ValueError(f"--algo.advantage.{exc} (with --actor.policy_loss_type "
                             f"{get('actor.policy_loss_type')})") from None
    ours = config is not None or openrlhf_for_ours
    if ours and top_p < 1.0:
        raise ValueError(reason)
    if openrlhf_on and top_p < 1.0:  # OpenRLHF's own loss and flags: its behaviour, not refused here
        sys.stderr.write(f"rlhf_ext: warning: {reason}\n")
    if config is not None:
        setattr(namespace, "rlhf_ext.mismatch_metrics", True)  # its seams request vLLM's log-probs
    return {}


def configure(loss_fn, args, call_kwargs) -> None:
    """After ``configure_from_args``: rlhf_ext's flags on ``loss_fn`` (OpenRLHF's losses run as rlhf_ext's,
    called with ``call_kwargs(loss_fn, fn)``: the options OpenRLHF's flags give a registered loss)."""
    config, bypass = correction_from_args(args)
    if config is None:
        return
    run_as_registered(loss_fn, call_kwargs)
    loss_fn.rollout_correction = (config, bypass)


def run_as_registered(loss_fn, call_kwargs) -> None:
    """OpenRLHF's own ``ppo`` / ``gspo`` on ``loss_fn`` run as rlhf_ext's functions of the same name (a registered
    loss already is), so a per-token weight or mask can be applied to their terms."""
    from rlhf_ext.algorithms import get_policy_loss

    if getattr(loss_fn, "_registered_fn", None) is None:
        loss_fn._registered_fn = get_policy_loss(loss_fn.policy_loss_type)
        loss_fn._call_kwargs = call_kwargs(loss_fn, loss_fn._registered_fn)
        if loss_fn.loss_agg_mode is None:
            loss_fn.loss_agg_mode = "token-mean" if loss_fn.token_level_loss else "seq-mean-token-mean"


def corrected_loss(fn, kwargs, correction, log_probs, old_log_probs, advantages, mask, rollout_log_probs):
    """The registered loss ``fn`` with the correction applied to its per-token terms.

    Returns ``(per_token, metrics, vllm_kl, filter_ratio)``; ``metrics`` holds the loss's own and
    the ``rollout_corr/*`` ones. ``filter_ratio`` is OpenRLHF's ``is_filter_ratio``: the fraction
    of tokens (sequences, for sequence gates) rejected, or truncated when nothing is rejected.
    """
    from rlhf_ext.algorithms import apply_rollout_correction, rollout_correction

    config, bypass = correction
    if rollout_log_probs is None:
        raise ValueError("rollout correction needs vLLM's log-probs (Experience.rollout_log_probs is None); "
                         "they are requested with --rlhf_ext.mismatch_metrics or OpenRLHF's is_correction flags")
    rollout = rollout_log_probs.to(log_probs.dtype)
    if bypass:
        old_log_probs = rollout
        train = log_probs.detach()
    else:
        train = old_log_probs
    result = rollout_correction(train, rollout, mask, config)
    per_token, metrics = fn(log_probs, old_log_probs, advantages, mask, **kwargs)
    per_token = apply_rollout_correction(per_token, result)
    metrics = dict(metrics)
    for key, value in result.metrics.items():
        metrics[METRIC_PREFIX + key] = value.to(log_probs.dtype)
    m = result.metrics
    if config.rejection:
        seq_gate = any(not opt.startswith("token_") for opt in config.rejection)
        filt = m["seq_rejected_fraction"] if seq_gate else m["rejected_fraction"]
    else:
        filt = m.get("is_truncated_fraction")
    vllm_kl = m["k1_kl"].to(log_probs.dtype)
    filt = (filt if filt is not None else vllm_kl * 0).to(log_probs.dtype)
    return per_token, metrics, vllm_kl, filt


def inject_test_mismatch(experiences, batch: int, environ=None) -> bool:
    """The test hook of :data:`TEST_NOISE_ENV` (a no-op without it); returns whether it perturbed.

    Each response token's rollout log-probability drops by ``|e|``, ``e ~ N(0, SIGMA^2)``. Lowering
    only keeps it a log-probability (``<= 0``), and the chance that a token's ratio leaves
    ``[1/c, c]`` is then ``P(|e| > ln c)`` whatever the model's confidence (0.488 for SIGMA 1,
    c 2). Symmetric noise clamped at 0 depended on it: for a token the model was sure of, only
    the negative half counted, so a confident model saw as little as half the rejections.
    """
    import os

    import torch

    spec = (os.environ if environ is None else environ).get(TEST_NOISE_ENV)
    if not spec:
        return False
    try:
        sigma, start = spec.split("@")
        sigma, start = float(sigma), int(start)
    except ValueError:
        raise ValueError(f"{TEST_NOISE_ENV}={spec!r}: expected SIGMA@BATCH, e.g. 1.0@2") from None
    if batch < start:
        return False
    g = torch.Generator().manual_seed(1000 + batch)
    for exp in experiences:
        if exp.rollout_log_probs is None:
            continue
        lp = exp.rollout_log_probs
        drop = torch.randn(lp.shape, generator=g).abs().to(device=lp.device, dtype=lp.dtype) * sigma
        exp.rollout_log_probs = torch.where(exp.action_mask.bool(), lp - drop, lp)
    return True
