"""The shipped suites: eight runs in the issue's order, and every training command passes OpenRLHF's
real parser and the plugin's validation (the GPU suite cannot train here; its flags are still checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf_ext.queue import load_suite, resolve_run

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["eight_algorithms.toml", "eight_algorithms_tiny.toml"]
ORDER = ["offpolicy_gspo", "grpo_constant", "dr_grpo", "rft", "maxrl", "offpolicy_naive", "offpolicy_noclip",
         "offpolicy_clip"]
# run -> (estimator, policy loss, aggregation mode, optimizer steps per rollout batch)
EXPECTED = {
    "offpolicy_gspo": ("grpo", "gspo", "seq-mean-token-mean", 4),
    "grpo_constant": ("grpo", "ppo", "seq-mean-token-sum-norm", 1),
    "dr_grpo": ("dr_grpo", "ppo", "seq-mean-token-sum-norm", 1),
    "rft": ("rft", "pg", "token-mean", 1),
    "maxrl": ("maxrl", "ppo", "token-mean", 1),
    "offpolicy_naive": ("grpo", "pg", "token-mean", 4),
    "offpolicy_noclip": ("grpo", "noclip", "token-mean", 4),
    "offpolicy_clip": ("grpo", "ppo", "token-mean", 4),
}


def resolved(name: str, tmp_path: Path):
    suite = load_suite(ROOT / "examples" / "suites" / name)
    inputs = {k: str(tmp_path / f"{k}.jsonl") for k in suite.inputs}
    return suite, [resolve_run(suite, r, {}, output=tmp_path / "q", snapshot=tmp_path / "q" / "snapshot",
                               inputs=inputs) for r in suite.runs]


@pytest.mark.parametrize("name", SUITES)
def test_suite_has_the_eight_variants_in_order_with_declared_outputs(name, tmp_path):
    suite, runs = resolved(name, tmp_path)
    assert [r.name for r in runs] == ORDER
    for run in runs:
        assert set(run.expect) == {"record", "evaluation", "checkpoint"}
        assert run.expect["record"] == [f"{run.run_dir}/ckpt/rlhf_ext_run/events.jsonl"]
        train, evaluate = run.commands
        assert train[1:5] == ["-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext"]
        if name == "eight_algorithms.toml":
            assert evaluate[1:4] == ["-m", "rlhf_ext.evalkit", "gsm8k"]
        else:  # the tiny task is evaluated under its own name
            assert evaluate[1:6] == ["-m", "rlhf_ext.evalkit", "run", "--name", "tiny_arith"]
        # the run record carries the suite's run name, so `rlhf-ext report` shows it
        assert train[train.index("--rlhf_ext.run_name") + 1] == run.name
        assert train[train.index("--ckpt.output_dir") + 1] == evaluate[evaluate.index("--model") + 1]
        assert train[train.index("--train.seed") + 1] == "0"
    # one base model, data, budget and group size for all eight
    shared = {"--actor.model_name_or_path", "--data.prompt_dataset", "--data.max_samples",
              "--rollout.n_samples_per_prompt", "--rollout.batch_size", "--actor.adam.lr"}
    for flag in shared:
        values = {r.commands[0][r.commands[0].index(flag) + 1] for r in runs}
        assert len(values) == 1, (flag, values)
    if name == "eight_algorithms.toml":
        t = runs[0].commands[0]
        assert t[t.index("--rollout.n_samples_per_prompt") + 1] == "8"
        assert "Qwen2.5-Math-1.5B" in t[t.index("--actor.model_name_or_path") + 1]
        template = t[t.index("--data.input_template") + 1]
        assert template.startswith("A conversation between User and Assistant.") and "User: {}" in template
        assert "--vllm.gpu_memory_utilization" in t
    else:  # the CPU recipe sizes vLLM's KV cache itself
        assert all("--vllm.gpu_memory_utilization" not in r.commands[0] for r in runs)


@pytest.mark.parametrize("name", SUITES)
def test_every_training_command_passes_openrlhf_and_plugin_validation(name, tmp_path, parse):  # noqa: F811
    suite, runs = resolved(name, tmp_path)
    for run in runs:
        argv = run.commands[0]
        args = parse(*argv[5:], full=True)
        estimator, loss, mode, steps = EXPECTED[run.name]
        assert (args.algo.advantage.estimator, args.actor.policy_loss_type, args.actor.loss_agg_mode) == \
               (estimator, loss, mode), run.name
        samples = args.rollout.batch_size * args.rollout.n_samples_per_prompt
        per_rollout = samples // args.train.batch_size
        # off-policy variants: 4 optimizer steps per rollout batch on GPU, 2 in the tiny suite
        assert per_rollout == (steps if name == "eight_algorithms.toml" else min(steps, 2)), run.name
