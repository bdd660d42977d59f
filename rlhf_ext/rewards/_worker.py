"""The grader worker's entry under its old name: a grader started before an upgrade in place spawns
workers with ``from rlhf_ext.rewards._worker import main; main()``. The worker lives in
:mod:`rlhf_ext.rewards.grading_worker`."""

from .grading_worker import main  # noqa: F401
