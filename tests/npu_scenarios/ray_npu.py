"""Scenario: OpenRLHF's Ray actor groups on a real local Ray cluster that offers "NPU" resources.

The cluster declares ``resources={"NPU": 3}`` and no GPUs, as an Ascend node does. With the
retarget applied (backend detected through the stand-in torch_npu) OpenRLHF's own
``RayActorGroup`` must get its placement group and its ``ReferenceModelActor``s scheduled, each
actor must take its local rank from its NPU id, and OpenRLHF's vLLM actor code must mask devices
with ASCEND_RT_VISIBLE_DEVICES. Run by tests/test_retarget_ray.py.
"""

import os
import sys
from pathlib import Path

from _scenario import Results, install_flash_attn_fallback

results = Results()

from rlhf_ext.seams import ledger  # noqa: E402
from rlhf_ext.npu.ray_resources import ray_actor_resources  # noqa: E402
from rlhf_ext.patches.retarget import apply_openrlhf_retarget  # noqa: E402

results["backend"] = apply_openrlhf_retarget()
install_flash_attn_fallback()

import ray  # noqa: E402
from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor  # noqa: E402

HERE = Path(__file__).resolve().parent
NOSET = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"

ray.init(
    num_cpus=2,
    resources={"NPU": 3},  # two for the actor group, one for the helper check
    include_dashboard=False,
    log_to_driver=False,
    runtime_env={
        "env_vars": {
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            # Ray leaves ASCEND_RT_VISIBLE_DEVICES alone: OpenRLHF must then derive LOCAL_RANK from the id.
            NOSET: "1",
        },
        "worker_process_setup_hook": "rlhf_ext_test_worker.setup",
    },
)


@ray.remote
class Plain:
    def ids(self):
        from rlhf_ext.npu import local_device_ids, visible_devices_env

        name = visible_devices_env("npu")
        return {"local_device_ids": local_device_ids("npu"), "env_name": name, "env": os.environ.get(name)}


# rlhf_ext's own request helper on a non-OpenRLHF actor, with Ray setting the visible devices.
# Started now and collected after the actor group, so its worker starts while the group's do.
HELPER_OPTIONS = ray_actor_resources(1, "npu")
helper_actor = Plain.options(num_cpus=0, runtime_env={"env_vars": {NOSET: "0"}}, **HELPER_OPTIONS).remote()


def helper_request():
    return {"options": HELPER_OPTIONS, "ids": ray.get(helper_actor.ids.remote(), timeout=120)}


def negative_control():
    """The bundle OpenRLHF asks for, sent to Ray unchanged: no node has a GPU, so it never fits."""
    pg_module = sys.modules["ray.util.placement_group"]
    original = ledger.original(pg_module, "placement_group")
    pg = original([{"GPU": 1, "CPU": 1}], strategy="PACK")
    try:
        # GPU is a resource no node has: Ray can never place this bundle, so a short wait suffices.
        return {"ready": pg.wait(timeout_seconds=1)}
    finally:
        ray.util.remove_placement_group(pg)


results.check("negative_control", negative_control)


def probe(actor_self):
    """Runs inside each ReferenceModelActor (via Ray's __ray_call__)."""
    import torch
    from torch_npu import standin

    from rlhf_ext.patches.retarget import applied_backend

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)  # what DeepspeedStrategy.setup_distributed does next
    return {
        "local_rank": os.environ["LOCAL_RANK"],
        "npu_ids": ray.get_runtime_context().get_accelerator_ids()["NPU"],
        "gpu_ids": ray.get_gpu_ids(),
        "ascend_visible": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
        "applied_backend": applied_backend(),
        "set_device_calls": [c[1] for c in standin.calls("set_device")],
    }


def rollout_env(actor_self):
    """The replacement of RolloutRayActor._configure_device_env (tests/test_retarget_npu.py checks it is
    installed on OpenRLHF's class) run in a worker holding one NPU; importing vllm_engine here would
    only add vLLM's import time."""
    from types import SimpleNamespace

    from rlhf_ext.patches.retarget.ray_placement import configure_rollout_device_env

    os.environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    configure_rollout_device_env(SimpleNamespace(), "uni", [0], 1)
    single = {k: os.environ.get(k) for k in ("ASCEND_RT_VISIBLE_DEVICES", "VLLM_RAY_BUNDLE_INDICES")}
    configure_rollout_device_env(SimpleNamespace(), "ray", None, 1)
    return {"uni": single, "ray_executor_mask": os.environ.get("ASCEND_RT_VISIBLE_DEVICES")}


def actor_group():
    group = RayActorGroup(1, 2, ReferenceModelActor, pg=None, num_gpus_per_actor=1)
    actors = group._actor_handlers
    infos = ray.get([actor.__ray_call__.remote(probe) for actor in actors], timeout=240)
    infos.append(ray.get(actors[0].__ray_call__.remote(rollout_env), timeout=240))
    bundles = [
        sorted(bundle.items())
        for table in ray.util.placement_group_table().values()
        if table["state"] == "CREATED"
        for bundle in table["bundles"].values()
    ]
    return {"actors": infos[:-1], "rollout": infos[-1], "bundles": bundles}


results.check("actor_group", actor_group)
results.check("helper_request", helper_request)


results.check("helper_request", helper_request)
ray.shutdown()
results.emit()
