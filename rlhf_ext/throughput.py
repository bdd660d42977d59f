"""Throughput accounting from a step's logged values: what a "s/step, tokens/s, % waiting" table needs.

From the values OpenRLHF logs each step (docs/run_records.md):

* ``completion_tokens_per_s`` = ``rollout/num_samples`` x ``rollout/response_length_mean`` /
  ``timing/step_total``: response tokens generated per second of the whole step;
* ``wait_share`` = ``timing/generation`` / ``timing/step_total``: the share of the step spent
  waiting for rollouts (OpenRLHF's synchronous trainer does nothing else meanwhile);
* ``weight_sync_s`` = ``timing/broadcast``: seconds spent sending the new weights to vLLM;
* ``update_flops`` = ``train.max_epochs`` x ``rollout/num_samples`` x T x (6 N + 12 L H Q T), T the
  step's mean sequence length (``train/total_length``, prompt + response): the model FLOPs of the
  policy update (:mod:`rlhf_ext.flops`, PaLM's count; T's mean stands in for each sequence's own);
* ``mfu`` = ``update_flops`` / (``timing/ppo_train`` x peak FLOP/s per device x devices): the MFU of
  the policy update, as PaLM and verl report it. Generation, the reference and old-policy forward
  passes are not counted, so it says how well the update uses the devices, not the whole step.

The run-record writer adds them to every step's line as ``rlhf_ext/throughput/<name>``
(:mod:`rlhf_ext.patches.openrlhf.run_record`), MFU from the ``compute`` block of ``config.json``
(:func:`compute_block`: device, device count, peak and its source, the model's shape, or why there is
no MFU); the report summarises them per run.
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
    """``update_flops`` (when the model shape is known) and ``mfu`` (when the device's peak is too)."""
    from .flops import ModelShape

    shape = (compute or {}).get("model_shape")
    samples = _num(values, "rollout/num_samples")
    seq = _num(values, "total_length", "train/total_length")
    if not isinstance(shape, Mapping) or samples is None or not seq or seq <= 0:
        return {}
    fields = {k: shape[k] for k in ModelShape.__dataclass_fields__ if k in shape}
    try:
        model = ModelShape(**fields)
    except TypeError:
        return {}
    epochs = float(compute.get("updates_per_step") or 1)
    flops = epochs * samples * seq * model.train_flops_per_token(seq)
    out = {PREFIX + "update_flops": flops}
    peak, devices = compute.get("peak_flops_per_device"), compute.get("device_count")
    update_s = _num(values, "timing/ppo_train")
    if isinstance(peak, (int, float)) and peak > 0 and isinstance(devices, int) and devices > 0 and update_s:
        out[PREFIX + "mfu"] = flops / (update_s * peak * devices)
    return out


def _device_name() -> Optional[str]:
    """The accelerator this process sees (``cpu`` when none), as torch names it."""
    try:
        from rlhf_ext.patches.retarget.state import current_backend

        if current_backend() == "cpu":
            return "cpu"
    except ImportError:
        pass
    import torch

    npu = getattr(torch, "npu", None)
    if npu is not None and getattr(npu, "is_available", lambda: False)():
        return str(npu.get_device_name(0))
    if torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return "cpu"


def compute_block(model: Optional[str], device_count: Optional[int], updates_per_step: Optional[int],
                  device: Optional[str] = None) -> Dict[str, Any]:
    """``config.json``'s ``compute``: the device (``device`` or the one this process sees), how many
    train the policy, their peak and its source, the model's shape (:mod:`rlhf_ext.flops`), and
    ``mfu_unavailable``: why there will be no MFU (``None`` when there will be)."""
    from .flops import device_peak, read_model_shape

    why_device = "the run record names no device"
    if device is None:
        try:
            device = _device_name()
        except Exception as exc:  # noqa: BLE001 - a broken driver stack must not stop the run record
            device = None
            why_device = f"the device could not be read ({exc!r})"
    peak, source = device_peak(device)
    shape, why = None, None
    try:
        shape = read_model_shape(model).to_json() if model else None
        if shape is None:
            why = "the run names no model"
    except ValueError as exc:
        why = str(exc)
    if peak is None:
        why = why or (source if device is not None else why_device)
    if not device_count or device_count < 1:
        why = why or "the number of training devices is unknown"
    return {"device": device, "device_count": device_count, "peak_flops_per_device": peak,
            "peak_source": source if peak is not None else None, "model_shape": shape,
            "updates_per_step": updates_per_step or 1, "mfu_unavailable": why}
