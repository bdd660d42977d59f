"""Environment defaults for HCCL and torch_npu in RL jobs, applied only where the user set nothing.

RL training keeps ranks idle inside collectives far longer than pre-training does: trainer ranks
wait in a barrier while vLLM generates, and the weight-sync group forms while other roles are
still loading checkpoints. CANN's defaults are tuned for the latter case (``HCCL_CONNECT_TIMEOUT``
120 s, ``HCCL_EXEC_TIMEOUT`` about 30 min per the CANN environment-variable reference), so jobs die
with HCCL timeouts that have nothing to do with a fault. Ascend's own RL stack (MindSpeed-RL,
``configs/envs/runtime_env.yaml``) raises the same two and turns on expandable segments.

Every value here can be overridden by setting the variable, and ``RLHF_EXT_HCCL_DEFAULTS=0``
turns all of them off. With ``RLHF_EXT_NPU_SLEEP_MODE=1`` (set by the OpenRLHF plugin's driver for
``--vllm.enable_sleep``, :mod:`rlhf_ext.patches.openrlhf.sleep_mode`, and carried to every Ray
worker like every ``RLHF_EXT_*`` variable) the allocator default is ``expandable_segments:False``:
vllm-ascend's sleep-mode allocator refuses expandable segments (``CaMemAllocator.__init__`` in
``vllm_ascend/device_allocator/camem.py`` asserts ``"expandable_segments:True" not in
PYTORCH_NPU_ALLOC_CONF``; the cause is pytorch/pytorch#147851).
"""

from __future__ import annotations

import os
from typing import Dict, MutableMapping, Optional

ENV_SWITCH = "RLHF_EXT_HCCL_DEFAULTS"
SLEEP_MODE_ENV = "RLHF_EXT_NPU_SLEEP_MODE"
ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"
SLEEP_MODE_ALLOC_CONF = "expandable_segments:False"
_applied_here: Dict[str, str] = {}  # what apply_hccl_defaults set in os.environ of this process

HCCL_DEFAULTS: Dict[str, str] = {
    # seconds to establish a communicator: covers ranks that are still loading models
    "HCCL_CONNECT_TIMEOUT": "1800",
    # seconds one collective may wait: covers trainer ranks idling while a long rollout runs
    "HCCL_EXEC_TIMEOUT": "3600",
    # fewer out-of-memory failures from fragmentation when models are offloaded and reloaded each step
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    # vllm-ascend's workers must not be forked from a process that already initialised the NPU
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
}

ENV_DOCS: Dict[str, str] = {
    "HCCL_CONNECT_TIMEOUT": "seconds HCCL waits while building a communicator (CANN default 120)",
    "HCCL_EXEC_TIMEOUT": "seconds one HCCL collective may block before the job fails",
    "HCCL_IF_IP": "IP address HCCL uses for its host-side rendezvous on this node",
    "HCCL_SOCKET_IFNAME": "network interface HCCL uses for host-side traffic (e.g. eth0)",
    "HCCL_BUFFSIZE": "MB of device memory per communicator for data exchange (CANN default 200)",
    "GLOO_SOCKET_IFNAME": "network interface for gloo (CPU collectives, vLLM metadata)",
    "TP_SOCKET_IFNAME": "network interface for torch's TensorPipe RPC",
    "PYTORCH_NPU_ALLOC_CONF": "torch_npu caching-allocator options, like PYTORCH_CUDA_ALLOC_CONF",
    "TASK_QUEUE_ENABLE": "torch_npu operator dispatch queue level (1 default, 2 more aggressive)",
    "ASCEND_RT_VISIBLE_DEVICES": "NPUs this process may use; Ray sets it per actor",
    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "stop Ray from setting ASCEND_RT_VISIBLE_DEVICES",
    "VLLM_WORKER_MULTIPROC_METHOD": "how vLLM starts its workers; vllm-ascend needs spawn",
}


def hccl_env_defaults() -> Dict[str, str]:
    """The defaults rlhf_ext applies on NPU (a copy; empty when ``RLHF_EXT_HCCL_DEFAULTS=0``)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return {}
    defaults = dict(HCCL_DEFAULTS)
    if os.environ.get(SLEEP_MODE_ENV) == "1":
        defaults[ALLOC_CONF] = SLEEP_MODE_ALLOC_CONF
    return defaults


def applied_defaults() -> Dict[str, str]:
    """The defaults :func:`apply_hccl_defaults` set in this process's ``os.environ`` (a copy)."""
    return dict(_applied_here)


def apply_hccl_defaults(env: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Set each default that ``env`` (``os.environ`` by default) lacks; returns the ones it set."""
    target = os.environ if env is None else env
    applied = {}
    for name, value in hccl_env_defaults().items():
        if name not in target:
            target[name] = value
            applied[name] = value
    if env is None:
        _applied_here.update(applied)
    return applied


__all__ = ["ENV_DOCS", "ENV_SWITCH", "HCCL_DEFAULTS", "SLEEP_MODE_ENV", "applied_defaults", "apply_hccl_defaults",
           "hccl_env_defaults"]
