"""Throughput accounting from a step's logged values: what a "s/step, tokens/s, % waiting" table needs.

From the values OpenRLHF logs each step (docs/run_records.md):

* ``completion_tokens_per_s`` = ``rollout/num_samples`` x ``rollout/response_length_mean`` /
  ``timing/step_total``: response tokens generated per second of the whole step;
* ``wait_share`` = ``timing/generation`` / ``timing/step_total``: the share of the step spent
  waiting for rollouts (OpenRLHF's synchronous trainer does nothing else meanwhile);
* ``weight_sync_s`` = ``timing/broadcast``: seconds spent sending the new weights to vLLM.

The run-record writer adds them to every step's line as ``rlhf_ext/throughput/<name>``
(:mod:`rlhf_ext.patches.openrlhf.run_record`); the report summarises them per run. No MFU estimate
yet: it needs the model's FLOPs per token and the device, which the run record does not state.
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


def step_throughput(values: Mapping[str, Any]) -> Dict[str, float]:
    """The throughput numbers of one step (those its values allow), keyed ``rlhf_ext/throughput/...``."""
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
    return out
