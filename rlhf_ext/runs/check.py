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
               within-group reward std (``train/group_reward_std``) is above 0. A run of under 4
               steps (one step in the last window) that misses this is ``N/A``: one step's few groups
               can all agree by chance
``reward``     the reward is not moving the wrong way: the mean of the last ``window`` steps minus
               that of the first ``window`` steps is not below -2 Welch standard errors
               (``sqrt(sd_first^2/k + sd_last^2/k)``, steps treated as independent draws; the
               report's headline uses the same test). With ``require_rise`` it must be above +2 SE.
               Where the noise cannot be estimated -- fewer than 2 steps in a window (a run of under
               4 steps: one step per window has no spread) or no spread in either window while the
               means differ -- the check says ``not enough steps to judge`` (``N/A``), never FAIL
``mismatch``   rollout vs training mismatch stayed under its threshold: the largest
               ``rollout_mismatch/probs_diff_mean`` is at most the run's
               ``--rlhf_ext.mismatch_threshold`` (default 0.005) and no ``mismatch_warning`` event;
               steps with an async policy lag (``rlhf_ext/policy_lag`` > 0) are left out: their
               vLLM log-probs are an older policy's, so the difference includes the policy's change
=============  =====================================================================================

A check whose metric the run did not log is ``SKIP`` with what to switch on, and a trend too short
to judge is ``N/A``; neither fails the verdict. The verdict is ``PASS`` (exit code 0) when no check
failed, else ``FAIL`` (exit code 1).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .files import CONFIG, EVENTS, METRICS, POLICY_LAG, read_jsonl, read_metrics
from .status import RUNNING, run_status

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
NOT_JUDGED = "N/A"  # a trend the run is too short (or too quiet) to judge: does not fail the verdict
NOT_ENOUGH_STEPS = "not enough steps to judge"
MIN_TREND_WINDOW = 2  # steps per window for a spread, hence a standard error
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
        out = [f"{c.status:<4}  {c.name:<{width}}  {c.detail}" for c in self.checks]
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, SKIP, NOT_JUDGED)}
        unjudged = f", {counts[NOT_JUDGED]} not judged" if counts[NOT_JUDGED] else ""
        out.append(f"verdict: {PASS if self.passed else FAIL} ({counts[PASS]} passed, {counts[FAIL]} failed, "
                   f"{counts[SKIP]} skipped{unjudged}) for {self.run_dir}")
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"run_dir": self.run_dir, "verdict": PASS if self.passed else FAIL,
                "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks]}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> List[float]:
    return [float(m[key]) for m in metrics if _number(m.get(key))]


def _g(x: float) -> str:
    return f"{x:.4g}"


def _check_ended(metrics, events) -> Check:
    status, code = run_status(events)
    n = len(metrics)
    steps = f"{n} step{'s' if n != 1 else ''} recorded" + (f" (last {metrics[-1]['step']})" if metrics else "")
    if not events:
        return Check("ended", FAIL, f"no events.jsonl entries: the run never started its record; {steps}")
    if status == RUNNING:
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
    n = max(len(zv), len(std))
    if failed and _window(n, opts.window) < MIN_TREND_WINDOW:
        # one step's few groups can all agree by chance (4 groups of 4 samples at a 25% pass rate: 1 in 3
        # steps); a collapse is a run that keeps them agreeing, which a run of under 4 steps cannot show
        return Check("advantage", NOT_JUDGED, "; ".join(parts) + f": {NOT_ENOUGH_STEPS} ({n} step"
                     f"{'s' if n != 1 else ''}; a collapse needs {MIN_TREND_WINDOW} steps in the last window)")
    return Check("advantage", FAIL if failed else PASS, "; ".join(parts))


