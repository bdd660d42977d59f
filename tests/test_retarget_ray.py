"""OpenRLHF's Ray actor groups on a real local Ray cluster that offers NPUs (custom resource "NPU").

Runs tests/npu_scenarios/ray_npu.py in a fresh interpreter (the Ray driver) with the stand-in
torch_npu; its Ray workers apply the retarget through a worker_process_setup_hook, as the plugin
does in every process.
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
def ray_results():
    return runner.run_scenario("ray_npu.py", standin=True, timeout=420)


def _ok(result):
    assert not (isinstance(result, dict) and "error" in result), result
    return result


def test_unretargeted_gpu_bundle_never_schedules(ray_results):
    assert ray_results["backend"] == "npu"
    assert _ok(ray_results["negative_control"]) == {"ready": False}


def test_actor_group_gets_npu_bundles(ray_results):
    result = _ok(ray_results["actor_group"])
    assert result["bundles"] == [[["CPU", 1.0], ["NPU", 1.0]]] * 2


def test_each_actor_takes_local_rank_from_its_npu(ray_results):
    actors = _ok(ray_results["actor_group"])["actors"]
    assert len(actors) == 2
    for info in actors:
        assert info["applied_backend"] == "npu"
        assert info["gpu_ids"] == []  # why OpenRLHF's own ray.get_gpu_ids()[0] would fail here
        assert len(info["npu_ids"]) == 1
        assert info["local_rank"] == info["npu_ids"][0]
        assert info["ascend_visible"] is None  # RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
        assert info["set_device_calls"] == [[int(info["local_rank"])]]
    assert len({info["local_rank"] for info in actors}) == 2  # one NPU each
    helper_id = str(_ok(ray_results["helper_request"])["ids"]["local_device_ids"][0])
    assert helper_id not in {info["local_rank"] for info in actors}


def test_vllm_actor_masks_devices_with_ascend_variable(ray_results):
    result = _ok(ray_results["actor_group"])
    first_npu = result["actors"][0]["npu_ids"][0]
    assert result["rollout"]["uni"] == {"ASCEND_RT_VISIBLE_DEVICES": first_npu, "VLLM_RAY_BUNDLE_INDICES": "0"}
    # vLLM's Ray executor places its own workers: the actor must drop its mask.
    assert result["rollout"]["ray_executor_mask"] is None


def test_resource_helper_schedules_and_reads_ids(ray_results):
    result = _ok(ray_results["helper_request"])
    assert result["options"] == {"num_gpus": 0, "resources": {"NPU": 1}}
    ids = result["ids"]
    assert ids["env_name"] == "ASCEND_RT_VISIBLE_DEVICES"
    assert len(ids["local_device_ids"]) == 1
    # Ray itself set the visible-devices variable to the id it assigned.
    assert ids["env"] == str(ids["local_device_ids"][0])
