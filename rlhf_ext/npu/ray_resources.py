"""Ray resource requests and device ids for each backend.

Ray knows Ascend NPUs as the accelerator resource ``"NPU"``: a node started with
``ray start --resources='{"NPU": 8}'`` (or auto-detected through CANN's ``acl``) offers it, an
actor asks for it with ``resources={"NPU": n}`` (there is no ``num_npus=``), Ray then sets
``ASCEND_RT_VISIBLE_DEVICES`` for that actor unless
``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES`` is set, and the worker reads its ids from
``ray.get_runtime_context().get_accelerator_ids()["NPU"]`` (``ray.get_gpu_ids()`` only knows GPUs).
Source: ``ray/_private/accelerators/npu.py`` and ``ray/runtime_context.py`` (Ray 2.55).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from rlhf_ext.npu.backend import ray_resource_name, resolve_backend


def retarget_bundle(bundle: Mapping[str, float], backend: Optional[str] = None) -> Dict[str, float]:
    """A placement-group bundle with its ``"GPU"`` amount moved to ``backend``'s device resource.

    On CPU the GPU amount is dropped; a bundle left with no resource at all asks for that many CPUs
    instead, since Ray rejects empty bundles.
    """
    name = resolve_backend(backend)
    out = dict(bundle)
    if name == "cuda" or "GPU" not in out:
        return out
    amount = out.pop("GPU")
    target = ray_resource_name(name)
    if target is not None:
        out[target] = out.get(target, 0) + amount
    elif not any(out.values()):
        out["CPU"] = out.get("CPU", 0) + amount
    return out


def retarget_actor_options(options: Mapping[str, Any], backend: Optional[str] = None) -> Dict[str, Any]:
    """Ray actor/task options with ``num_gpus`` turned into ``backend``'s request.

    NPU: ``num_gpus=n`` -> ``num_gpus=0, resources={..., "NPU": n}``; CPU: ``num_gpus=0``. The explicit
    0 matters: it overrides a ``@ray.remote(num_gpus=1)`` decorator default.
    """
    name = resolve_backend(backend)
    out = dict(options)
    amount = out.get("num_gpus")
    if name == "cuda" or not amount:
        return out
    out["num_gpus"] = 0
    target = ray_resource_name(name)
    if target is not None:
        resources = dict(out.get("resources") or {})
        resources[target] = resources.get(target, 0) + amount
        out["resources"] = resources
    return out


def ray_actor_resources(amount: float, backend: Optional[str] = None) -> Dict[str, Any]:
    """The options that reserve ``amount`` devices for one actor, e.g. ``Actor.options(**ray_actor_resources(1))``."""
    if amount < 0:
        raise ValueError(f"device amount must be >= 0, got {amount}")
    return retarget_actor_options({"num_gpus": amount}, backend) if amount else {"num_gpus": 0}


def local_device_ids(backend: Optional[str] = None) -> List[int]:
    """Ids of the devices Ray assigned to the calling worker (as seen before any visible-devices
    masking); ``[]`` outside an actor that asked for devices, and always on CPU."""
    name = resolve_backend(backend)
    if name == "cpu":
        return []
    import ray

    if name == "cuda":
        return [int(i) for i in ray.get_gpu_ids()]
    ids = ray.get_runtime_context().get_accelerator_ids().get(ray_resource_name(name), [])
    return [int(i) for i in ids]


__all__ = ["local_device_ids", "ray_actor_resources", "retarget_actor_options", "retarget_bundle"]
