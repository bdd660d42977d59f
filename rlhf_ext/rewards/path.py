"""The documented path of the ``reward-file`` command: ``python -m rlhf_ext.rewards.path [--verl]``.

It prints the OpenRLHF reward file's absolute path, for
``--reward.remote_url "$(python -m rlhf_ext.rewards.path)"``; with ``--verl`` verl's, for
``reward.custom_reward_function.path=$(python -m rlhf_ext.rewards.path --verl)``
(``reward.custom_reward_function.name=compute_score``). The command and the names below live in
:mod:`rlhf_ext.rewards.reward_file` (``rlhf-ext reward-file``); this module re-exports them so that
the documented invocation and ``from rlhf_ext.rewards.path import reward_file_path`` keep working.
"""

from __future__ import annotations

from .reward_file import (DESCRIPTION, EPILOG, SHORT_FORM_PREFIX, add_arguments, is_short_form, main,
                          resolve_remote_url, reward_file_path, run, short_form_spec, verl_reward_file_path)

__all__ = ["DESCRIPTION", "EPILOG", "SHORT_FORM_PREFIX", "add_arguments", "is_short_form", "main",
           "resolve_remote_url", "reward_file_path", "run", "short_form_spec", "verl_reward_file_path"]

if __name__ == "__main__":
    main()
