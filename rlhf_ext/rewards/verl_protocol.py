"""verl's ``compute_score`` contract, without importing verl: the implementation behind the reward
file :mod:`rlhf_ext.rewards.verl_reward` (``python -m rlhf_ext.rewards.path --verl``).

verl (0.9.x) loads the reward file by path in its reward workers and calls :func:`compute_score` in one
of two shapes (``verl/experimental/reward_loop/reward_manager/naive.py`` and
``verl/workers/reward_manager/batch.py``):

* per sample, from the threads of an executor: ``compute_score(data_source=, solution_str=,
  ground_truth=, extra_info=, **reward_kwargs)`` -> one dict;
* batched (``reward.reward_manager.name=batch``): ``compute_score(data_sources=, solution_strs=,
  ground_truths=, extra_infos=, **reward_kwargs)`` -> one dict per sample.

``solution_str`` is the decoded response alone (special tokens skipped), so nothing needs to be
recovered from a prompt. Each dict has ``score`` (the weighted reward verl trains on), ``acc``
(1.0/0.0 correctness, what verl's DAPO-style filters and validation read), ``reward_<name>`` per
component and ``flag_<name>`` per grading flag (no answer, unparsed gold, timeout, ...), the same
keys for every sample, as verl's metric collection expects.

What is rewarded: ``reward.custom_reward_function.reward_kwargs`` (verl passes them on every call)
or else the ``RLHF_EXT_REWARD*`` variables (:mod:`rlhf_ext.rewards.config`):

==================  =====================================================  ====================
reward_kwargs key   meaning                                                default
==================  =====================================================  ====================
``reward``          weighted spec or preset (``math``, ``open_r1``)        ``math``
``timeout``         hard limit per sample, seconds (the worker is killed)  ``5``
``workers``         grader worker processes in this reward process         min(CPUs, 8)
``options``         per-reward options, ``{"cosine": {"max_len": 2000}}``  none
==================  =====================================================  ====================

Grading runs in :class:`rlhf_ext.rewards.MathGrader`'s worker processes: safe from any thread,
bounded by the timeout, and model text is never executed. ``truncation`` needs to know whether a
response was cut off, which verl's contract does not say: it reads ``extra_info["truncated"]``
when the dataset or an agent loop provides it, and is 0 otherwise. Never raises: a bad
configuration or a failure scores 0 with ``error`` = 1.0 and an error log line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rlhf_ext.rewards.composite import FLAG_NAMES, WeightedReward
from rlhf_ext.rewards.config import ENV_VARS, RewardConfig, reward_config_from_env

logger = logging.getLogger("rlhf_ext.rewards.verl_protocol")

# Keyword arguments verl itself adds to calls (sandbox, reward-model router); they are not ours.
VERL_KWARGS = frozenset({
    "sandbox_fusion_url", "concurrent_semaphore", "memory_limit_mb", "reward_router_address",
    "reward_model_tokenizer",
})
CONFIG_KWARGS = ("reward", "timeout", "workers", "options")
ERROR_KEY = "error"

_lock = threading.Lock()
_rewards: Dict[str, WeightedReward] = {}
_configs: Dict[str, RewardConfig] = {}
_last_error_log = [0.0]


def _config(kwargs: Mapping[str, Any]) -> RewardConfig:
    """The reward configuration of one call: reward_kwargs over the environment; ``ValueError`` names the problem.

    Cached per (kwargs, environment): verl calls once per sample with the same kwargs, and
    validating a configuration builds the reward once.
    """
    env = tuple(os.environ.get(name) for name in ENV_VARS)
    key = json.dumps([sorted((str(k), _plain(v)) for k, v in kwargs.items() if k not in VERL_KWARGS), env],
                     default=repr)
    with _lock:
        cached = _configs.get(key)
    if cached is None:
        cached = _build_config(kwargs)
        with _lock:
            if len(_configs) > 64:
                _configs.clear()
            _configs[key] = cached
    return cached


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _build_config(kwargs: Mapping[str, Any]) -> RewardConfig:
    unknown = sorted(set(kwargs) - set(CONFIG_KWARGS) - VERL_KWARGS)
    if unknown:
        raise ValueError(f"unknown reward_kwargs {', '.join(map(repr, unknown))}; rlhf_ext's compute_score takes "
                         f"{', '.join(CONFIG_KWARGS)}")
    base = reward_config_from_env()
    options = kwargs.get("options", base.options)
    if isinstance(options, str):  # a JSON string is easier to pass through a shell and Hydra
        try:
            options = json.loads(options)
        except json.JSONDecodeError as exc:
            raise ValueError(f"reward_kwargs.options is not valid JSON: {exc}") from None
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"reward_kwargs.options must be a mapping, got {type(options).__name__}")
    # OmegaConf containers arrive here from verl's config: turn them into plain dicts.
    options = {str(k): dict(v) if isinstance(v, Mapping) else v for k, v in (options or {}).items()}
    timeout = kwargs.get("timeout", base.timeout)
    if isinstance(timeout, str):
        try:
            timeout = float(timeout)
        except ValueError:
            raise ValueError(f"reward_kwargs.timeout must be a number of seconds, got {timeout!r}") from None
    return RewardConfig(reward=str(kwargs.get("reward", base.reward)), timeout=timeout,
                        workers=kwargs.get("workers", base.workers), options=options, eos_tokens=base.eos_tokens,
                        tokenizer=base.tokenizer).validate()


def get_weighted_reward(config: RewardConfig) -> WeightedReward:
    """One :class:`WeightedReward` (and grader pool) per configuration per process, shared by all threads."""
    key = json.dumps([config.reward, config.timeout, config.workers, {k: dict(v) for k, v in config.options.items()}],
                     sort_keys=True, default=str)
    with _lock:
        reward = _rewards.get(key)
        if reward is None:
            reward = WeightedReward(config.reward, options=config.options, timeout=config.timeout,
                                    workers=config.workers)
            _rewards[key] = reward
        return reward


def close_all() -> None:
    """Stop every grader pool this module started (tests; workers also die with the process)."""
    with _lock:
        rewards = list(_rewards.values())
        _rewards.clear()
    for reward in rewards:
        reward.close()


def _log_error(message: str, *args) -> None:
    now = time.monotonic()
    if now - _last_error_log[0] > 10:  # once per 10 s: a broken setup must not flood the log
        _last_error_log[0] = now
        logger.error(message, *args)


def _truncated_flags(extra_infos: Sequence[Any]) -> Optional[List[bool]]:
    flags = [info.get("truncated") if isinstance(info, Mapping) else None for info in extra_infos]
    if all(f is None for f in flags):
        return None
    return [bool(f) for f in flags]


def _keys(reward: Optional[WeightedReward]) -> Tuple[str, ...]:
    names = [f"reward_{name}" for name, _ in reward.weights] if reward is not None else []
    return ("score", "acc", *names, *(f"flag_{flag}" for flag in FLAG_NAMES), ERROR_KEY)


def score_batch(solution_strs: Sequence, ground_truths: Sequence, extra_infos: Optional[Sequence] = None,
                **kwargs) -> List[Dict[str, float]]:
    """Score a batch; one dict per sample with the same keys (see the module docstring). Never raises."""
    try:
        n = len(solution_strs)
    except TypeError:
        _log_error("rlhf_ext verl reward: solution_strs must be a sequence of strings, got %s",
                   type(solution_strs).__name__)
        return []
    reward = None
    try:
        reward = get_weighted_reward(_config(kwargs))
        if not isinstance(ground_truths, (list, tuple)):
            ground_truths = list(ground_truths)
        if len(ground_truths) != n:
            raise ValueError(f"got {n} solution strings but {len(ground_truths)} ground truths")
        infos = list(extra_infos) if extra_infos is not None else [None] * n
        if len(infos) != n:
            raise ValueError(f"got {n} solution strings but {len(infos)} extra_info entries")
        texts = []
        for i, text in enumerate(solution_strs):
            if not isinstance(text, str):
                raise ValueError(f"solution_str[{i}] must be a string, got {type(text).__name__}")
            texts.append(text)
        # a choice/ranking gold may arrive as a mapping: its JSON text, which the grading reads back
        golds = [None if g is None else g if isinstance(g, str) else json.dumps(dict(g)) if isinstance(g, Mapping)
                 else str(g) for g in ground_truths]
        breakdown = reward(texts, golds, truncated=_truncated_flags(infos))
        correct = breakdown.correct if breakdown.correct is not None else [0.0] * n
        out = []
        for i in range(n):
            item = {"score": float(breakdown.rewards[i]), "acc": float(correct[i])}
            item.update({f"reward_{name}": float(v[i]) for name, v in breakdown.components.items()})
            item.update({f"flag_{flag}": float(v[i]) for flag, v in breakdown.flags.items()})
            item[ERROR_KEY] = 0.0
            out.append(item)
        return out
    except Exception as exc:  # inside a training job: score and report, never raise
        _log_error("rlhf_ext verl reward: scoring %d samples failed, scored 0: %s: %s", n, type(exc).__name__, exc)
        keys = _keys(reward)
        return [{**{k: 0.0 for k in keys}, ERROR_KEY: 1.0} for _ in range(n)]


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None, *,
                  data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **kwargs):
    """verl's ``compute_score``: one sample (``solution_str=...``) -> dict, or a batch
    (``solution_strs=...``, verl's batch reward manager) -> list of dicts. Never raises."""
    if solution_strs is not None:
        return score_batch(solution_strs, ground_truths if ground_truths is not None else [None] * len(solution_strs),
                           extra_infos, **kwargs)
    out = score_batch([solution_str], [ground_truth], [extra_info], **kwargs)
    return out[0]


def compute_score_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **kwargs):
    """The batched contract alone (``reward.custom_reward_function.name=compute_score_batch``)."""
    return compute_score(data_sources=data_sources, solution_strs=solution_strs if solution_strs is not None else [],
                         ground_truths=ground_truths, extra_infos=extra_infos, **kwargs)
