"""rlhf_ext's rollout-correction modes as values of verl's own ``algorithm.rollout_correction`` keys.

verl 0.9.x computes the correction in the driver with
``rollout_corr_helper.compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)``
(``ray_trainer.py`` imports it by name at call time; ``v1/trainer_base.py`` at import): it puts
``rollout_is_weights`` into the batch and replaces ``response_mask`` with the rejection mask. The
actor hands both to whichever policy loss is selected -- rlhf_ext's losses included, which multiply
their per-token terms by ``rollout_is_weights`` and aggregate over the (rejection-)masked tokens
(:mod:`.policy_loss`), exactly as verl's own losses do.

This seam adds rlhf_ext's modes to the same keys. With verl's own values (``rollout_is`` in
``token`` / ``sequence`` / null and every ``rollout_rs`` option one of verl's) verl's function runs
untouched. Otherwise :func:`rlhf_ext.algorithms.rollout_correction` computes the weights, the mask
and the metrics (``rollout_corr/<verl name>`` where verl reports the same quantity, else
``rollout_corr/<rlhf_ext name>``):

* ``rollout_is: geometric`` -- the geometric mean of the token ratios per sequence;
* ``rollout_rs`` options ``token_ratio``, ``seq_mean_ratio``, ``seq_sum_ratio`` (IcePop / MIS as
  rejection), ``seq_max_abs_log_ratio``, ``token_tv``, ``seq_mean_tv``, ``token_binary_kl``,
  ``seq_mean_binary_kl``, alone or chained with verl's (``rollout_rs_threshold`` as verl reads it:
  one entry per option, comma separated, ``low_high`` for the two-sided ones).

verl's ``bypass_mode`` computes its correction inside its ``bypass_mode`` loss and is not
affected; rlhf_ext's modes apply in verl's decoupled mode (the default).
"""

from __future__ import annotations

import functools
from typing import Dict, Tuple

HELPER = "verl.trainer.ppo.rollout_corr_helper"
SEAM = "compute_rollout_correction_and_add_to_batch"


def _get(config, key, default=None):
    getter = getattr(config, "get", None)
    value = getter(key, default) if getter is not None else getattr(config, key, default)
    return default if value is None else value


def _options(config) -> Tuple[object, Dict[str, object]]:
    from rlhf_ext.algorithms import RolloutCorrection
    from rlhf_ext.algorithms.rollout_correction import rejection_thresholds

    rejection = rejection_thresholds(_get(config, "rollout_rs"), _get(config, "rollout_rs_threshold"),
                                     thresholds_alone=True)
    return RolloutCorrection(
        is_level=_get(config, "rollout_is"),
        is_threshold=_get(config, "rollout_is_threshold", 2.0),
        batch_normalize=bool(_get(config, "rollout_is_batch_normalize", False)),
        rejection=rejection,
    ), rejection


def uses_rlhf_ext(config) -> bool:
    """Whether ``config`` names a mode verl 0.9.x does not have."""
    from rlhf_ext.algorithms.rollout_correction import VERL_REJECTION_OPTIONS, rejection_options

    level = _get(config, "rollout_is")
    names = rejection_options(_get(config, "rollout_rs"))
    return level not in (None, "token", "sequence") or any(n not in VERL_REJECTION_OPTIONS for n in names)


def correct_batch(batch, config):
    """rlhf_ext's correction on a verl ``DataProto`` (what verl's function does, with rlhf_ext's modes)."""
    from rlhf_ext.algorithms import rollout_correction
    from rlhf_ext.algorithms.rollout_correction import VERL_METRIC_NAMES

    try:
        correction, _ = _options(config)
    except ValueError as exc:
        raise ValueError(f"algorithm.rollout_correction: {exc}") from None
    mask = batch.batch["response_mask"]
    result = rollout_correction(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"], mask, correction)
    batch.batch["response_mask"] = result.mask.to(mask.dtype)
    if correction.is_level is not None:
        batch.batch["rollout_is_weights"] = result.weights.to(batch.batch["old_log_probs"].dtype)
    metrics = {}
    for key, value in result.metrics.items():
        metrics["rollout_corr/" + VERL_METRIC_NAMES.get(key, key)] = float(value)
    return batch, metrics


def make_compute_rollout_correction_and_add_to_batch(original, module=None):
    @functools.wraps(original)
    def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config):
        if rollout_corr_config is None or not uses_rlhf_ext(rollout_corr_config):
            return original(batch, rollout_corr_config)
        return correct_batch(batch, rollout_corr_config)

    compute_rollout_correction_and_add_to_batch.rlhf_ext_patched = True
    return compute_rollout_correction_and_add_to_batch


def patch(module) -> None:
    """Post-import hook on ``rollout_corr_helper``: install the seam (idempotent)."""
    current = getattr(module, SEAM, None)
    if current is None:
        raise RuntimeError(f"{HELPER}.{SEAM} is missing: rlhf_ext's rollout-correction modes are unavailable")
    if not getattr(current, "rlhf_ext_patched", False):
        setattr(module, SEAM, make_compute_rollout_correction_and_add_to_batch(current))


def unpatch(module) -> None:
    current = getattr(module, SEAM, None)
    if getattr(current, "rlhf_ext_patched", False):
        setattr(module, SEAM, current.__wrapped__)
