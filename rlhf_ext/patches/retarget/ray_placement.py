"""Ray side of the retarget: which resource OpenRLHF's actors reserve, and which device each one uses.

OpenRLHF 0.11.2 asks Ray for GPUs in three ways, all rewritten here for the target backend
(:mod:`rlhf_ext.npu.ray_resources` holds the translation rules):

* placement-group bundles ``{"GPU": 1, "CPU": 1}`` (``cli/train_ppo_ray.py``, ``launcher.py``,
  ``vllm_engine.py``): ``ray.util.placement_group.placement_group`` itself is wrapped, because
  the CLI's ``train()`` runs as ``__main__`` and takes the function from there at import time;
  OpenRLHF modules that imported it earlier are patched too;
* ``num_gpus=`` in ``@ray.remote(num_gpus=1)`` defaults and ``.options(num_gpus=...)`` of the
  OpenRLHF actor classes: every actor creation funnels through ``ActorClass._remote`` with the
  merged options, which is wrapped to translate them for actor classes defined in ``openrlhf.*``
  (other Ray users in the process are left alone);
* device ids: ``LOCAL_RANK = ray.get_gpu_ids()[0]`` when Ray's visible-devices setting is off
  (``launcher.BaseDistributedActor``), and ``CUDA_VISIBLE_DEVICES`` handling in
  ``RolloutRayActor._configure_device_env``. On NPU the ids come from
  ``get_accelerator_ids()["NPU"]`` and the variable is ``ASCEND_RT_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from rlhf_ext.seams import ledger
from rlhf_ext.npu.backend import ray_noset_visible_devices_env, visible_devices_env
from rlhf_ext.npu.ray_resources import local_device_ids, retarget_actor_options, retarget_bundle
from rlhf_ext.patches.retarget import vllm_memory
from rlhf_ext.patches.retarget.guard import RetargetError, ray_actor_class_body, ray_actor_method_owners, require
from rlhf_ext.patches.retarget.state import current_backend


# ---------------------------------------------------------------- placement groups
def placement_group(bundles, *args, **kwargs):
    """``ray.util.placement_group.placement_group`` with each bundle's ``"GPU"`` moved to the target
    backend's resource (``"NPU"``; dropped on CPU)."""
    backend = current_backend()
    bundles = [retarget_bundle(bundle, backend) for bundle in bundles]
    return ledger.original(_placement_group_module(), "placement_group")(bundles, *args, **kwargs)


def _placement_group_module():
    # Not `import ray.util.placement_group as m`: ray.util re-exports a function under that same name,
    # and the import statement would return the function.
    import importlib

    return importlib.import_module("ray.util.placement_group")


def patch_ray_placement_group(module, backend: str) -> None:
    require(module, "placement_group", "ray placement-group bundles", params=["bundles"])
    original = ledger.original(module, "placement_group")
    ledger.replace_function(module, "placement_group", placement_group)
    package = sys.modules.get("ray.util")
    if package is not None and getattr(package, "placement_group", None) is original:
        ledger.replace_function(package, "placement_group", placement_group)


def patch_placement_group_importer(module, backend: str) -> None:
    """An OpenRLHF module that did ``from ray.util.placement_group import placement_group``."""
    current = require(module, "placement_group", f"placement-group bundles in {module.__name__}")
    if current is not placement_group and current is ledger.original(_placement_group_module(), "placement_group"):
        ledger.replace_function(module, "placement_group", placement_group)


