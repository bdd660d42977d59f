"""Synthetic run records in the run record format, for trying the report and testing it at scale.

``write_synthetic_run(path, steps=10_000, ...)`` writes ``config.json``, ``metrics.jsonl`` and
``events.jsonl`` shaped like an OpenRLHF + rlhf_ext run: a batch pass rate that rises along a
logistic curve (binomial noise of ``samples_per_step`` samples), reward, response length against
its limit, grad-norm spikes, clip fractions, KL, mismatch metrics and per-phase timing. Options
produce the awkward cases: a resumed run (steps redone after a restart, its clock restarting),
a run still running, one stopped by the guard with a non-finite loss, missing keys, and a torn
last line. Nothing here is real data; docs/report.md says which screenshot came from real runs.

    python -m rlhf_ext.report.synthetic OUT_DIR [--runs 3] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from .. import runs

_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "maxrl", "passk", "gspo", "grpo", "dr_grpo", "rloo")


def _dump(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def write_synthetic_run(path, *, steps: int = 200, seed: int = 0, estimator: str = "grpo", name: Optional[str] = None,
                        start_rate: float = 0.25, final_rate: float = 0.6, speed: float = 1.0,
                        samples_per_step: int = 32, max_len: int = 64, status: str = "finished",
                        resume: Optional[tuple] = None, nonfinite_at: Optional[int] = None,
                        mismatch: bool = True, omit: Sequence[str] = (), torn_tail: bool = False,
                        checkpoint_every: int = 0, step_seconds: float = 6.0, extra_args: Optional[dict] = None) -> Path:
    """Write one synthetic run directory; returns its path.

    ``resume=(crash_step, resume_step)``: the first attempt logs steps up to ``crash_step``, then
    the run resumes from the checkpoint at ``resume_step - 1`` and redoes steps from
    ``resume_step`` with a clock that starts again at 0. ``status``: finished, running (no end
    event), stopped_by_guard (with ``nonfinite_at``, the loss is non-finite there and the run ends
    at that step), crashed. ``omit``: metric keys never written.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    name = name or path.name
    started = 1_700_000_000.0 + seed * 1000
    args = {
        "algo.advantage.estimator": "grpo" if estimator == "gspo" else estimator,
        "actor.policy_loss_type": "gspo" if estimator == "gspo" else "ppo",
        "actor.loss_agg_mode": "seq-mean-token-sum-norm" if estimator == "dr_grpo" else "token-mean",
        "algo.kl.estimator": "k3", "algo.kl.init_coef": 0.001, "algo.kl.use_loss": True, "algo.kl.clip": [-10, 10],
        "actor.eps_clip_low_high": [0.2, 0.28], "rollout.n_samples_per_prompt": 4,
        "rollout.batch_size": samples_per_step // 4, "rollout.generate_max_len": max_len,
        "actor.adam.lr": 1e-6, "train.seed": seed, "ckpt.path": str(path / "ckpt"),
        "ckpt.output_dir": str(path / "final"), "actor.model_name_or_path": "/models/base",
        **(extra_args or {}),
    }
    config = {
        "schema": runs.SCHEMA, "name": name, "args": args,
        "plugin": {"version": "0.1.0", "guard": "stop", "mismatch_metrics": mismatch, "mismatch_threshold": 0.005},
        "versions": {"rlhf_ext": "0.1.0", "openrlhf": "0.11.2", "torch": "2.13.0", "vllm": "0.32.0"},
        "git": {"commit": "0" * 40, "dirty": False, "cwd": str(path)},
        "data_sha256": {"/data/train.jsonl": "ab" * 32}, "started_at": started,
    }
    runs.write_json_atomic(path / runs.CONFIG, config)

    last = steps if nonfinite_at is None or status != "stopped_by_guard" else nonfinite_at
    t = np.arange(1, steps + 1)
    p = start_rate + (final_rate - start_rate) / (1 + np.exp(-speed * 10 * (t / steps - 0.35)))
    events = [{"event": "start", "time": started, "step": 0}]
    lines = []

    def step_line(step: int, elapsed: float) -> dict:
        i = step - 1
        rate = rng.binomial(samples_per_step, p[i]) / samples_per_step
        length = max_len * (0.35 + 0.25 * (1 - step / steps)) + rng.normal(0, 2)
        gn = float(rng.lognormal(-0.5, 0.3) * (15 if rng.random() < 0.005 else 1))
        gen, train, sync = (step_seconds * f * rng.uniform(0.9, 1.1) for f in (0.55, 0.35, 0.1))
        rec = {
            "step": step, "time": started + elapsed, "elapsed_s": elapsed,
            "train/score": rate, "train/reward": rate + 0.2 * rng.uniform(0.7, 1.0),
            "train/response_length": length, "rollout/response_length_mean": length,
            "rollout/truncated_rate": max(0.0, 0.05 * (1 - step / steps) + rng.normal(0, 0.01)),
            "rollout/num_samples": float(samples_per_step),
            "train/actor_grad_norm": gn, "train/policy_loss": float(rng.normal(0, 0.05)),
            "train/entropy_loss": 1.2 * math.exp(-step / steps) + rng.normal(0, 0.02),
            "train/clip_frac_low": abs(rng.normal(0.01, 0.004)), "train/clip_frac_high": abs(rng.normal(0.02, 0.006)),
            "train/ppo_clip_ratio": abs(rng.normal(0.03, 0.008)), "train/kl": 0.002 * step / steps + abs(rng.normal(0, 2e-4)),
            "timing/generation": gen, "timing/ppo_train": train, "timing/broadcast": sync,
            "timing/step_total": gen + train + sync,
        }
        # mechanism metrics, derived without new random draws (the other series stay as they were)
        rec["train/zero_variance_group_frac"] = rate ** 4 + (1 - rate) ** 4  # P(all 4 samples agree)
        rec["train/advantage_std"] = 1.0 - rec["train/zero_variance_group_frac"]
        rec["train/ppo_kl"] = 1e-3 * rec["train/ppo_clip_ratio"]
        if mismatch:
            rec["rollout_mismatch/probs_diff_mean"] = abs(rng.normal(0.003, 0.0008))
            rec["rollout_mismatch/probs_corr_loss_1e4"] = 10 * rec["rollout_mismatch/probs_diff_mean"]
        if checkpoint_every and step % checkpoint_every == 0:
            rec["eval/accuracy"] = rate  # OpenRLHF's eval metrics on the steps that evaluate (--eval.steps)
        if nonfinite_at == step:
            rec["train/policy_loss"] = None
            rec["nonfinite"] = ["train/policy_loss"]
        for key in omit:
            rec.pop(key, None)
        return rec

    elapsed = 0.0
    crash_step, resume_step = resume if resume else (None, None)
    for step in range(1, (crash_step or last) + 1):
        elapsed += step_seconds
        lines.append(step_line(step, elapsed))
        if checkpoint_every and step % checkpoint_every == 0:
            events.append({"event": "checkpoint", "time": started + elapsed, "step": step,
                           "path": str(path / "ckpt" / f"global_step{step}_hf")})
        if mismatch and step == 3 and seed % 2 == 1:
            events.append({"event": "mismatch_warning", "time": started + elapsed, "step": step,
                           "metric": "rollout_mismatch/probs_diff_mean", "value": 0.0071, "threshold": 0.005,
                           "message": "rollout and training probabilities disagree; check the rollout dtype"})
    if resume:
        events.append({"event": "resume", "time": started + elapsed + 600, "step": resume_step})
        elapsed = 0.0  # the resumed process starts its own clock
        for step in range(resume_step, last + 1):
            elapsed += step_seconds
            lines.append(step_line(step, elapsed))
            if checkpoint_every and step % checkpoint_every == 0:
                events.append({"event": "checkpoint", "time": started + elapsed, "step": step,
                               "path": str(path / "ckpt" / f"global_step{step}_hf")})
    end_time = started + elapsed
    if status == "stopped_by_guard" and nonfinite_at is not None:
        events.append({"event": "guard_incident", "time": end_time, "step": nonfinite_at, "tensor": "loss",
                       "rank": 0, "mode": "stop", "incident": runs.INCIDENT})
        runs.write_json_atomic(path / runs.INCIDENT, {
            "step": nonfinite_at, "micro_batch": 1, "tensor": "loss", "rank": 0, "sample_indices": [4, 5],
            "prompts": ["What is 2 + 2?", "What is 3 + 5?"], "last_good_checkpoint": None, "time": end_time})
    if status != "running":
        events.append({"event": "end", "time": end_time, "step": last, "status": status,
                       "exit_code": {"finished": 0, "stopped_by_guard": 3, "crashed": 1}.get(status, 1)})
    runs.rewrite_jsonl(path / runs.METRICS, lines)
    if torn_tail:  # a writer killed mid-line
        with open(path / runs.METRICS, "a") as f:
            f.write(_dump(step_line(last + 1, elapsed + step_seconds))[:40])
    runs.rewrite_jsonl(path / runs.EVENTS, events)
    return path


