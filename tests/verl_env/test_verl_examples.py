"""examples/verl/: every script's overrides compose with verl 0.9.1's real Hydra config, name
registered estimators with valid options, and reach rlhf_ext's reward through verl's own loader;
the GSM8K converter writes rows verl's reward path can grade (.venv-verl). Training itself needs
GPUs/NPUs and is not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.reward import get_custom_reward_fn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "verl")
SCRIPTS = ["grpo.sh", "dr_grpo.sh", "passk.sh", "maxrl.sh", "dr_grpo_npu.sh"]


def overrides(script: str):
    env = {**os.environ, "RLHF_EXT_PRINT_ARGS": "1", "PYTHON": sys.executable}
    env.pop("REWARD", None)
    out = subprocess.run(["bash", os.path.join(EXAMPLES, script)], capture_output=True, text=True, env=env,
                         check=True, timeout=120).stdout
    return [line for line in out.splitlines() if line]


def compose(args):
    from hydra import compose as hydra_compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose("ppo_trainer", overrides=args)


@pytest.fixture(scope="module")
def configs():
    return {script: compose(overrides(script)) for script in SCRIPTS}


def test_each_script_is_one_switch_from_the_grpo_baseline():
    def switches(script):  # everything but the run's name
        return {a for a in overrides(script) if not a.startswith("trainer.experiment_name=")}

    base = switches("grpo.sh")
    diff = {s: sorted(switches(s) - base) for s in SCRIPTS[1:]}
    assert diff["passk.sh"] == ["+algorithm.rlhf_ext.k=4", "+reward.custom_reward_function.reward_kwargs.reward=accuracy",
                                "algorithm.adv_estimator=rlhf_ext_passk"]
    assert diff["maxrl.sh"] == ["+reward.custom_reward_function.reward_kwargs.reward=accuracy",
                                "algorithm.adv_estimator=rlhf_ext_maxrl"]
    assert "algorithm.adv_estimator=rlhf_ext_dr_grpo" in diff["dr_grpo.sh"]
    assert "trainer.device=npu" in diff["dr_grpo_npu.sh"]


def test_scripts_compose_with_verls_config_and_name_working_estimators(configs):
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": torch.tensor([[0.0, 1.0]] * 4 + [[0.0, 0.0]] * 4),
                 "response_mask": torch.ones(8, 2)},
        non_tensors={"uid": np.array(["p"] * 8, dtype=object)})
    for script, cfg in configs.items():
        name = cfg.algorithm.adv_estimator
        assert name == "grpo" or name in core_algos.ADV_ESTIMATOR_REGISTRY, (script, name)
        out = compute_advantage(batch, adv_estimator=name, config=cfg.algorithm)
        assert torch.isfinite(out.batch["advantages"]).all(), script
        assert cfg.actor_rollout_ref.rollout.n == 8
    assert configs["dr_grpo.sh"].actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert configs["dr_grpo.sh"].actor_rollout_ref.actor.loss_scale_factor == 1024
    assert configs["dr_grpo_npu.sh"].trainer.device == "npu"
    assert configs["grpo.sh"].trainer.device == "cuda"


def test_scripts_reach_rlhf_ext_rewards_through_verls_loader(configs):
    for script, cfg in configs.items():
        fn = get_custom_reward_fn(cfg)
        out = fn(data_source="openai/gsm8k", solution_str="so \\boxed{72}", ground_truth="72", extra_info={})
        expected = 1.0 if cfg.reward.custom_reward_function.reward_kwargs.reward == "accuracy" else 1.2
        assert out["score"] == pytest.approx(expected), script


def test_gsm8k_converter_writes_verl_rows(tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "What is 1,000 + 200?", "answer": "#### 1,200"}]) + "\n")
    subprocess.run([sys.executable, os.path.join(EXAMPLES, "prepare_gsm8k.py"), "--input", str(src), "--out",
                    str(tmp_path / "out")], check=True, capture_output=True, timeout=120)
    rows = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert list(rows["data_source"]) == ["openai/gsm8k"] * 2
    assert [r["ground_truth"] for r in rows["reward_model"]] == ["7", "1200"]
    assert rows["prompt"][0][0]["role"] == "user" and "\\boxed{}" in rows["prompt"][0][0]["content"]
    fn = get_custom_reward_fn(compose(overrides("grpo.sh")))
    assert fn(data_source="openai/gsm8k", solution_str="\\boxed{1200}",
              ground_truth=rows["reward_model"][1]["ground_truth"], extra_info={})["acc"] == 1.0
