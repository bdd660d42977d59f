"""The smoke verdict of a run record: did a short run show what it was run to show?

``rlhf-ext runs check RUN_DIR`` reads a run directory (format: :mod:`rlhf_ext.runs`) and answers
the questions a 20-step smoke run exists for, one line per check, before the long run is spent:

=============  =====================================================================================
check          passes when
=============  =====================================================================================
``ended``      the record has an ``end`` event with status ``finished`` (a crash, an OOM kill that
               left an exit code, a guard stop, or no ``end`` at all: a run still going or killed
               hard, fail) and at least one step was recorded
``finite``     no metric was recorded as NaN/Inf, no guard incident, DeepSpeed skipped no
               optimizer step (``rlhf_ext/ds_skipped_steps``)
``ratio``      the importance ratio stayed near 1: every step's ``train/ppo_kl`` (OpenRLHF's mean of
               ``log pi_old - log pi`` over response tokens, the k1 estimate of KL(pi_old || pi)) is
               within ``max_ppo_kl`` (default 0.02, the scale of PPO's early-stopping target KL,
               0.01 x 1.5 in OpenAI Spinning Up's PPO)
``advantage``  the advantages did not collapse: over the last ``window`` steps the share of prompt
               groups whose rewards are all equal (``train/zero_variance_group_frac``, their
               group-normalised advantage is 0; logged for OpenRLHF's estimators and rlhf_ext's)
               stays below ``max_zero_variance`` (default 0.9), and, where logged, the mean
               within-group reward std (``train/group_reward_std``) is above 0
``reward``     the reward is not moving the wrong way: the mean of the last ``window`` steps minus
               that of the first ``window`` steps is not below -2 Welch standard errors
               (``sqrt(sd_first^2/k + sd_last^2/k)``, steps treated as independent draws; the
               report's headline uses the same test). With ``require_rise`` it must be above +2 SE
``mismatch``   rollout vs training mismatch stayed under its threshold: the largest
               ``rollout_mismatch/probs_diff_mean`` is at most the run's
               ``--rlhf_ext.mismatch_threshold`` (default 0.005) and no ``mismatch_warning`` event
=============  =====================================================================================

A check whose metric the run did not log is ``SKIP`` with what to switch on; skips do not fail the
verdict. The verdict is ``PASS`` (exit code 0) when no check failed, else ``FAIL`` (exit code 1).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import runs

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
DEFAULT_MISMATCH_THRESHOLD = 0.005  # rlhf_ext.patches.openrlhf.mismatch's default


@dataclass
class CheckOptions:
    window: int = 5
    """k, the number of first / last steps compared (halved to fit a short run)."""
    max_ppo_kl: float = 0.02
    max_zero_variance: float = 0.9
    require_rise: bool = False
    mismatch_threshold: Optional[float] = None
    """None: the run's own ``--rlhf_ext.mismatch_threshold`` (else 0.005)."""


@dataclass
class Check:
    name: str
    status: str
    detail: str


@dataclass
class Verdict:
    run_dir: str
    checks: List[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def lines(self) -> List[str]:
        width = max(len(c.name) for c in self.checks)
        out = [f"{c.status}  {c.name:<{width}}  {c.detail}" for c in self.checks]
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, SKIP)}
        out.append(f"verdict: {PASS if self.passed else FAIL} ({counts[PASS]} passed, {counts[FAIL]} failed, "
                   f"{counts[SKIP]} skipped) for {self.run_dir}")
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"run_dir": self.run_dir, "verdict": PASS if self.passed else FAIL,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> List[float]:
    return [float(m[key]) for m in metrics if isinstance(m.get(key), (int, float)) and not isinstance(m[key], bool)]


def _g(x: float) -> str:
    return f"{x:.4g}"


def _check_ended(metrics, events) -> Check:
    status, code = runs.run_status(events)
    n = len(metrics)
    steps = f"{n} step{'s' if n != 1 else ''} recorded" + (f" (last {metrics[-1]['step']})" if metrics else "")
    if not events:
        return Check("ended", FAIL, f"no events.jsonl entries: the run never started its record; {steps}")
    if status == "running":
        return Check("ended", FAIL, f"no end event after the last start/resume: still running or killed hard "
                                    f"(OOM killer, SIGKILL); {steps}")
    if status != "finished":
        return Check("ended", FAIL, f"{status.replace('_', ' ')} (exit code {code}); {steps}")
    if n == 0:
        return Check("ended", FAIL, f"finished (exit code {code}) but no step was recorded")
    return Check("ended", PASS, f"finished (exit code {code}); {steps}")


def _check_finite(metrics, events) -> Check:
    bad = [(m["step"], k) for m in metrics for k in (m.get("nonfinite") or [])]
    incidents = [ev for ev in events if ev.get("event") in ("guard_incident", "nonfinite_input")]
    skipped = _series(metrics, "rlhf_ext/ds_skipped_steps")
    problems = []
    if bad:
        problems.append(f"{len(bad)} non-finite value(s), first {bad[0][1]} at step {bad[0][0]}")
    if incidents:
        ev = incidents[0]
        what = ev.get("tensor") or ev.get("check")
        problems.append(f"{len(incidents)} guard event(s), first {ev.get('event')} ({what}) at step {ev.get('step')}")
    if skipped and skipped[-1] > 0:
        problems.append(f"DeepSpeed skipped {skipped[-1]:.0f} optimizer step(s)")
    if problems:
        return Check("finite", FAIL, "; ".join(problems))
    tail = f", DeepSpeed skipped 0 optimizer steps" if skipped else ""
    return Check("finite", PASS, f"no non-finite metric, no guard incident{tail}")