# ---------------------------------------------------------------- actor resource requests
def _is_openrlhf_actor(actor_class) -> bool:
    metadata = getattr(actor_class, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    return str(getattr(modified, "__module__", "")).startswith("openrlhf.")


def actor_class_remote(self, args=None, kwargs=None, **actor_options):
    """``ray.actor.ActorClass._remote`` that reserves the target backend's devices for OpenRLHF actors."""
    import ray.actor

    if _is_openrlhf_actor(self):
        actor_options = retarget_actor_options(actor_options, current_backend())
    return ledger.original(ray.actor.ActorClass, "_remote")(self, args=args, kwargs=kwargs, **actor_options)


def patch_ray_actor_class(module, backend: str) -> None:
    require(module, "ActorClass._remote", "Ray actor resources", params=["args", "kwargs"])
    ledger.replace_function(module.ActorClass, "_remote", actor_class_remote)


# ---------------------------------------------------------------- LOCAL_RANK in launcher
class RayWithBackendDeviceIds(types.ModuleType):
    """The ``ray`` module as OpenRLHF's launcher sees it: ``get_gpu_ids()`` returns the ids of the
    target backend's devices assigned to this worker (NPU ids on Ascend; ``[0]``, the host, on CPU).

    OpenRLHF reads ``ray.get_gpu_ids()[0]`` as the local rank when Ray leaves the visible-devices
    variable alone; on NPU, Ray reports the assignment under ``"NPU"`` and ``get_gpu_ids()`` is empty.
    """

    def __init__(self, ray_module):
        super().__init__(ray_module.__name__)
        self.__dict__["_ray"] = ray_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_ray"], name)

    def get_gpu_ids(self):
        backend = current_backend()
        if backend == "cpu":
            return [0]
        ids = local_device_ids(backend)
        if not ids:
            raise RetargetError(
                f"this Ray worker has no {backend.upper()} assigned, yet "
                f"{ray_noset_visible_devices_env(backend) or 'RAY_EXPERIMENTAL_NOSET_*'} asks OpenRLHF to take its "
                "local rank from the assigned device; request the device for the actor or unset that variable"
            )
        return ids


def patch_launcher(module, backend: str) -> None:
    require(module, "BaseDistributedActor.__init__", "LOCAL_RANK from Ray accelerator ids",
            params=["world_size", "rank", "master_addr", "master_port"])  # fmt: skip
    ray_module = require(module, "ray", "LOCAL_RANK from Ray accelerator ids")
    if not isinstance(ray_module, RayWithBackendDeviceIds):
        ledger.replace(module, "ray", RayWithBackendDeviceIds(ray_module))


# ---------------------------------------------------------------- vLLM actor visible devices
def configure_rollout_device_env(self, backend, bundle_indices, num_gpus):
    """``RolloutRayActor._configure_device_env`` for NPU/CPU (runs inside the vLLM Ray actor).

    * vLLM's Ray executor (``backend == "ray"``, TP > 1) places its own workers, so the actor must not
      keep a visible-devices mask: OpenRLHF drops the CUDA/ROCm ones, this also drops
      ``ASCEND_RT_VISIBLE_DEVICES``;
    * with ``RAY_EXPERIMENTAL_NOSET_*`` set, Ray did not mask devices, so the actor masks itself to
      its own device: on NPU from ``get_accelerator_ids()["NPU"]``, not ``ray.get_gpu_ids()``;
    * the ``VLLM_RAY_*`` hints for vLLM's Ray executor are set as OpenRLHF does.
    """
    from openrlhf.trainer.ray.utils import ray_noset_visible_devices

    device_backend = getattr(type(self), "_rlhf_ext_backend", None) or current_backend()
    own_env = visible_devices_env(device_backend)
    if backend == "ray":
        for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", own_env):
            if name:
                os.environ.pop(name, None)
    elif own_env and ray_noset_visible_devices():
        ids = local_device_ids(device_backend)
        if not ids:
            raise RetargetError(f"the vLLM actor has no {device_backend.upper()} assigned by Ray; cannot set {own_env}")
        os.environ[own_env] = str(ids[0])
    if bundle_indices is not None:
        os.environ["VLLM_RAY_PER_WORKER_GPUS"] = str(num_gpus)
        os.environ["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, bundle_indices))


def patch_vllm_engine(module, backend: str) -> None:
    actor_class = require(module, "RolloutRayActor", "vLLM actor visible devices")
    body = ray_actor_class_body(actor_class, "vLLM actor visible devices")
    require(
        body, "_configure_device_env", "vLLM actor visible devices", params=["backend", "bundle_indices", "num_gpus"]
    )
    for owner in ray_actor_method_owners(actor_class, "vLLM actor visible devices"):
        # Ray copies this class to the actor's process by value: the backend chosen here travels with it.
        ledger.replace(owner, "_rlhf_ext_backend", backend)
        ledger.replace_function(owner, "_configure_device_env", configure_rollout_device_env)
        if backend == "cpu":
            _size_cpu_kv_cache(owner)
    patch_placement_group_importer(module, backend)


def _size_cpu_kv_cache(owner: type) -> None:
    """Route ``RolloutRayActor.__init__`` through :func:`vllm_memory.rollout_actor_init` (CPU target)."""
    init = require(owner, "__init__", "vLLM CPU KV-cache size")
    if init is vllm_memory.rollout_actor_init:
        return
    ledger.replace(owner, vllm_memory.ORIGINAL_INIT, init)
    ledger.replace_function(owner, "__init__", vllm_memory.rollout_actor_init)


__all__ = [
    "RayWithBackendDeviceIds",
    "actor_class_remote",
    "configure_rollout_device_env",
    "patch_launcher",
    "patch_placement_group_importer",
    "patch_ray_actor_class",
    "patch_ray_placement_group",
    "patch_vllm_engine",
    "placement_group",
]
