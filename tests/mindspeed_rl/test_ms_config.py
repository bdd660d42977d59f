"""rl_config keys, validation in RLConfig, the driver's exit code 2, --plugin stripping, the examples."""

import os
import pickle
import subprocess
import sys

import pytest
from conftest import REPO, STANDIN, mindspeed_src

from rlhf_ext.patches.mindspeed_rl import ConfigError, ConfiguredName

EXAMPLES = os.path.join(REPO, "examples", "mindspeed_rl")


def rl_config(**values):
    from mindspeed_rl.config_cls.rl_config import RLConfig

    return RLConfig(values)


def test_new_keys_travel_with_the_names_mindspeed_rl_passes_on():
    cfg = rl_config(adv_estimator="passk", adv_estimator_options={"k": 4}, loss_agg_mode="seq-mean-token-sum-norm",
                    loss_agg_max_len=2048, kl_penalty="k3", kl_clip=[-5, 5], policy_loss_type="gspo")
    assert cfg.adv_estimator == "passk" and isinstance(cfg.adv_estimator, ConfiguredName)
    settings = {"adv_estimator_options": {"k": 4}, "policy_loss_type": "gspo", "loss_agg_mode": "seq-mean-token-sum-norm",
                "loss_agg_max_len": 2048, "kl_clip": [-5.0, 5.0]}
    assert cfg.adv_estimator.settings == settings and cfg.kl_penalty.settings == settings
    assert cfg.loss_agg_mode == "seq-mean-token-sum-norm"
    assert pickle.loads(pickle.dumps(cfg)).kl_penalty.settings == settings  # Ray pickles rl_config


def test_without_new_keys_everything_is_mindspeed_rl_s_own():
    cfg = rl_config(adv_estimator="group_norm", kl_penalty="low_var_kl")
    assert type(cfg.adv_estimator) is str and type(cfg.kl_penalty) is str
    assert all(getattr(cfg, k) is None for k in ("adv_estimator_options", "loss_agg_mode", "kl_clip"))
    assert type(rl_config(adv_estimator="rloo").adv_estimator) is str


@pytest.mark.parametrize("values, message", [
    ({"adv_estimator": "bogus"}, r"adv_estimator='bogus' is not a known advantage estimator; valid: group_norm, gae, "
                                 r"dr_grpo, .*grpo, maxrl, .*passk"),
    ({"adv_estimator": "passk"}, "needs rl_config.adv_estimator_options.k"),
    ({"adv_estimator": "rloo", "adv_estimator_options": {"k": 2}}, "'rloo' has no option 'k'"),
    ({"adv_estimator": "group_norm", "adv_estimator_options": {"k": 2}}, "takes no options"),
    ({"loss_agg_mode": "seq-mean"}, "loss_agg_mode='seq-mean' is not known; valid: token-mean, seq-mean-token-mean"),
    ({"loss_agg_max_len": 100}, "only used by loss_agg_mode=seq-mean-token-sum-norm"),
    ({"policy_loss_type": "grpo"}, "policy_loss_type='grpo' is not known; valid: ppo, gspo"),
    ({"kl_penalty": "k4"}, "kl_penalty='k4' is not a known KL estimator; valid: kl, abs, mse, low_var_kl, k1, k2, k3"),
    ({"kl_clip": [1, 0]}, "kl_clip needs lo < hi"),
    ({"verifier_function": ["acc", "rlhf_ext:acuracy"], "verifier_weight": [1, 1]}, "unknown reward 'acuracy'"),
])
def test_invalid_values_name_the_key_and_the_valid_ones(values, message):
    with pytest.raises(ConfigError, match=message):
        rl_config(**values)


