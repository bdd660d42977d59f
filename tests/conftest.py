"""Shared fixtures: the slow end-to-end runs happen once per test session, and OpenRLHF's real CLI
stopped right after parsing (``parse``) for the tests of the plugin's flags."""

from __future__ import annotations

import os
import runpy
import socket
import sys

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def free_port():
    """A function that returns a TCP port on 127.0.0.1 that was free when it was called."""
    return _free_port


@pytest.fixture(scope="session")
def e2e_task(tmp_path_factory):
    """The tiny task (``workdir/task``) of the end-to-end runs; returns ``workdir``."""
    from rlhf_ext.tours.tiny_task import build_tiny_task

    work = tmp_path_factory.mktemp("e2e_cpu")
    # the default warm-up (~25% sampled accuracy): groups of 4 then have differing rewards at nearly every
    # step. At 60 steps (9%) a float32 run (AVX2-only CPUs) drew steps of uniform groups: nothing to learn.
    build_tiny_task(work / "task", verbose=False)
    return work


@pytest.fixture(scope="session")
def e2e_grpo_run(e2e_task):
    """A real 2-step GRPO run of ``train_ppo_ray --plugin rlhf_ext`` on CPU (the tiny task); returns
    ``(workdir, exit code, console text)``. The checkpoint is ``workdir/trained``, the run record
    ``workdir/trained_ds/rlhf_ext_run``; the tiny task is ``workdir/task``."""
    from rlhf_ext.patches.retarget.cpu_processes import ENV_VLLM_MULTIPROCESSING
    from rlhf_ext.tours.smoke import run_training, train_command

    work = e2e_task
    out = work / "trained"
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl", output=out,
                        estimator="grpo", steps=E2E_STEPS, prompts_per_step=4, n_samples=4, lr=5e-4)  # fmt: skip
    # vLLM's CPU process layout kept here (engine core + a worker process, as with TP > 1 on a GPU), so the
    # plugin is seen activating in both; the CPU target's default runs the model runner in the engine core
    rc = run_training(cmd, work / "train.log", timeout=900, echo=False, env={ENV_VLLM_MULTIPROCESSING: "1"})
    text = (work / "train.log").read_text()
    return work, rc, text


E2E_STEPS = 2
# the corrected run: rlhf_ext's rollout correction on, and from rollout batch 2 a known mismatch injected
E2E_CORRECTION_FLAGS = ("--rlhf_ext.rollout_is", "token", "--rlhf_ext.rollout_is_threshold", "2.0",
                        "--rlhf_ext.rollout_rs", "token_k1", "--rlhf_ext.rollout_rs_threshold", "0.5_2.0")
E2E_INJECTED_NOISE = "1.0@2"
# the hybrid-engine recipe modes the corrected run also proves (issue 38's mode matrix): sleep is turned off on
# the CPU target with one line, vLLM samples from the merged LoRA policy, packed and dynamic micro-batches
E2E_HYBRID_FLAGS = ("--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep",
                    "--ds.lora.rank", "4", "--ds.lora.alpha", "8", "--ds.packing_samples",
                    "--train.dynamic_batch_enable", "--actor.policy_loss_type", "sapo")


@pytest.fixture(scope="session")
def e2e_corrected_run(e2e_task):
    """A second 2-step GRPO run on the tiny task with ``--rlhf_ext.rollout_is token`` and token_k1 rejection,
    vLLM's log-probs lowered by |N(0, 1)| from step 2 (``RLHF_EXT_TEST_ROLLOUT_LOGPROB_NOISE``), in the
    hybrid recipe shape of the mode matrix (``E2E_HYBRID_FLAGS``: colocate-all with sleep, LoRA, packing,
    dynamic batches, an rlhf_ext loss; tests/test_e2e_modes.py); returns ``(workdir, exit code, console
    text)``, the adapter is saved in ``workdir/corrected``."""
    from rlhf_ext.patches.openrlhf.rollout_correction import TEST_NOISE_ENV
    from rlhf_ext.tours.smoke import run_training, train_command

    work = e2e_task
    out = work / "corrected"
    cmd = train_command(model=work / "task" / "model", prompts=work / "task" / "train.jsonl", output=out,
                        estimator="grpo", steps=E2E_STEPS, prompts_per_step=4, n_samples=4, lr=5e-4)  # fmt: skip
    rc = run_training(cmd + list(E2E_CORRECTION_FLAGS) + list(E2E_HYBRID_FLAGS), work / "corrected.log",
                      timeout=900, echo=False, env={TEST_NOISE_ENV: E2E_INJECTED_NOISE})
    return work, rc, (work / "corrected.log").read_text()


class _Parsed(Exception):
    def __init__(self, args):
        self.args_ns = args


@pytest.fixture(scope="module")
def plugin_driver():
    """The ``rlhf_ext`` plugin active in this process as a driver, with its argparse hook (per module)."""
    from rlhf_ext.patches import activate, deactivate
    from rlhf_ext.patches.openrlhf.cli import install_argparse_hook

    activate(["rlhf_ext"], role="test")
    install_argparse_hook()
    import openrlhf.trainer.ray.ppo_actor  # noqa: F401  (the CLI's heavy imports, done once)

    yield
    deactivate()


@pytest.fixture()
def parse(plugin_driver, monkeypatch):
    """Run OpenRLHF's CLI module body (``openrlhf.cli.train_ppo_ray``, runpy) on ``argv``; return its ``args``.

    Stops right after parsing (a spy on ``openrlhf.utils.config.hierarchize``), or with
    ``full=True`` after all of OpenRLHF's own post-parse validation, where ``train()`` first
    touches Ray. The environment the CLI changes is restored afterwards.
    """
    import openrlhf.utils.config as config
    import ray

    real = config.hierarchize
    saved_env = dict(os.environ)
    state = {}

    def spy(args):
        state["args"] = real(args)
        if not state["full"]:
            raise _Parsed(state["args"])
        return state["args"]

    def stop(*a, **k):
        raise _Parsed(state["args"])

    monkeypatch.setattr(config, "hierarchize", spy)
    monkeypatch.setattr(ray, "is_initialized", stop)

    def run(*argv, full=False):
        state["full"] = full
        monkeypatch.setattr(sys, "argv", ["train_ppo_ray.py", *argv])
        try:
            runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
        except _Parsed as parsed:
            return parsed.args_ns
        raise AssertionError("the CLI did not reach argument parsing")

    yield run
    os.environ.clear()
    os.environ.update(saved_env)