def _check_ratio(metrics, opts: CheckOptions) -> Check:
    kl = _series(metrics, "train/ppo_kl")
    if not kl:
        return Check("ratio", SKIP, "train/ppo_kl not logged (OpenRLHF logs it in every PPO step)")
    worst = max(kl, key=abs)
    step = next(m["step"] for m in metrics if m.get("train/ppo_kl") == worst)
    extra = ""
    lr = _series(metrics, "rlhf_ext/guard/max_abs_log_ratio")
    if lr:
        extra = f"; largest |log ratio| of a token {_g(max(lr))}"
    detail = f"|train/ppo_kl| at most {_g(abs(worst))} (step {step}; limit {_g(opts.max_ppo_kl)}){extra}"
    return Check("ratio", PASS if abs(worst) <= opts.max_ppo_kl else FAIL, detail)


def _window(n: int, k: int) -> int:
    return max(1, min(k, n // 2))


def _check_advantage(metrics, opts: CheckOptions) -> Check:
    zv = _series(metrics, "train/zero_variance_group_frac")
    std = _series(metrics, "train/group_reward_std")
    if not zv and not std:
        return Check("advantage", SKIP, "train/zero_variance_group_frac not logged (--rlhf_ext.step_metrics all, "
                                        "the default, logs it)")
    parts, failed = [], False
    if zv:
        k = _window(len(zv), opts.window)
        share = sum(zv[-k:]) / k
        parts.append(f"zero-variance groups {100 * share:.0f}% over the last {k} steps "
                     f"(limit {100 * opts.max_zero_variance:.0f}%)")
        failed |= share >= opts.max_zero_variance
    if std:
        k = _window(len(std), opts.window)
        mean_std = sum(std[-k:]) / k
        parts.append(f"within-group reward std {_g(mean_std)} over the last {k} steps")
        failed |= not mean_std > 0
    return Check("advantage", FAIL if failed else PASS, "; ".join(parts))


def _check_reward(metrics, opts: CheckOptions) -> Check:
    for key in ("train/reward", "rollout/reward_mean", "train/score"):
        values = _series(metrics, key)
        if values:
            break
    else:
        return Check("reward", SKIP, "no reward logged (train/reward, rollout/reward_mean, train/score)")
    if len(values) < 2:
        return Check("reward", SKIP, f"{key}: {len(values)} step, a trend needs 2")
    k = _window(len(values), opts.window)
    first, last = values[:k], values[-k:]
    a, b = statistics.fmean(first), statistics.fmean(last)
    sd = lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0  # noqa: E731
    se = math.sqrt(sd(first) ** 2 / k + sd(last) ** 2 / k)
    diff = b - a
    head = f"{key} first {k} steps {_g(a)} -> last {k} steps {_g(b)} ({diff:+.4f}, 2 SE = {_g(2 * se)})"
    if diff > 2 * se:
        return Check("reward", PASS, head + ": rising")
    if diff < -2 * se:
        return Check("reward", FAIL, head + ": falling")
    if opts.require_rise:
        return Check("reward", FAIL, head + ": no rise beyond the step-to-step noise (--require-rise)")
    return Check("reward", PASS, head + ": flat within the step-to-step noise")


def _check_mismatch(metrics, events, config, opts: CheckOptions) -> Check:
    threshold = opts.mismatch_threshold
    source = "--threshold"
    if threshold is None:
        plugin = config.get("plugin") or {}
        threshold = plugin.get("mismatch_threshold")
        source = "the run's --rlhf_ext.mismatch_threshold"
        if not isinstance(threshold, (int, float)):
            threshold, source = DEFAULT_MISMATCH_THRESHOLD, "default"
    diffs = _series(metrics, "rollout_mismatch/probs_diff_mean")
    warnings = [ev for ev in events if ev.get("event") == "mismatch_warning"]
    if not diffs and not warnings:
        return Check("mismatch", SKIP, "rollout_mismatch/probs_diff_mean not logged (--rlhf_ext.mismatch_metrics)")
    parts, failed = [], False
    if diffs:
        worst = max(diffs)
        step = next(m["step"] for m in metrics if m.get("rollout_mismatch/probs_diff_mean") == worst)
        parts.append(f"rollout_mismatch/probs_diff_mean at most {_g(worst)} (step {step}; threshold "
                     f"{_g(threshold)}, {source})")
        failed |= worst > threshold
    if warnings:
        parts.append(f"mismatch_warning at step {warnings[0].get('step')}")
        failed = True
    return Check("mismatch", FAIL if failed else PASS, "; ".join(parts))


def check_run(run_dir, options: Optional[CheckOptions] = None) -> Verdict:
    """Every check of this module's table on ``run_dir``; raises ``FileNotFoundError`` / ``ValueError``
    on a directory that is not a run record."""
    opts = options or CheckOptions()
    if opts.window < 1:
        raise ValueError(f"window must be >= 1, got {opts.window}")
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    if not any((path / name).exists() for name in (runs.CONFIG, runs.METRICS, runs.EVENTS)):
        raise FileNotFoundError(f"{path} is not a run directory (no {runs.CONFIG}, {runs.METRICS} or {runs.EVENTS})")
    config: Dict[str, Any] = {}
    if (path / runs.CONFIG).exists():
        try:
            config = json.loads((path / runs.CONFIG).read_text())
        except ValueError as exc:
            raise ValueError(f"{path / runs.CONFIG} is not valid JSON: {exc}") from exc
    metrics = runs.read_metrics(path / runs.METRICS)
    events = runs.read_jsonl(path / runs.EVENTS)
    return Verdict(str(path), [
        _check_ended(metrics, events),
        _check_finite(metrics, events),
        _check_ratio(metrics, opts),
        _check_advantage(metrics, opts),
        _check_reward(metrics, opts),
        _check_mismatch(metrics, events, config, opts),
    ])