def _cli(args, tmp_path, script="train_grpo.py"):
    env = dict(os.environ)
    env.pop("RLHF_EXT_PLUGINS", None)  # activation comes from --plugin on the command line
    # REPO first: this checkout's rlhf_ext, not the editable install's (which may be another worktree).
    env["PYTHONPATH"] = os.pathsep.join([REPO, STANDIN, mindspeed_src()])
    cmd = [sys.executable, os.path.join(mindspeed_src(), "cli", script), *args,
           f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null"]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_driver_exits_2_before_ray_starts(tmp_path):
    """One CLI run per kind of mistake, all started at once (each imports the whole of MindSpeed-RL)."""
    cases = {
        "estimator": (["--config-name", "grpo_qwen25_7b_A3", "rl_config.adv_estimator=rlooo", "--plugin", "rlhf_ext"],
                      "rl_config.adv_estimator='rlooo' is not a known advantage estimator; valid: group_norm, gae,"),
        "loss mode": (["--config-name", "dapo_qwen25_32b_A3", "+rl_config.loss_agg_mode=sum", "--plugin=rlhf_ext"],
                      "rl_config.loss_agg_mode='sum' is not known; valid: token-mean,"),
        "reward": (["--config-name", "grpo_qwen25_7b_A3", "rl_config.verifier_function=[acc_typo]", "--plugin", "rlhf_ext"],
                   "rl_config.verifier_function entry 'acc_typo' is not a known reward; MindSpeed-RL's: acc,"),
        "kl": (["--config-name", "ppo_qwen25_32b_A3", "rl_config.kl_penalty=k5", "--plugin", "rlhf_ext"],
               "rl_config.kl_penalty='k5' is not a known KL estimator; valid:"),
        "correction": (["--config-name", "grpo_qwen25_7b_A3", "+rl_config.rollout_is=tokens", "--plugin", "rlhf_ext"],
                       "rl_config.rollout_is='tokens' is not known; valid: token, sequence, geometric"),
    }
    scripts = {"loss mode": "train_dapo.py", "kl": "train_ppo.py"}
    procs = {}
    for name, (args, _) in cases.items():
        (tmp_path / name.replace(" ", "_")).mkdir()
        procs[name] = _cli(args, tmp_path / name.replace(" ", "_"), scripts.get(name, "train_grpo.py"))
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{out[-3000:]}"
        assert f"rlhf_ext: error: {cases[name][1]}" in out, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert "ray init with runtime_env" not in out  # MindSpeed-RL logs this right before ray.init
        assert out.count("rlhf_ext: activated plugin(s) rlhf_ext") == 1 and "role=driver" in out


def test_plugin_flag_is_stripped(tmp_path):
    """``--cfg job`` makes Hydra print the composed config and exit; Hydra itself would reject ``--plugin``."""
    proc = _cli(["--config-dir", EXAMPLES, "--config-name", "drgrpo_qwen25_7b_A3", "--plugin", "rlhf_ext",
                 "--cfg", "job"], tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "adv_estimator: dr_grpo" in out and "loss_agg_mode: seq-mean-token-sum-norm" in out


@pytest.mark.parametrize("name", sorted(f[:-5] for f in os.listdir(EXAMPLES) if f.endswith(".yaml")))
def test_examples_compose_with_mindspeed_rl_s_recipe_and_pass_validation(name):
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mindspeed_rl.config_cls.rl_config import RLConfig

    with initialize_config_dir(config_dir=EXAMPLES, version_base=None):
        cfg = compose(config_name=name, overrides=[f"hydra.searchpath=[file://{mindspeed_src()}/configs]"])
    config = OmegaConf.to_container(cfg, resolve=True)
    with open(os.path.join(EXAMPLES, name + ".yaml"), encoding="utf-8") as f:
        ours = yaml.safe_load(f)["rl_config"]
    assert ours, name
    for key, value in ours.items():
        assert config["rl_config"][key] == value, (name, key)
    assert config["rl_config"]["n_samples_per_prompt"] == 8  # the rest is MindSpeed-RL's grpo_qwen25_7b_A3
    rl = RLConfig(cfg.get("rl_config"))  # what the driver builds before ray.init, DictConfig included
    assert rl.adv_estimator == config["rl_config"]["adv_estimator"]


def test_policy_loss_options_are_validated_and_travel():
    cfg = rl_config(policy_loss_type="sapo", policy_loss_options={"tau_pos": 1.2, "tau_neg": 2.0})
    assert cfg.kl_penalty.settings["policy_loss_options"] == {"tau_pos": 1.2, "tau_neg": 2.0}
    assert rl_config(policy_loss_type="clip_cov").kl_penalty.settings == {"policy_loss_type": "clip_cov"}
    with pytest.raises(ConfigError, match="'sapo' has no option 'tau'; it takes: tau_pos, tau_neg, log_ratio_clip"):
        rl_config(policy_loss_type="sapo", policy_loss_options={"tau": 1.0})
    with pytest.raises(ConfigError, match="policy_loss_options.clip_ratio_low: the clip range comes from"):
        rl_config(policy_loss_type="cispo", policy_loss_options={"clip_ratio_low": 0.1})
    with pytest.raises(ConfigError, match="needs rl_config.policy_loss_type"):
        rl_config(policy_loss_options={"tau_pos": 1.0})
    with pytest.raises(ConfigError, match="valid: ppo, gspo, cispo, clip_cov"):
        rl_config(policy_loss_type="sapo2")
    with pytest.raises(ConfigError, match="bypass_mode needs the vLLM rollout log-probs .* rl_config.rollout_correction_bypass"):
        rl_config(policy_loss_type="bypass_mode")  # issue 42: MindSpeed-RL's loss gets the recomputed old_log_prob
    assert rl_config(policy_loss_type="dro", policy_loss_options={"dro_beta": 0.2}).kl_penalty.settings == {
        "policy_loss_type": "dro", "policy_loss_options": {"dro_beta": 0.2}}
