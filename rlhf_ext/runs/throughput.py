"""Throughput accounting from a step's logged values: what a "s/step, tokens/s, % waiting" table needs.

From the values OpenRLHF logs each step (docs/run_records.md):

* ``completion_tokens_per_s`` = ``rollout/num_samples`` x ``rollout/response_length_mean`` /
  ``timing/step_total``: response tokens generated per second of the whole step;
* ``wait_share`` = ``timing/generation`` / ``timing/step_total``: the share of the step spent
  waiting for rollouts (OpenRLHF's synchronous trainer does nothing else meanwhile);
* ``weight_sync_s`` = ``timing/broadcast``: seconds spent sending the new weights to vLLM;
* ``update_flops`` = ``train.max_epochs`` x ``rollout/num_samples`` x T x (6 N + 12 L H Q T), T the
  step's mean sequence length (``train/total_length``, prompt + response): the model FLOPs of the
  policy update (:mod:`rlhf_ext.runs.flops`, PaLM's count; T's mean stands in for each sequence's own);
* ``mfu`` = ``update_flops`` / (``timing/ppo_train`` x peak FLOP/s per device x devices): the MFU of
  the policy update, as PaLM and verl report it. Generation, the reference and old-policy forward
  passes are not counted, so it says how well the update uses the devices, not the whole step.

The run-record writer adds them to every step's line as ``rlhf_ext/throughput/<name>``
(:mod:`rlhf_ext.patches.openrlhf.run_record`), MFU from the ``compute`` block of ``config.json``
(:func:`rlhf_ext.runs.flops.compute_block`: device, device count, peak and its source, the model's shape,
or why there is no MFU); the report summarises them per run.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

PREFIX = "rlhf_ext/throughput/"


def _num(values: Mapping[str, Any], *keys: str) -> Optional[float]:
    for key in keys:
        v = values.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
        item = getattr(v, "item", None)
        if callable(item):
            try:
                f = float(item())
            except (TypeError, ValueError, RuntimeError):
                continue
            if math.isfinite(f):
                return f
    return None


def step_throughput(values: Mapping[str, Any], compute: Optional[Mapping[str, Any]] = None) -> Dict[str, float]:
    """The throughput numbers of one step (those its values allow), keyed ``rlhf_ext/throughput/...``;
    ``compute``: the run's :func:`compute_block`, for ``update_flops`` and ``mfu``."""
    out: Dict[str, float] = {}
    total = _num(values, "timing/step_total")
    samples = _num(values, "rollout/num_samples")
    length = _num(values, "rollout/response_length_mean", "response_length", "train/response_length")
    if total and total > 0:
        if samples is not None and length is not None:
            out[PREFIX + "completion_tokens_per_s"] = samples * length / total
        generation = _num(values, "timing/generation")
        if generation is not None:
            out[PREFIX + "wait_share"] = generation / total
    sync = _num(values, "timing/broadcast")
    if sync is not None:
        out[PREFIX + "weight_sync_s"] = sync
    out.update(step_mfu(values, compute))
    return out


def step_mfu(values: Mapping[str, Any], compute: Optional[Mapping[str, Any]]) -> Dict[str, float]:
    """``update_flops`` (when the model shape is known) and ``mfu`` (when the device's peak is too).

    The shape's two coefficients (:meth:`rlhf_ext.runs.flops.ModelShape.to_json`) give the FLOPs per token
    at the step's mean length T: ``fixed + per_position x T`` = 6N + 12LHQ x T."""
    shape = (compute or {}).get("model_shape")
    samples = _num(values, "rollout/num_samples")
    seq = _num(values, "total_length", "train/total_length")
    if not isinstance(shape, Mapping) or samples is None or not seq or seq <= 0:
        return {}
    fixed, per_position = _num(shape, "flops_per_token_fixed"), _num(shape, "flops_per_token_per_position")
    if fixed is None or per_position is None:
        return {}
    epochs = float(compute.get("updates_per_step") or 1)
    flops = epochs * samples * seq * (fixed + per_position * seq)
    out = {PREFIX + "update_flops": flops}
    peak, devices = compute.get("peak_flops_per_device"), compute.get("device_count")
    update_s = _num(values, "timing/ppo_train")
    if isinstance(peak, (int, float)) and peak > 0 and isinstance(devices, int) and devices > 0 and update_s:
        out[PREFIX + "mfu"] = flops / (update_s * peak * devices)
    return out
