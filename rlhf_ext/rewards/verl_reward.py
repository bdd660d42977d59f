"""verl reward file: ``reward.custom_reward_function.path=$(python -m rlhf_ext.rewards.path --verl)``
with ``reward.custom_reward_function.name=compute_score`` (or ``compute_score_batch``).

verl loads this file by path, as a module of its own; the functions live in
:mod:`rlhf_ext.rewards.verl_protocol`, so every loaded copy shares one grader pool per process.
Contract, configuration and return values: see that module and docs/verl.md.
"""

from rlhf_ext.rewards.verl_protocol import compute_score, compute_score_batch

__all__ = ["compute_score", "compute_score_batch"]
