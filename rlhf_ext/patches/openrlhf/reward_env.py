"""Map the plugin's reward flags to rlhf_ext's OpenRLHF reward file and its environment variables.

rlhf_ext ships an OpenRLHF reward file (``rlhf_ext/rewards/openrlhf_reward.py``, path from
:func:`rlhf_ext.rewards.reward_file.reward_file_path`) that OpenRLHF loads in each rollout actor through
``--reward.remote_url PATH``. It is configured only by environment variables
(:mod:`rlhf_ext.rewards.config`), which the driver exports before Ray starts (and
:mod:`rlhf_ext.patches.activation.ray_env` forwards to an existing cluster):

=====================================  ===============================  ===========================
flag                                   variable                         meaning
=====================================  ===============================  ===========================
``--reward.remote_url rlhf_ext:SPEC``  ``RLHF_EXT_REWARD=SPEC``         use the file with SPEC
``--reward.remote_url rlhf_ext``       (unchanged)                      the file, default ``math``
``--reward.functions SPEC``            ``RLHF_EXT_REWARD=SPEC``         same; implies the file
``--reward.grader_timeout S``          ``RLHF_EXT_REWARD_TIMEOUT=S``    seconds per sample
``--reward.grader_workers N``          ``RLHF_EXT_REWARD_WORKERS=N``    grader processes per actor
=====================================  ===============================  ===========================

SPEC is a preset (``math``, ``open_r1``) or weighted terms (``accuracy:1.0,format:0.2,truncation:-0.5``).
Everything after ``rlhf_ext:`` is the spec, commas included, so it must be the only URL. The
resulting configuration is validated at start-up with the reward package's own checks.
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Tuple

def _rewards():
    try:
        from rlhf_ext.rewards import config, path
    except ImportError as exc:
        raise ValueError(f"rlhf_ext's OpenRLHF reward file is not available in this installation ({exc})") from None
    return config, path


def is_plugin_url(remote_url: Optional[str]) -> bool:
    """``rlhf_ext`` or ``rlhf_ext:SPEC`` (:func:`rlhf_ext.rewards.reward_file.is_short_form`, the one rule)."""
    return remote_url is not None and _rewards()[1].is_short_form(remote_url)


def resolve_reward_flags(
    remote_url: Optional[str],
    functions: Optional[str] = None,
    grader_timeout: Optional[float] = None,
    grader_workers: Optional[int] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Tuple[Optional[str], Dict[str, str]]:
    """Return ``(remote_url for OpenRLHF, environment variables to export)``; ``ValueError`` on bad input."""
    environ = os.environ if environ is None else environ
    env: Dict[str, str] = {}
    uses_file = False
    wanted = is_plugin_url(remote_url) or any(v is not None for v in (functions, grader_timeout, grader_workers))
    config, path = _rewards() if wanted else (None, None)
    spec = None
    if is_plugin_url(remote_url):
        remote_url, env = path.resolve_remote_url(remote_url)
        spec = env.get(config.ENV_REWARD)
        uses_file = True
    if functions is not None:
        functions = functions.strip()
        if not functions:
            raise ValueError("--reward.functions needs a reward spec, e.g. math or accuracy:1.0,format:0.2")
        if spec is not None and spec != functions:
            raise ValueError(
                f"--reward.remote_url rlhf_ext:{spec} and --reward.functions {functions} disagree; give one of them"
            )
        if remote_url is None:
            remote_url = path.reward_file_path()
        elif not _same_file(remote_url, path.reward_file_path()):
            raise ValueError(
                f"--reward.functions configures rlhf_ext's reward file, but --reward.remote_url is {remote_url!r}; "
                "drop --reward.remote_url or use --reward.remote_url rlhf_ext:SPEC"
            )
        env[config.ENV_REWARD] = functions
        uses_file = True
    if not uses_file and remote_url is not None and config is not None:
        uses_file = _same_file(remote_url, path.reward_file_path())  # the file given by its path
    if grader_timeout is not None:
        if not grader_timeout > 0:
            raise ValueError(f"--reward.grader_timeout must be > 0 seconds, got {grader_timeout!r}")
        env[config.ENV_TIMEOUT] = repr(float(grader_timeout))
    if grader_workers is not None:
        if grader_workers < 1:
            raise ValueError(f"--reward.grader_workers must be >= 1, got {grader_workers!r}")
        env[config.ENV_WORKERS] = str(int(grader_workers))
    if (grader_timeout is not None or grader_workers is not None) and not uses_file:
        raise ValueError(
            "--reward.grader_timeout / --reward.grader_workers configure rlhf_ext's reward file; select it with "
            "--reward.remote_url rlhf_ext:SPEC or --reward.functions SPEC"
        )
    if uses_file:
        current = {k: v for k, v in environ.items() if k in config.ENV_VARS}
        try:
            config.reward_config_from_env({**current, **env})
        except ValueError as exc:
            raise ValueError(f"rlhf_ext reward: {exc}") from None
    return remote_url, env


def _same_file(remote_url: str, reward_file: str) -> bool:
    return remote_url.endswith(".py") and os.path.realpath(remote_url) == os.path.realpath(reward_file)
