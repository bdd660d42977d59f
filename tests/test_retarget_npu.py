"""The OpenRLHF retarget for NPU, applied to the real installed OpenRLHF classes.

Runs tests/npu_scenarios/openrlhf_npu.py in a fresh interpreter with the stand-in torch_npu and
vllm-ascend; the backend is detected, not forced.
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
def npu():
    return runner.run_scenario("openrlhf_npu.py", standin=True, timeout=300)


def _ok(result):
    assert not (isinstance(result, dict) and "error" in result), result
    return result


def test_backend_detected_and_exported(npu):
    assert npu["plugin"] == ["rlhf_ext"]  # the algorithm plugin activated first, as in a real run
    assert npu["backend"] == {"applied": "npu", "env": "npu"}


def test_device_shim_applied_on_torch_import(npu):
    result = _ok(npu["shim"])
    assert result["transfer_imported"] == 1
    assert result["cuda_is_available"] is True
    assert result["capability"] == [0, 0]
    assert result["hccl_connect_timeout"] == "1800"


def test_every_openrlhf_seam_is_patched(npu):
    result = _ok(npu["patched"])
    assert result["placement_group"] == [True, True, True]
    assert result["ray_util_placement_group"] is True
    assert result["actor_remote"] is True
    assert result["launcher_ray"] == "RayWithBackendDeviceIds"
    assert result["rollout_env"] is True
    assert result["rollout_backend"] == "npu"
    assert result["sync_group"] == [True, True]
    assert result["regression_loader"] == [True, True, True]
    assert result["entropy_compiled"] == [False, False]  # torch.compile off
    assert {
        "openrlhf.models.utils",
        "openrlhf.trainer.ray.launcher",
        "openrlhf.trainer.ray.ppo_actor",
        "openrlhf.trainer.ray.vllm_engine",
        "openrlhf.utils.deepspeed.deepspeed",
        "openrlhf.utils.distributed_util",
        "ray.actor",
        "ray.util.placement_group",
    } <= set(result["modules"])


def test_attention_mapping_on_npu(npu):
    result = _ok(npu["attention"])
    # transformers 5.x ships its Ascend flash-attention integration: FA2 runs on npu_fusion_attention.
    assert result["flash_attention_2"] == "flash_attention_2"
    assert result["flash_attention_3"] == "sdpa"
    assert result["sdpa"] == "sdpa"
    assert result["forced"] == "eager"


def test_deepspeed_strategy_builds_an_npu_mesh(npu):
    assert npu["strategy_mesh_patched"] is True
    assert npu["device_mesh"] == ["npu", "npu"]


def test_ring_attention_refused_with_reason(npu):
    result = _ok(npu["ring_guard"])
    assert result["type"] == "RetargetError"
    assert "ring_flash_attn" in result["message"] and "NPU" in result["message"]


def test_sync_backend_rules(npu):
    result = _ok(npu["sync_args"])
    assert result["default"] == "hccl"
    assert result["explicit_gloo"] == "gloo"
    assert result["sync_with_ray"].startswith("RetargetError") and "HCCL" in result["sync_with_ray"]


def test_actor_trainer_turns_cuda_ipc_off(npu):
    result = _ok(npu["actor_trainer"])
    assert result["process_group_backend"] == "hccl"  # DeepSpeed-style init asked for nccl
    assert result["sync_backend"] == "hccl"
    # colocate_all + nccl would have meant CUDA IPC; with hccl OpenRLHF broadcasts instead.
    assert result["use_cuda_ipc"] is False
    assert result["replay_target"] == "cuda:0"  # OpenRLHF's own object ...
    assert result["replay_move"] == ["npu:0", "cpu"]  # ... which moves experiences to the NPU
    assert "current_device" in result["npu_calls"] and "synchronize" in result["npu_calls"]


def test_weights_reach_vllm_worker_over_hccl(npu):
    result = _ok(npu["weight_sync"])
    assert result["errors"] == []
    # One PyHcclCommunicator per side: trainer on its current NPU, vLLM worker on its own device.
    assert sorted(map(tuple, result["communicators"])) == [(0, 2, "npu:0", True), (1, 2, "npu:1", True)]
    # (rank, src, shape, stream.npu_stream): both sides broadcast from rank 0 on the NPU stream that
    # OpenRLHF's torch.cuda.current_stream() now returns.
    assert sorted(map(tuple, ((r, s, tuple(shape), h) for r, s, shape, h in result["broadcasts"]))) == [
        (0, 0, (3, 4), 0),
        (1, 0, (3, 4), 0),
    ]
    assert result["received_equal"] is True
    assert result["loaded_names"] == ["layer.weight"]


def test_missing_hccl_library_is_an_error_not_a_silent_noop(npu):
    result = _ok(npu["hccl_library_missing"])
    assert set(result) == {"0", "1"}
    for message in result.values():
        assert message.startswith("RetargetError") and "set_env.sh" in message


def test_retarget_and_plugin_patches_stack_on_the_same_seam(npu):
    result = _ok(npu["coexistence"])
    # Both layers wrap ActorPPOTrainer.__init__; each checked the seam's signature and found it intact.
    assert result["chain"] == [
        "policy loss configuration",
        "rlhf_ext.patches.retarget.weight_sync.actor_ppo_trainer_init",
        "openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer.__init__",
    ]
    assert "policy loss configuration" in result["plugin_patches"]
