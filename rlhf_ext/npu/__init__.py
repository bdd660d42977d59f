"""Device detection and the ``transfer_to_npu`` shim, so one recipe runs on Ascend NPUs, CUDA GPUs or CPU.

Backends are ``"npu"``, ``"cuda"`` and ``"cpu"``; :func:`detect_backend` checks the NPU first
(``torch_npu``'s shim makes ``torch.cuda.is_available()`` answer True on Ascend), then CUDA, and
``RLHF_EXT_DEVICE=npu|cuda|cpu`` overrides it. Every other part of rlhf_ext asks the helpers below
instead of hard-coding CUDA names.

Imports stay cheap: torch, torch_npu and Ray load only when a helper needs them.

NPU behaviour in this package was verified against a stand-in ``torch_npu`` in the tests and by
reading torch_npu's and vllm-ascend's sources, not on Ascend hardware; see docs/npu.md.
"""

from rlhf_ext.npu.backend import (
    BACKENDS,
    ENV_DEVICE,
    BackendUnavailableError,
    backend_override,
    comm_backend,
    detect_backend,
    device_name,
    import_torch_npu,
    ray_noset_visible_devices_env,
    ray_resource_name,
    reset_detection_cache,
    torch_device_module,
    visible_devices_env,
)
from rlhf_ext.npu.cpu_kv_cache import (
    ENV_KV_CACHE,
    CpuMemoryError,
    check_cpu_kv_cache,
    cpu_kv_cache_bytes,
    estimate_kv_cache_bytes,
)
from rlhf_ext.npu.hccl_env import ENV_DOCS, HCCL_DEFAULTS, apply_hccl_defaults, hccl_env_defaults
from rlhf_ext.npu.ray_resources import local_device_ids, ray_actor_resources, retarget_actor_options, retarget_bundle


def transfer_to_npu() -> None:
    """Apply ``torch_npu.contrib.transfer_to_npu`` plus what it does not cover (idempotent).

    Raises :class:`BackendUnavailableError` naming the CANN ``set_env.sh`` step when torch_npu or
    CANN cannot be loaded. See :mod:`rlhf_ext.npu.transfer`.
    """
    from rlhf_ext.npu.transfer import transfer_to_npu as _transfer_to_npu

    _transfer_to_npu()


def transfer_to_cpu() -> None:
    """Route ``torch.cuda`` calls, CUDA devices and NCCL to the host and gloo (idempotent).

    See :mod:`rlhf_ext.npu.cpu_shim`.
    """
    from rlhf_ext.npu.cpu_shim import transfer_to_cpu as _transfer_to_cpu

    _transfer_to_cpu()


def apply_device_shim(backend=None) -> str:
    """The shim for ``backend`` (detected when None): NPU -> :func:`transfer_to_npu`, CPU ->
    :func:`transfer_to_cpu`, CUDA -> nothing. Returns the backend."""
    from rlhf_ext.npu.transfer import apply_device_shim as _apply_device_shim

    return _apply_device_shim(backend)


__all__ = [
    "BACKENDS",
    "ENV_DEVICE",
    "ENV_DOCS",
    "ENV_KV_CACHE",
    "HCCL_DEFAULTS",
    "BackendUnavailableError",
    "CpuMemoryError",
    "apply_device_shim",
    "apply_hccl_defaults",
    "backend_override",
    "check_cpu_kv_cache",
    "comm_backend",
    "cpu_kv_cache_bytes",
    "detect_backend",
    "device_name",
    "estimate_kv_cache_bytes",
    "hccl_env_defaults",
    "import_torch_npu",
    "local_device_ids",
    "ray_actor_resources",
    "ray_noset_visible_devices_env",
    "ray_resource_name",
    "reset_detection_cache",
    "retarget_actor_options",
    "retarget_bundle",
    "torch_device_module",
    "transfer_to_cpu",
    "transfer_to_npu",
    "visible_devices_env",
]
