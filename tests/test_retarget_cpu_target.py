"""The CPU target of the OpenRLHF retarget (RLHF_EXT_DEVICE=cpu), run for real on OpenRLHF's classes.

Runs tests/npu_scenarios/openrlhf_cpu.py in a fresh interpreter: the CPU device shim patches torch
process-wide.
"""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "npu_scenario_runner", Path(__file__).parent / "npu_scenarios" / "runner.py"
)
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


@pytest.fixture(scope="module")
def cpu():
    return runner.run_scenario("openrlhf_cpu.py", env={"RLHF_EXT_DEVICE": "cpu"}, timeout=300)


def _ok(result):
    assert not (isinstance(result, dict) and "error" in result), result
    return result


def test_cuda_calls_and_devices_go_to_the_host(cpu):
    assert cpu["backend"] == "cpu"
    result = _ok(cpu["shim"])
    assert result["is_available"] is False  # libraries keep taking their CPU paths
    assert result["current_device"] == 0
    assert result["capability"] == [0, 0]
    assert result["properties_name"] == "cpu"
    assert result["devices"] == ["cpu"] * 9
    assert result["dtype_to_kept"] == "torch.float64"  # .to(dtype) is not mistaken for a device


def test_openrlhf_strategy_sets_up_gloo_and_a_cpu_mesh(cpu):
    result = _ok(cpu["strategy_setup"])
    assert result["world_size"] == 1
    assert result["backend"] == "gloo"  # asked for nccl
    assert result["new_group_backend"] == "gloo"
    assert result["mesh_device_type"] == "cpu"
    assert result["mesh_dims"] == ["dp", "sp", "tp"]


def test_flash_attention_flag_maps_to_sdpa(cpu):
    result = _ok(cpu["attention_and_packing"])
    assert result["attn_packed"] == "sdpa"
    assert result["attn_padded"] == "sdpa"


FP32 = {"convert": "torch.float32", "actor_params": ["torch.float32"], "ds_train_bf16": False, "ds_eval_bf16": False,
        "ds_fp16": False, "vllm_dtype": "float32"}  # fmt: skip
BF16 = {"convert": "torch.bfloat16", "actor_params": ["torch.bfloat16"], "ds_train_bf16": True, "ds_eval_bf16": True,
        "ds_fp16": False, "vllm_dtype": "bfloat16"}  # fmt: skip


def test_training_dtype_follows_the_cpu_and_the_setting(cpu):
    # --ds.param_dtype bf16 through OpenRLHF's own Actor loader, DeepSpeed configs and rollout engine arguments
    result = _ok(cpu["train_dtype"])
    assert result["fp32"] == FP32
    assert result["asked"] == BF16
    # auto: bf16 only where the CPU computes it natively (scripts/avx2_only/run.sh makes this machine answer no)
    assert result["auto"] == (BF16 if result["native_bf16"] else FP32)
    assert "RLHF_EXT_CPU_DTYPE='bogus' is not one of auto, asked, fp32" in result["bogus"]


def test_deepspeed_builds_torchs_adamw_for_openrlhfs_adam_config(cpu):
    # nothing compiled: DeepSpeed's own torch_adam switch, set by the CPU target (cpu_optimizer.py)
    result = _ok(cpu["adam_optimizer"])
    assert result["optimizer"] == "AdamW" and result["is_torch_adamw"], result
    assert result["changed"] >= result["params"] // 2, result
    # float32 (no bf16 optimizer, no ZeRO): the clip norm DeepSpeed computes is the engine's grad norm,
    # not None (which OpenRLHF logged as actor_grad_norm 0 at every step)
    assert result["bf16"] is False and result["expected_grad_norm"] > 0
    assert result["grad_norm"] == pytest.approx(result["expected_grad_norm"], rel=1e-5), result


def test_models_load_intact_under_the_shim(cpu):
    # Regression: wrapping torch's factories before torch cached its constructor set left rotary
    # inv_freq uninitialised after from_pretrained (garbage of order 1e26).
    assert _ok(cpu["attention_and_packing"])["inv_freq_error"] < 1e-6


def test_packing_still_correct_without_flash_attn(cpu):
    result = _ok(cpu["attention_and_packing"])
    # OpenRLHF's packed forward (one row, position ids restarting per sample) equals each sample alone.
    assert result["packed_vs_alone"] < 1e-4
    assert result["padded_vs_alone"] < 1e-4
    # Negative control: the same row without the restarts lets sample 2 attend to sample 1.
    assert result["leaky_vs_alone"] > 100 * max(result["packed_vs_alone"], 1e-6)


def test_compute_entropy_runs_eagerly_and_correctly(cpu):
    result = _ok(cpu["entropy_eager"])
    assert result["compiled"] is False
    assert result["max_error"] < 1e-5


def test_weights_reach_vllm_worker_over_gloo(cpu):
    result = _ok(cpu["weight_sync"])
    assert result["errors"] == []
    assert result["group_type"] == "GlooBroadcaster"
    assert result["received_equal"] is True


def test_sync_backend_gloo_and_no_cuda_ipc(cpu):
    assert _ok(cpu["actor_trainer"]) == {"sync_backend": "gloo", "use_cuda_ipc": False}


def test_ring_attention_refused_on_cpu(cpu):
    assert cpu["ring_guard"].startswith("RetargetError") and "CPU" in cpu["ring_guard"]


def test_retarget_first_then_plugin_still_stack(cpu):
    assert cpu["plugin"] == ["rlhf_ext"]
    result = _ok(cpu["coexistence"])
    # The plugin checks ActorPPOTrainer.__init__'s parameter list before wrapping it; the retarget's
    # replacement presents the original signature, so the check passes in this order too.
    assert result["layers"] == [
        "policy loss configuration",
        "rlhf_ext.patches.retarget.weight_sync.actor_ppo_trainer_init",
        "openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer.__init__",
    ]
    assert "policy loss configuration" in result["plugin_patches"]
