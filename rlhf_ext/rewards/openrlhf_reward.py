"""OpenRLHF reward file: ``--reward.remote_url $(python -m rlhf_ext.rewards.path)``.

OpenRLHF loads this file by path in every rollout actor and calls :func:`reward_func` once per
sample from worker threads. What is rewarded comes from the ``RLHF_EXT_REWARD*`` environment
variables (see :mod:`rlhf_ext.rewards.config`; the ``rlhf_ext`` plugin sets them from its flags):
by default ``math`` = correctness 1.0 + answer-format bonus 0.2 - truncation penalty 0.5.
"""

import logging
import time

import numpy
import torch

from rlhf_ext.rewards.openrlhf_protocol import ERROR_KEY, scorer_from_env

logger = logging.getLogger("rlhf_ext.rewards.openrlhf_reward")
_last_config_error_log = [0.0]


def _as_list(x):
    # a list goes through as it is: the scorer copies what it keeps (check_batch)
    return x if type(x) is list else list(x) if isinstance(x, tuple) else x


def _config_error(n: int, exc: Exception) -> dict:
    """A bad configuration: report on every sample, do not crash the job."""
    now = time.monotonic()
    if now - _last_config_error_log[0] > 10:
        _last_config_error_log[0] = now
        logger.error("rlhf_ext reward configuration is invalid, every sample scores 0: %s", exc)
    return {"rewards": [0.0] * n, "scores": [0.0] * n, "extra_logs": {ERROR_KEY: [1.0] * n}}


def _tensors(out: dict) -> dict:
    # One float32 array for all rows, and a tensor on each of its rows: OpenRLHF calls this once per
    # sample from a pool of threads. torch.from_numpy keeps the GIL; torch's ops (unbind, split) let it go
    # and take it back, and with several threads waiting that cost more than the whole call (issue 41:
    # 0.06-0.09 ms a call against 0.016 here). Each row tensor owns just its row's memory (it pickles alone).
    logs = out["extra_logs"]
    if len(out["rewards"]) == 1:
        # One sample (OpenRLHF's per-sample call): each log is a float. OpenRLHF 0.11.2 turns every value
        # into a tensor itself (samples_generator: a tensor's first element read back by .item(), then
        # torch.tensor([value])), so eleven one-element tensors made here were a third of the call.
        try:
            floats = {key: float(value) for key, (value,) in logs.items()}
            rows = list(map(torch.from_numpy, numpy.array((out["rewards"], out["scores"]), dtype=numpy.float32)))
            return {"rewards": rows[0], "scores": rows[1], "extra_logs": floats}
        except (ValueError, TypeError):  # rows of different lengths: never from the scorer, but never raise
            pass
    values = [out["rewards"], out["scores"], *logs.values()]
    try:
        rows = list(map(torch.from_numpy, numpy.array(values, dtype=numpy.float32)))
    except (ValueError, TypeError):  # rows of different lengths: never from the scorer, but never raise
        rows = [torch.tensor(v, dtype=torch.float32) for v in values]
    return {"rewards": rows[0], "scores": rows[1], "extra_logs": dict(zip(logs, rows[2:]))}


def reward_func(queries, prompts, labels, **kwargs):
    """OpenRLHF's rule-reward entry point; returns ``{"rewards", "scores", "extra_logs"}``: float32 tensors
    of one value per sample, and the logs as floats for one sample (OpenRLHF's call), else tensors.

    ``queries``: decoded prompt+response (special tokens kept); ``prompts``: the prompts; ``labels``:
    the gold answers from ``--data.label_key``. ``scores`` is the correctness (0/1) that dynamic
    filtering reads; ``extra_logs`` holds every reward component and the counted flags (no answer,
    unparsed gold, timeout, truncation, errors). Never raises: a failure scores 0 and sets
    ``reward_flag/error``.
    """
    try:
        n = len(queries)
    except TypeError:
        n = 1
    try:
        scorer = scorer_from_env()
    except Exception as exc:
        return _tensors(_config_error(n, exc))
    if n == 1 and type(queries) is list and type(prompts) is list and type(labels) is list \
            and len(prompts) == len(labels) == 1:  # OpenRLHF's call: one sample, scored without lists
        out = scorer.score_sample(queries[0], prompts[0], labels[0])
        rows = numpy.array(((out["rewards"],), (out["scores"],)), dtype=numpy.float32)
        return {"rewards": torch.from_numpy(rows[0]), "scores": torch.from_numpy(rows[1]),
                "extra_logs": out["extra_logs"]}
    return _tensors(scorer.score(_as_list(queries), _as_list(prompts), _as_list(labels)))


def reward_func_calls(calls):
    """Many :func:`reward_func` calls at once, ``calls`` = ``[(queries, prompts, labels), ...]``: one
    output per call, each exactly what ``reward_func(*call)`` returns, with the grading of all of them
    shared (:meth:`RewardScorer.score_calls`). The ``rlhf_ext`` plugin's OpenRLHF rollout path calls
    this with the per-sample calls that arrive together (:mod:`rlhf_ext.patches.openrlhf.reward_batching`).
    Never raises."""
    calls = [(_as_list(q), _as_list(p), _as_list(lab)) for q, p, lab in calls]
    try:
        scorer = scorer_from_env()
    except Exception as exc:
        return [_tensors(_config_error(len(q) if isinstance(q, list) else 1, exc)) for q, _, _ in calls]
    # one tensor per call, never views of a tensor shared by calls: OpenRLHF sends each sample's output
    # through Ray, and pickling a view pickles its whole storage: every sample would carry the whole batch
    return [_tensors(out) for out in scorer.score_calls(calls)]
