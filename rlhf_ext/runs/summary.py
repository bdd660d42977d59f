"""The few lines ``rlhf-ext runs show`` prints about a run (:func:`summarize`)."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from .files import CONFIG, EVENTS, INCIDENT, METRICS, POLICY_LAG, POLICY_LAG_MAX, ROLLOUT_SAMPLES, read_jsonl, read_metrics
from .samples import read_rollout_samples
from .status import run_status

DISTILL_LOSS = "train/distill/loss"
DISTILL_K3 = "train/distill/reverse_kl_k3"

KEY_METRICS = (
    "train/reward", "train/score", "train/policy_loss", "train/kl", "train/actor_grad_norm",
    "train/entropy_loss", "train/response_length", "rlhf_ext/ds_skipped_steps", "rlhf_ext/guard/incidents",
    "rollout_mismatch/probs_diff_mean", "timing/step_total",
)  # fmt: skip


def summarize(run_dir: os.PathLike) -> str:
    """A few lines about a run: name, status, last step, key metrics (first and last value), incidents."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if not (run_dir / METRICS).exists() and not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG} or {METRICS})")
    config = {}
    if (run_dir / CONFIG).exists():
        config = json.loads((run_dir / CONFIG).read_text())
    metrics = read_metrics(run_dir / METRICS)
    events = read_jsonl(run_dir / EVENTS)
    status, code = run_status(events)
    args = config.get("args", {})
    lines = [f"run {config.get('name', run_dir.name)}  ({run_dir})"]
    algo = ", ".join(
        f"{k.split('.', 1)[-1]}={args[k]}"
        for k in ("algo.advantage.estimator", "actor.policy_loss_type", "actor.loss_agg_mode")
        if k in args
    )
    if algo:
        lines.append(f"  recipe: {algo}")
    last = metrics[-1]["step"] if metrics else None
    lines.append(
        f"  status: {status}" + (f" (exit code {code})" if code is not None else "")
        + f"; last step {last if last is not None else '-'}; {len(metrics)} steps recorded"
    )  # fmt: skip
    if metrics:
        elapsed = metrics[-1].get("elapsed_s")
        if isinstance(elapsed, (int, float)):
            lines.append(f"  elapsed: {elapsed:.0f} s")
        width = max(len(k) for k in KEY_METRICS)
        for key in KEY_METRICS:
            series = [(m["step"], m.get(key)) for m in metrics if key in m]
            if not series:
                continue
            first, final = series[0], series[-1]
            lines.append(f"  {key:<{width}}  step {first[0]}: {_fmt(first[1])}  ->  step {final[0]}: {_fmt(final[1])}")
        bad = [m["step"] for m in metrics if m.get("nonfinite")]
        if bad:
            lines.append(f"  non-finite values at steps: {', '.join(map(str, bad[:10]))}" + (" ..." if len(bad) > 10 else ""))
    for ev in events:
        if ev.get("event") == "guard_incident":
            lines.append(
                f"  guard incident at step {ev.get('step')}: tensor {ev.get('tensor')} (rank {ev.get('rank')}, "
                f"mode {ev.get('mode')})"
            )
        elif ev.get("event") == "nonfinite_input":
            lines.append(
                f"  non-finite input at step {ev.get('step')}: {ev.get('check')} in {ev.get('where')} "
                f"({ev.get('nan_count')} NaN, {ev.get('inf_count')} Inf), left to the guard"
            )
        elif ev.get("event") == "mismatch_warning":
            lines.append(f"  mismatch warning at step {ev.get('step')}: {ev.get('message', ev.get('metric'))}")
    samples = read_rollout_samples(run_dir / ROLLOUT_SAMPLES)
    if samples:
        steps = sorted({r["step"] for r in samples})
        lines.append(f"  rollout samples: {len(samples)} in {ROLLOUT_SAMPLES}, steps {steps[0]}..{steps[-1]} "
                     "('rlhf-ext report' shows them)")
    lag = [(m["step"], m[POLICY_LAG], m.get(POLICY_LAG_MAX))
           for m in metrics if isinstance(m.get(POLICY_LAG), (int, float))]
    if lag:  # async runs only (docs/run_records.md)
        worst = max((x[2] if isinstance(x[2], (int, float)) else x[1]) for x in lag)
        lines.append(f"  policy lag (async): mean {statistics.fmean(x[1] for x in lag):.3g} steps over {len(lag)} "
                     f"steps, max {worst:g}; per step: " + ", ".join(f"{s}:{v:g}" for s, v, _ in lag[-8:])
                     + (" ..." if len(lag) > 8 else ""))
    distill = [(m["step"], m.get(DISTILL_LOSS), m.get(DISTILL_K3)) for m in metrics
               if isinstance(m.get(DISTILL_LOSS), (int, float))]
    if distill:  # runs with --rlhf_ext.teacher (docs/distillation.md)
        (s0, l0, k0), (s1, l1, k1) = distill[0], distill[-1]
        lines.append(f"  distillation: loss step {s0}: {_fmt(l0)} -> step {s1}: {_fmt(l1)}; reverse KL to the "
                     f"teacher (k3) {_fmt(k0)} -> {_fmt(k1)}")
    compute = config.get("compute") if isinstance(config.get("compute"), dict) else None
    if compute is not None and compute.get("mfu_unavailable"):
        lines.append(f"  MFU: none ({compute['mfu_unavailable']})")
    elif compute is not None:
        mfu = [m["rlhf_ext/throughput/mfu"] for m in metrics if isinstance(m.get("rlhf_ext/throughput/mfu"), (int, float))]
        if mfu:
            lines.append(f"  MFU of the policy update: median {100 * statistics.median(mfu):.3g}% over {len(mfu)} "
                         f"steps ({compute.get('device')} x {compute.get('device_count')})")
    ckpts = [ev for ev in events if ev.get("event") == "checkpoint"]
    if ckpts:
        lines.append(f"  checkpoints: {len(ckpts)}, last at step {ckpts[-1].get('step')}: {ckpts[-1].get('path')}")
    if (run_dir / INCIDENT).exists():
        inc = json.loads((run_dir / INCIDENT).read_text())
        lines.append(
            f"  incident.json: step {inc.get('step')}, micro-batch {inc.get('micro_batch')}, tensor {inc.get('tensor')}, "
            f"rank {inc.get('rank')}, last good checkpoint {inc.get('last_good_checkpoint')}"
        )
        origin = inc.get("origin")
        where = origin if isinstance(origin, dict) else inc
        if "nan_count" in where:
            what = f"from {origin.get('name')}: " if isinstance(origin, dict) else ""
            loss = f" (policy loss {inc['policy_loss_type']})" if inc.get("policy_loss_type") and origin else ""
            lines.append(
                f"    {what}{where.get('nan_count')} NaN and {where.get('inf_count')} Inf value(s), first at index "
                f"{tuple(where['first_index']) if where.get('first_index') is not None else '-'}{loss}"
            )
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "nan/inf"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
