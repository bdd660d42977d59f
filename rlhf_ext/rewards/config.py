"""Reward configuration for training jobs, read from environment variables.

The OpenRLHF reward file and the reward server run in processes the user does not start directly
(Ray rollout actors, another node), so their configuration travels in the environment. The
``rlhf_ext`` OpenRLHF plugin maps its flags onto these variables before Ray starts; without the
plugin, export them yourself.

==============================  ==========================================================  =========
variable                        meaning                                                     default
==============================  ==========================================================  =========
``RLHF_EXT_REWARD``             weighted spec ``accuracy:1.0,format:0.2,truncation:-0.5``   ``math``
                                or a preset (``math``, ``open_r1``)
``RLHF_EXT_REWARD_TIMEOUT``     hard time limit per sample, seconds                         ``5``
``RLHF_EXT_REWARD_WORKERS``     grader worker processes per rollout process                 min(CPUs, 8)
``RLHF_EXT_REWARD_OPTIONS``     JSON options per reward, ``{"cosine": {"max_len": 2000}}``  none
``RLHF_EXT_REWARD_EOS``         JSON list (or comma list) of end-of-sequence strings         common ones
``RLHF_EXT_REWARD_TOKENIZER``   local tokenizer path: its EOS/special tokens, token lengths  none
``RLHF_EXT_REWARD_VERIFIER``    JSON ``{"url": ..., "model": ...}``: the verifier cascade   off
                                (opt-in; :mod:`.verifier_cascade`)
==============================  ==========================================================  =========
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

ENV_REWARD = "RLHF_EXT_REWARD"
ENV_TIMEOUT = "RLHF_EXT_REWARD_TIMEOUT"
ENV_WORKERS = "RLHF_EXT_REWARD_WORKERS"
ENV_OPTIONS = "RLHF_EXT_REWARD_OPTIONS"
ENV_EOS = "RLHF_EXT_REWARD_EOS"
ENV_TOKENIZER = "RLHF_EXT_REWARD_TOKENIZER"
ENV_VERIFIER = "RLHF_EXT_REWARD_VERIFIER"
ENV_VARS = (ENV_REWARD, ENV_TIMEOUT, ENV_WORKERS, ENV_OPTIONS, ENV_EOS, ENV_TOKENIZER, ENV_VERIFIER)


@dataclass(frozen=True)
class RewardConfig:
    """What to reward and how to grade: see the module docstring for each field's variable."""

    reward: str = "math"
    timeout: float = 5.0
    workers: Optional[int] = None
    options: Mapping[str, Mapping] = field(default_factory=dict)
    eos_tokens: Optional[Tuple[str, ...]] = None
    tokenizer: Optional[str] = None
    # the verifier cascade's settings (url, model, timeout, concurrency, max_tokens...); None: rules only
    verifier: Optional[Mapping] = None

    def validate(self) -> "RewardConfig":
        """Raise ``ValueError`` naming the problem (unknown reward, bad weight, bad option...); start nothing."""
        from .composite import WeightedReward

        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or \
                not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ValueError(f"reward timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ValueError(f"reward workers must be a positive integer, got {self.workers!r}")
        if self.eos_tokens is not None and (not all(isinstance(t, str) and t for t in self.eos_tokens)):
            raise ValueError(f"eos_tokens must be non-empty strings, got {self.eos_tokens!r}")
        WeightedReward(self.reward, options=self.options, timeout=self.timeout, workers=self.workers)
        if self.verifier is not None:
            from .verifier_cascade import VerifierSettings

            VerifierSettings.from_mapping(dict(self.verifier))
        return self

    def to_env(self) -> Dict[str, str]:
        """The environment variables that reproduce this configuration (for ``os.environ.update``)."""
        env = {ENV_REWARD: self.reward, ENV_TIMEOUT: repr(float(self.timeout))}
        if self.workers is not None:
            env[ENV_WORKERS] = str(self.workers)
        if self.options:
            env[ENV_OPTIONS] = json.dumps({k: dict(v) for k, v in self.options.items()})
        if self.eos_tokens is not None:
            env[ENV_EOS] = json.dumps(list(self.eos_tokens))
        if self.tokenizer:
            env[ENV_TOKENIZER] = self.tokenizer
        if self.verifier is not None:
            env[ENV_VERIFIER] = json.dumps(dict(self.verifier))
        return env


def _parse_eos(text: str) -> Tuple[str, ...]:
    text = text.strip()
    if text.startswith("["):
        try:
            tokens = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_EOS} is not a valid JSON list: {exc}") from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) and t for t in tokens):
            raise ValueError(f"{ENV_EOS} must be a JSON list of non-empty strings, got {text!r}")
        return tuple(tokens)
    tokens = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tokens:
        raise ValueError(f"{ENV_EOS} is set but names no token: {text!r}")
    return tokens


def reward_config_from_env(environ: Optional[Mapping[str, str]] = None) -> RewardConfig:
    """Read and validate a :class:`RewardConfig` from ``environ`` (default ``os.environ``).

    Unset or blank variables take their defaults; a malformed value raises ``ValueError`` that names
    the variable.
    """
    env = os.environ if environ is None else environ

    def get(name: str) -> Optional[str]:
        value = env.get(name)
        return value.strip() if value is not None and value.strip() else None

    kwargs = {}
    if get(ENV_REWARD):
        kwargs["reward"] = get(ENV_REWARD)
    if get(ENV_TIMEOUT):
        try:
            kwargs["timeout"] = float(get(ENV_TIMEOUT))
        except ValueError:
            raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds, got {env[ENV_TIMEOUT]!r}") from None
    if get(ENV_WORKERS):
        try:
            kwargs["workers"] = int(get(ENV_WORKERS))
        except ValueError:
            raise ValueError(f"{ENV_WORKERS} must be an integer, got {env[ENV_WORKERS]!r}") from None
    if get(ENV_OPTIONS):
        try:
            options = json.loads(get(ENV_OPTIONS))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_OPTIONS} is not valid JSON: {exc}") from None
        if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
            raise ValueError(f"{ENV_OPTIONS} must be a JSON object of objects like "
                             f'{{"cosine": {{"max_len": 2000}}}}, got {env[ENV_OPTIONS]!r}')
        kwargs["options"] = options
    if get(ENV_EOS):
        kwargs["eos_tokens"] = _parse_eos(get(ENV_EOS))
    if get(ENV_TOKENIZER):
        kwargs["tokenizer"] = get(ENV_TOKENIZER)
    if get(ENV_VERIFIER):
        try:
            kwargs["verifier"] = json.loads(get(ENV_VERIFIER))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_VERIFIER} is not valid JSON: {exc}") from None
    config = RewardConfig(**kwargs)
    try:
        return config.validate()
    except ValueError as exc:
        raise ValueError(f"invalid reward configuration from the environment ({', '.join(ENV_VARS[:3])}...): "
                         f"{exc}") from None