def _check_reward(metrics, opts: CheckOptions) -> Check:
    for key in ("train/reward", "rollout/reward_mean", "train/score"):
        values = _series(metrics, key)
        if values:
            break
    else:
        return Check("reward", SKIP, "no reward logged (train/reward, rollout/reward_mean, train/score)")
    k = _window(len(values), opts.window)
    first, last = values[:k], values[-k:]
    a, b = statistics.fmean(first), statistics.fmean(last)
    diff = b - a
    if k < MIN_TREND_WINDOW:
        steps = f"{len(values)} step{'s' if len(values) != 1 else ''}"
        return Check("reward", NOT_JUDGED,
                     f"{key} first step {_g(a)} -> last step {_g(b)} ({diff:+.4f}): {NOT_ENOUGH_STEPS} ({steps}; "
                     f"a trend needs {MIN_TREND_WINDOW} steps in each of the first and last windows, "
                     f"{2 * MIN_TREND_WINDOW} steps in all, for their spread)")
    se = math.sqrt(statistics.stdev(first) ** 2 / k + statistics.stdev(last) ** 2 / k)
    head = f"{key} first {k} steps {_g(a)} -> last {k} steps {_g(b)} ({diff:+.4f}, 2 SE = {_g(2 * se)})"
    if se == 0 and diff != 0:
        return Check("reward", NOT_JUDGED, head + f": {NOT_ENOUGH_STEPS} (no spread within either window, so the "
                                                  "step-to-step noise is unknown)")
    if diff > 2 * se:
        return Check("reward", PASS, head + ": rising")
    if diff < -2 * se:
        return Check("reward", FAIL, head + ": falling")
    if opts.require_rise:
        return Check("reward", FAIL, head + ": no rise beyond the step-to-step noise (--require-rise)")
    return Check("reward", PASS, head + ": flat within the step-to-step noise")


def _check_mismatch(metrics, events, config, opts: CheckOptions) -> Check:
    threshold = opts.mismatch_threshold
    source = "--mismatch-threshold"
    if threshold is None:
        plugin = config.get("plugin") or {}
        threshold = plugin.get("mismatch_threshold")
        source = "the run's --rlhf_ext.mismatch_threshold"
        if not isinstance(threshold, (int, float)):
            threshold, source = DEFAULT_MISMATCH_THRESHOLD, "default"
    # An async run's batch may come from an older policy (rlhf_ext/policy_lag > 0): its vLLM log-probs then
    # differ from the trainer's by the policy's own change, which is not a numerical mismatch
    lagged = {m["step"] for m in metrics if _number(m.get(POLICY_LAG)) and m[POLICY_LAG] > 0}
    diffs = _series([m for m in metrics if m["step"] not in lagged], "rollout_mismatch/probs_diff_mean")
    warnings = [ev for ev in events if ev.get("event") == "mismatch_warning" and ev.get("step") not in lagged]
    if lagged and not diffs and not warnings:
        return Check("mismatch", NOT_JUDGED, f"every step with rollout_mismatch/* had a policy lag ({POLICY_LAG} > 0, "
                                             "async): its mismatch includes the policy's change; "
                                             f"{NOT_ENOUGH_STEPS} at lag 0")
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
    if lagged:
        parts.append(f"{len(lagged)} step(s) with a policy lag left out (async: their mismatch includes the "
                     "policy's change)")
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
    if not any((path / name).exists() for name in (CONFIG, METRICS, EVENTS)):
        raise FileNotFoundError(f"{path} is not a run directory (no {CONFIG}, {METRICS} or {EVENTS})")
    config: Dict[str, Any] = {}
    if (path / CONFIG).exists():
        try:
            config = json.loads((path / CONFIG).read_text())
        except ValueError as exc:
            raise ValueError(f"{path / CONFIG} is not valid JSON: {exc}") from exc
    metrics = read_metrics(path / METRICS)
    events = read_jsonl(path / EVENTS)
    return Verdict(str(path), [
        _check_ended(metrics, events),
        _check_finite(metrics, events),
        _check_ratio(metrics, opts),
        _check_advantage(metrics, opts),
        _check_reward(metrics, opts),
        _check_mismatch(metrics, events, config, opts),
    ])
