"""The ``reward-file`` command: where the reward files are, and what ``--reward.remote_url rlhf_ext:<spec>`` means.

``rlhf-ext reward-file``, or its documented spelling ``python -m rlhf_ext.rewards.path`` (that module
re-exports this one), prints the OpenRLHF reward file's absolute path, for
``--reward.remote_url "$(python -m rlhf_ext.rewards.path)"``; with ``--verl`` it prints verl's,
for ``reward.custom_reward_function.path=$(python -m rlhf_ext.rewards.path --verl)``
(``reward.custom_reward_function.name=compute_score``).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

SHORT_FORM_PREFIX = "rlhf_ext:"


def reward_file_path() -> str:
    """Absolute path of :mod:`rlhf_ext.rewards.openrlhf_reward` (the file OpenRLHF loads by path)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "openrlhf_reward.py")


def verl_reward_file_path() -> str:
    """Absolute path of :mod:`rlhf_ext.rewards.verl_reward` (verl's ``custom_reward_function.path``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "verl_reward.py")


def short_form_spec(text: Optional[str]) -> Optional[str]:
    """``"rlhf_ext:SPEC"`` -> ``"SPEC"`` (stripped); None for anything else, the bare ``"rlhf_ext"``
    included (what that means is the caller's: OpenRLHF's reward file takes it as the default).

    The one reader of the ``rlhf_ext:`` prefix, for every host that takes rewards by name
    (OpenRLHF's ``--reward.remote_url``, MindSpeed-RL's ``verifier_function`` entries).
    """
    if isinstance(text, str) and text.startswith(SHORT_FORM_PREFIX):
        return text[len(SHORT_FORM_PREFIX):].strip()
    return None


def is_short_form(url: Optional[str]) -> bool:
    """Whether ``url`` is the plugin's short form (``rlhf_ext`` or ``rlhf_ext:<spec>``), not a real URL or path."""
    return url == "rlhf_ext" or short_form_spec(url) is not None


def resolve_remote_url(url: str) -> Tuple[str, Dict[str, str]]:
    """Expand the plugin's short form of ``--reward.remote_url``.

    ``"rlhf_ext:math"`` or ``"rlhf_ext:accuracy:1.0,format:0.2"`` -> (the reward file's path,
    ``{"RLHF_EXT_REWARD": "<spec>"}``); ``"rlhf_ext"`` alone means the default (``math``). Any other
    URL is returned unchanged with no variables. A malformed spec raises ``ValueError``.
    """
    from .config import ENV_REWARD, RewardConfig

    if not isinstance(url, str):
        raise ValueError(f"remote_url must be a string, got {type(url).__name__}")
    if url == "rlhf_ext":
        return reward_file_path(), {}
    if not is_short_form(url):
        return url, {}
    spec = short_form_spec(url)
    if not spec:
        raise ValueError(f"{url!r}: name a reward after 'rlhf_ext:', e.g. 'rlhf_ext:math'")
    RewardConfig(reward=spec).validate()
    return reward_file_path(), {ENV_REWARD: spec}


DESCRIPTION = "Print the absolute path of rlhf_ext's reward file for a training framework."
EPILOG = ('examples:\n'
          '  --reward.remote_url "$(python -m rlhf_ext.rewards.path)"                  # OpenRLHF\n'
          '  reward.custom_reward_function.path=$(python -m rlhf_ext.rewards.path --verl) \\\n'
          '      reward.custom_reward_function.name=compute_score                     # verl\n'
          '(rlhf-ext reward-file is the same command)')


def add_arguments(parser) -> None:
    """The flags of ``python -m rlhf_ext.rewards.path`` and of ``rlhf-ext reward-file``."""
    parser.add_argument("--verl", action="store_true",
                        help="the verl reward file (its function is compute_score) instead of OpenRLHF's")


def run(args) -> int:
    print(verl_reward_file_path() if args.verl else reward_file_path())
    return 0


def main(argv: Optional[list] = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlhf_ext.rewards.path", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
