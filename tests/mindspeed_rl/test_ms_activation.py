"""Activation and the seam checks of rlhf_ext.patches.mindspeed_rl."""

import types

import pytest

from rlhf_ext.patches.mindspeed_rl import PATCHES, MindSpeedRLCompatibilityError, applied, compat, mindspeed_rl_version


def test_every_seam_is_patched_after_import():
    import mindspeed_rl.trainer.dapo_trainer_hybrid  # noqa: F401
    import mindspeed_rl.trainer.ppo_trainer_hybrid  # noqa: F401

    assert mindspeed_rl_version() == "2.1.0"
    done = applied()
    for patch in PATCHES:
        assert patch.name in done.get(patch.module, []), patch


def test_a_changed_signature_names_the_seam_and_changes_nothing(monkeypatch):
    def __init__(self, config_dict, extra):  # what a future MindSpeed-RL might have
        pass

    fake = types.ModuleType("mindspeed_rl.config_cls.rl_config")
    fake.RLConfig = type("RLConfig", (), {"__init__": __init__, "update": lambda self, d: None})
    monkeypatch.delitem(compat._applied_modules, fake.__name__)  # as in a process that has not patched it yet
    with pytest.raises(MindSpeedRLCompatibilityError) as err:
        compat.apply_module(fake)
    message = str(err.value)
    assert "patch 'rl_config keys and validation'" in message
    assert "RLConfig.__init__ has parameters (self, config_dict, extra), expected (self, config_dict)" in message
    assert fake.RLConfig.__init__ is __init__


def test_missing_builtin_reward_function_is_reported():
    fake = types.ModuleType("mindspeed_rl.models.rule_verifier")
    fake.verifier = lambda responses, data, config, **kwargs: None
    problems = compat.check_module(fake)
    assert any("rule_verifier.accuracy_reward does not exist" in p for p in problems)


def test_unsupported_release_is_refused(monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    with pytest.raises(MindSpeedRLCompatibilityError, match="supports MindSpeed-RL 2.1.x"):
        compat.check_version("2.2.0")
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    assert compat.check_version("2.2.0") == "2.2.0"


def test_ray_init_carries_the_plugin_into_mindspeed_rl_s_runtime_env(monkeypatch):
    """cli/train_*.py calls ray.init(runtime_env=<configs/envs/runtime_env.yaml>): the plugin joins it."""
    import os

    import ray
    import yaml
    from conftest import mindspeed_src

    from rlhf_ext.patches.activation.ray_env import SETUP_HOOK, with_plugin_runtime_env

    assert getattr(ray.init, "__rlhf_ext_patch__", None)
    with open(os.path.join(mindspeed_src(), "configs", "envs", "runtime_env.yaml"), encoding="utf-8") as f:
        runtime_env = yaml.safe_load(f)
    monkeypatch.setenv("RLHF_EXT_PLUGINS", "rlhf_ext")
    merged = with_plugin_runtime_env(runtime_env)
    assert merged["env_vars"]["RLHF_EXT_PLUGINS"] == "rlhf_ext"
    assert merged["worker_process_setup_hook"] == SETUP_HOOK
    for key, value in runtime_env["env_vars"].items():
        assert merged["env_vars"][key] == value
