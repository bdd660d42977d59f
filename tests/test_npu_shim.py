"""rlhf_ext.npu's detection and transfer_to_npu, driven through the stand-in torch_npu.

The checks run in a fresh interpreter (tests/npu_scenarios/npu_shim.py): the shim patches torch
process-wide, which must not leak into this pytest process.
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
def shim_results():
    return runner.run_scenario("npu_shim.py", standin=True, timeout=180)


def _ok(result):
    assert not (isinstance(result, dict) and "error" in result), result
    return result


def test_broken_torch_npu_names_the_cann_step(shim_results):
    result = _ok(shim_results["broken_install"])
    for label in ("detect", "transfer"):
        assert result[label].startswith("BackendUnavailableError"), result[label]
        assert "set_env.sh" in result[label]
        assert "libascendcl.so" in result[label]  # the underlying import error is shown
    # The override skips probing torch_npu altogether.
    assert result["detect_with_override"] == "cpu"


def test_torch_npu_without_devices_is_not_an_npu_process(shim_results):
    assert shim_results["no_devices"] == "cpu"


def test_detection_order_and_override(shim_results):
    result = _ok(shim_results["detection"])
    assert result["auto"] == "npu"
    assert result["override_cpu"] == "cpu"
    assert result["override_cuda"] == "cuda"
    assert result["override_npu"] == "npu"  # case and surrounding spaces are forgiven
    assert "RLHF_EXT_DEVICE='tpu'" in result["override_invalid"]
    assert result["names"] == {
        "device_name": "npu",
        "comm_backend": "hccl",
        "ray_resource_name": "NPU",
        "visible_devices_env": "ASCEND_RT_VISIBLE_DEVICES",
        "ray_noset_env": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    }


def test_npu_still_detected_after_cuda_starts_to_lie(shim_results):
    result = _ok(shim_results["shim"])
    # transfer_to_npu makes torch.cuda.is_available() answer for the NPU ...
    assert result["cuda_is_available"] is True
    # ... so detection must ask the NPU first, or every NPU job would think it runs on CUDA.
    assert result["detect_after_shim"] == "npu"
    assert result["device_module_is_npu"] is True


def test_shim_is_idempotent_and_patches_only_what_torch_npu_misses(shim_results):
    result = _ok(shim_results["shim"])
    assert result["same_capability_wrapper"] is True
    assert result["patches"] == [
        "torch.cuda.get_device_capability",
        "torch.distributed.device_mesh.init_device_mesh",
    ]


def test_hccl_defaults_fill_gaps_only(shim_results):
    env = _ok(shim_results["shim"])["env"]
    assert env["HCCL_CONNECT_TIMEOUT"] == "1800"
    assert env["HCCL_EXEC_TIMEOUT"] == "77"  # set by the user before the shim: kept
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_torch_cuda_calls_land_on_torch_npu(shim_results):
    result = _ok(shim_results["cuda_calls"])
    assert result["current_device"] == 3
    assert result["recorded"] == [
        "set_device",
        "current_device",
        "synchronize",
        "empty_cache",
        "current_stream",
        "get_device_properties",
    ]
    assert result["stream_has_npu_handle"] is True
    assert result["device_name"] == "Ascend910B-standin"


def test_device_capability_none_becomes_a_tuple(shim_results):
    result = _ok(shim_results["cuda_calls"])
    assert result["npu_capability_untouched"] is None  # torch_npu's own answer
    assert result["capability"] == [0, 0]  # what CUDA-minded callers now get


def test_cuda_device_strings_become_npu(shim_results):
    result = _ok(shim_results["device_strings"])
    assert result["rewritten_to"] == ["npu", "npu:1", "npu:3"]
    assert result["module_moved"] == ["module.npu"]
    assert result["placed_on"] == ["cpu"] * 4  # the stand-in keeps "NPU" tensors in host memory


def test_nccl_process_group_becomes_hccl(shim_results):
    result = _ok(shim_results["process_group"])
    assert result["asked"] == ["hccl"]
    assert result["backend"] == "hccl"
    assert result["hccl_groups"] == 1
    assert result["all_reduce"] == [2.0, 3.0]


def test_device_mesh_type_cuda_becomes_npu(shim_results):
    assert shim_results["device_mesh"] == ["npu", "cpu"]