def write_synthetic_eval(path, *, model, accuracy: float, problems: int = 40, n_samples: int = 8, seed: int = 0,
                         task: str = "gsm8k", difficulty: Optional[np.ndarray] = None) -> Path:
    """An evalkit output directory (``config.json``, ``samples.jsonl``, ``summary.json``) written
    with evalkit's own storage and summary code, for a model that answers problem ``i`` correctly
    with probability ``accuracy`` shifted by the problem's ``difficulty`` (shared between
    evaluations of the same problems, so paired comparisons see correlated scores)."""
    from ..evalkit.records import SampleLog, write_json_atomic
    from ..evalkit.summary import summarize

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if difficulty is None:
        difficulty = np.random.default_rng(12345).normal(0, 1.5, problems)
    logit = math.log(accuracy / (1 - accuracy)) + np.asarray(difficulty)[:problems]
    p = 1 / (1 + np.exp(-logit))
    ids = [f"p{i}" for i in range(problems)]
    config = {
        "format_version": 1, "tool": "rlhf_ext.evalkit", "suite": task, "tasks": [task], "status": "complete",
        "generation": {"model": str(model), "template": "chat", "temperature": 1.0, "top_p": 1.0, "max_tokens": 16,
                       "seed": 0, "datasets": {task: "cd" * 32}},
        "n_samples": n_samples, "limit": None,
        "datasets": {task: {"source": "synthetic", "sha256": "cd" * 32, "problems": problems, "problem_ids": ids}},
        "statistics": {"bootstrap_resamples": 1000, "bootstrap_seed": 0, "confidence": 0.95},
    }
    records = []
    for i, pid in enumerate(ids):
        for j in range(n_samples):
            ok = bool(rng.random() < p[i])
            answer = str(i) if ok else str(int(rng.integers(100, 103)))
            records.append({"task": task, "problem_id": pid, "sample_index": j, "correct": ok, "extracted": answer,
                            "response_tokens": 8, "truncated": False, "gold_parsed": True, "grade_timeout": False,
                            "grade_error": None})
    write_json_atomic(path / "config.json", config)
    with SampleLog(path / "samples.jsonl") as log:
        log.append(records)
    write_json_atomic(path / "summary.json", summarize(records, config))
    return path


def write_synthetic_runs(root, runs: int = 3, steps: int = 2000, seed: int = 0) -> list:
    """``runs`` finished runs of ``steps`` steps with different estimators and learning speeds."""
    root = Path(root)
    return [write_synthetic_run(root / f"{_ESTIMATORS[i % len(_ESTIMATORS)]}_{i}", steps=steps, seed=seed + i,
                                estimator=_ESTIMATORS[i % len(_ESTIMATORS)], speed=0.8 + 0.15 * i,
                                final_rate=0.5 + 0.03 * i)
            for i in range(runs)]


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.report.synthetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="directory to write the run directories into")
    parser.add_argument("--runs", type=int, default=3, help="number of runs (default 3)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per run (default 2000)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    for d in write_synthetic_runs(args.output, args.runs, args.steps):
        print(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
