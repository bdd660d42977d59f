"""Shared session fixtures: the slow end-to-end runs happen once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def e2e_task(tmp_path_factory):
    """The tiny task (``workdir/task``) of the end-to-end runs; returns ``workdir``."""
    from rlhf_ext.tours.tiny_task import build_tiny_task

    work = tmp_path_factory.mktemp("e2e_cpu")
    # a shorter warm-up than the default: the run only has to produce rewards that differ within a group
    build_tiny_task(work / "task", sft_steps=60, verbose=False)
    return work


@pytest.fixture(scope="session")
def e2e_grpo_run(e2e_task):
    """A real 2-step GRPO run of ``train_ppo_ray --plugin rlhf_ext`` on CPU (the tiny task); returns
    ``(workdir, exit code, console text)``. The checkpoint is ``workdir/trained``, the run record
    ``workdir/trained_ds/rlhf_ext_run``; the tiny task is ``workdir/task``."""
    from rlhf_ext.tours.smoke import run_training, train_command

    work = e2e_task
    out = work / "trained"
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl", output=out,
                        estimator="grpo", steps=E2E_STEPS, prompts_per_step=4, n_samples=4, lr=5e-4)  # fmt: skip
    rc = run_training(cmd, work / "train.log", timeout=900, echo=False)
    text = (work / "train.log").read_text()
    return work, rc, text


E2E_STEPS = 2
