"""``--rlhf_ext.mismatch_metrics``: rollout-vs-training probability mismatch, without touching the loss.

OpenRLHF 0.11.2 asks vLLM for the sampled tokens' log-probabilities only when importance-sampling
correction is on (``--algo.advantage.is_correction_level`` not ``off``): the driver then passes
``logprobs_mode="processed_logprobs"`` to ``create_vllm_engines`` (log-probs after temperature,
the distribution the actor's forward divides its logits by) and ``SamplesGenerator`` builds its
``SamplingParams`` with ``logprobs=1``. The rollout actors then fill ``Experience.rollout_log_probs``
for the response tokens. The loss reads ``rollout_log_probs`` only when the correction is on, so
requesting them with the correction off changes nothing in training.

With the flag, three seams do the same request and measure:

* ``vllm_engine.create_vllm_engines`` (driver): ``logprobs_mode="processed_logprobs"`` when the
  caller passed none (the driver learns the flag from ``RLHF_EXT_MISMATCH_METRICS=1``, exported
  by the flag parser, because this function does not receive ``args``);
* ``samples_generator.SamplesGenerator._dispatch_prompts_to_vllm`` and the name ``SamplingParams``
  in that module (trainer actor): ``logprobs=1`` when the call left it ``None``;
* ``experience_maker.RemoteExperienceMaker.make_experience_batch`` (trainer actor): once the
  training engine has computed its log-probs of the same tokens (``action_log_probs``, the
  "old" log-probs, same weights as the rollout), :func:`rlhf_ext.algorithms.mismatch_stats` over
  every response token of the step, pooled across the whole rollout batch.

How the numbers reach the logs: OpenRLHF's ``PPOTrainer`` is a Ray actor, whose methods Ray wraps
when the class is decorated, so its ``train_step`` cannot be patched after import. The step's
statistics therefore travel in ``Experience.info`` as a per-sample tensor holding the same value
for every sample; the policy actor averages ``info`` over samples, micro-batches and data-parallel
ranks, which returns that value unchanged, into the step's status dict. That dict is what
OpenRLHF prints (``Global step N: {...}``), sends to wandb / TensorBoard (as
``train/rollout_mismatch/...``) and what the run record writes to ``metrics.jsonl``.

With ``--train.async_enable`` the rollout log-probs are those vLLM returned with the samples, from
the (older) policy that generated them, never recomputed: the metrics then measure the numerical
mismatch plus the policy lag (:mod:`.policy_lag`).

Above ``--rlhf_ext.mismatch_threshold`` (default 0.005 on ``probs_diff_mean``, verl's normal
range) one warning per run goes to stderr and, through :func:`emit_event`, to the run record.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from contextvars import ContextVar
from typing import Dict, Iterable, Optional

from .config import setting
from .policy_lag import async_enabled

ENV_FLAG = "RLHF_EXT_MISMATCH_METRICS"
METRIC_PREFIX = "rollout_mismatch/"
ROLLOUT_LOGPROBS_MODE = "processed_logprobs"  # what OpenRLHF itself requests for IS correction
DEFAULT_THRESHOLD = 0.005  # rlhf_ext.algorithms.mismatch.DEFAULT_PROBS_DIFF_THRESHOLD (no torch import here)
THRESHOLD_METRIC = METRIC_PREFIX + "probs_diff_mean"
RUN_RECORD_MODULE = "rlhf_ext.patches.openrlhf.run_record"
STATE_ATTR = "_rlhf_ext_mismatch_state"

_request_logprobs: ContextVar[bool] = ContextVar("rlhf_ext_request_logprobs", default=False)


# --- settings ------------------------------------------------------------------------------------


def enabled(args) -> bool:
    return bool(setting(args, "rlhf_ext.mismatch_metrics", False))


def threshold(args) -> float:
    return float(setting(args, "rlhf_ext.mismatch_threshold", DEFAULT_THRESHOLD))


def add_arguments(group) -> None:
    """The flags, in the plugin's argument group of OpenRLHF's PPO parser."""
    group.add_argument(
        "--rlhf_ext.mismatch_metrics", action="store_true", default=False,
        help="ask vLLM for the sampled tokens' log-probs (the loss is unchanged; no IS correction) and log "
        "rollout_mismatch/* each step: |p_train - p_rollout| mean/max/std, their Pearson correlation, "
        "|log-ratio| mean/p99/max, k1/k3 KL, chi-squared and ESS of the token ratios (docs/run_records.md)",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.mismatch_threshold", type=float, default=None, metavar="P",
        help=f"warn once per run when rollout_mismatch/probs_diff_mean exceeds P (default {DEFAULT_THRESHOLD}, "
        "verl's normal range); needs --rlhf_ext.mismatch_metrics",
    )  # fmt: skip


def finalize(namespace) -> Dict[str, str]:
    """Validate the flags; returns the environment the driver exports (``RLHF_EXT_MISMATCH_METRICS``)."""
    on = bool(getattr(namespace, "rlhf_ext.mismatch_metrics", False))
    value = getattr(namespace, "rlhf_ext.mismatch_threshold", None)
    if value is not None:
        if not on:
            raise ValueError("--rlhf_ext.mismatch_threshold needs --rlhf_ext.mismatch_metrics")
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--rlhf_ext.mismatch_threshold must be a positive number, got {value}")
    else:
        setattr(namespace, "rlhf_ext.mismatch_threshold", DEFAULT_THRESHOLD)
    return {ENV_FLAG: "1"} if on else {}


# --- seam 1: the driver creates the vLLM engines ------------------------------------------------


def make_create_vllm_engines(original, module=None):
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def create_vllm_engines(*args, **kwargs):
        if os.environ.get(ENV_FLAG) != "1":
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("logprobs_mode") is None:
            bound.arguments["logprobs_mode"] = ROLLOUT_LOGPROBS_MODE
        return original(*bound.args, **bound.kwargs)

    return create_vllm_engines


# --- seam 2: the trainer builds SamplingParams for each rollout request ---------------------------


def make_dispatch_prompts_to_vllm(original, module=None):
    @functools.wraps(original)
    def _dispatch_prompts_to_vllm(self, prompts, labels, *, images=None, **generate_kwargs):
        token = _request_logprobs.set(enabled(self.args))
        try:
            return original(self, prompts, labels, images=images, **generate_kwargs)
        finally:
            _request_logprobs.reset(token)

    return _dispatch_prompts_to_vllm


def make_sampling_params(original, module=None):
    """``SamplingParams(...)`` as seen by ``samples_generator``: ``logprobs=1`` while a patched dispatch asks."""

    @functools.wraps(original, updated=())
    def SamplingParams(*args, **kwargs):
        if _request_logprobs.get() and kwargs.get("logprobs") is None:
            kwargs["logprobs"] = 1  # the sampled token's log-prob (vLLM adds it to the top-k it returns)
        return original(*args, **kwargs)

    return SamplingParams


# --- seam 3: the trainer has both log-probs of the step's tokens --------------------------------


class _State:
    """Per experience maker (one per training run in the trainer actor)."""

    __slots__ = ("batches", "warned", "missing_warned")

    def __init__(self):
        self.batches = 0
        self.warned = False
        self.missing_warned = False


def step_metrics(experiences: Iterable) -> Optional[Dict[str, float]]:
    """``rollout_mismatch/*`` over every response token of ``experiences`` (``None``: no rollout log-probs)."""
    import torch

    from rlhf_ext.algorithms import mismatch_stats

    train, rollout = [], []
    for exp in experiences:
        if exp.rollout_log_probs is None or exp.action_log_probs is None:
            continue
        mask = exp.action_mask.bool()
        if exp.rollout_log_probs.shape != mask.shape or exp.action_log_probs.shape != mask.shape:
            raise ValueError(
                f"rollout_mismatch: shapes differ: action_mask {tuple(mask.shape)}, action_log_probs "
                f"{tuple(exp.action_log_probs.shape)}, rollout_log_probs {tuple(exp.rollout_log_probs.shape)}"
            )
        train.append(exp.action_log_probs.detach().float().cpu()[mask.cpu()])
        rollout.append(exp.rollout_log_probs.detach().float().cpu()[mask.cpu()])
    if not train:
        return None
    stats = mismatch_stats(torch.cat(train), torch.cat(rollout))
    return {METRIC_PREFIX + k: v for k, v in stats.items()}


def attach(experiences, metrics: Dict[str, float]) -> None:
    """Put each step-level value into every sample's ``info`` (see the module docstring for why)."""
    import torch

    for exp in experiences:
        n = exp.action_mask.shape[0]
        for key, value in metrics.items():
            exp.info[key] = torch.full((n,), float(value), dtype=torch.float32)


ASYNC_NOTE = (" With --train.async_enable the rollouts come from an older policy than the trainer's (see "
              "rlhf_ext/policy_lag), so this also measures the policy lag, which the correction is meant to absorb.")


def warning_message(value: float, limit: float, batch: int, async_mode: bool = False) -> str:
    return (
        f"rlhf_ext: warning: {THRESHOLD_METRIC} = {value:.4g} exceeds {limit:g} (rollout batch {batch}): vLLM and "
        "the trainer disagree on the sampled tokens' probabilities, so on-policy training is running off-policy. "
        "Likely causes: the rollout dtype differs from training (vLLM runs bfloat16 in OpenRLHF), FP8 rollout "
        "quantization, device kernels (vllm-ascend vs torch_npu on NPU), or vLLM not running the trainer's "
        "latest weights (a broken weight sync). Qualify the rollout setup with "
        "`rlhf-ext alignment --model M --data prompts.jsonl`; --algo.advantage.is_correction_level token "
        "corrects for it (truncated importance sampling, Yao et al. 2025). Reported once per run."
        + (ASYNC_NOTE if async_mode else "")
    )


def emit_event(event: Dict) -> bool:
    """Hand one event to the run record; the only place this module's events leave it.

    Hook for the run record (docs/run_records.md): when ``rlhf_ext.patches.openrlhf.run_record``
    exists and defines ``emit_event(event: dict)``, it is called with ``event`` -- the
    ``events.jsonl`` fields ``event``, ``time``, ``metric``, ``value``, ``threshold``, ``message``
    and ``rollout_batch`` (the run record adds the global ``step`` it is writing). Without that
    module the warning line on stderr is the whole record. Returns whether the event was handed on.
    """
    from importlib import import_module, util

    if util.find_spec(RUN_RECORD_MODULE) is None:
        return False

    hook = getattr(import_module(RUN_RECORD_MODULE), "emit_event", None)
    if hook is None:
        return False
    hook(event)
    return True


def check_threshold(state: _State, metrics: Dict[str, float], limit: float, async_mode: bool = False) -> Optional[Dict]:
    """The warning event the first time ``probs_diff_mean`` exceeds ``limit`` in this run, else ``None``."""
    value = metrics.get(THRESHOLD_METRIC)
    if state.warned or value is None or not value > limit:
        return None
    state.warned = True
    message = warning_message(value, limit, state.batches, async_mode)
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    event = {
        "event": "mismatch_warning",
        "time": time.time(),
        "metric": THRESHOLD_METRIC,
        "value": value,
        "threshold": limit,
        "message": message,
        "rollout_batch": state.batches,
    }
    emit_event(event)
    return event


def make_make_experience_batch(original, module=None):
    @functools.wraps(original)
    def make_experience_batch(self, rollout_samples):
        experiences = original(self, rollout_samples)
        args = self.strategy.args
        if not enabled(args):
            return experiences
        state = self.__dict__.setdefault(STATE_ATTR, _State())
        state.batches += 1
        from .rollout_correction import inject_test_mismatch

        inject_test_mismatch(experiences, state.batches)  # tests only (RLHF_EXT_TEST_ROLLOUT_LOGPROB_NOISE)
        try:
            metrics = step_metrics(experiences)
        except ValueError as exc:  # NaN log-probs: the run's own checks report those; the metric says why it is absent
            sys.stderr.write(f"rlhf_ext: warning: rollout_mismatch skipped for rollout batch {state.batches}: {exc}\n")
            return experiences
        if metrics is None:
            if not state.missing_warned:
                state.missing_warned = True
                sys.stderr.write(
                    "rlhf_ext: warning: --rlhf_ext.mismatch_metrics: these experiences carry no rollout "
                    "log-probs (no vLLM engines?); rollout_mismatch/* is not logged\n"
                )
            return experiences
        attach(experiences, metrics)
        check_threshold(state, metrics, threshold(args), async_enabled(args))
        return experiences

    return make_experience_batch
