"""``transfer_to_npu``: torch_npu's CUDA-to-NPU shim plus the gaps it leaves.

``torch_npu.contrib.transfer_to_npu`` (read in github.com/Ascend/pytorch) does, on import:
``torch.cuda.*`` -> ``torch.npu.*``; ``"cuda"`` device arguments -> ``"npu"`` in ~45 tensor factories,
``Tensor.to``/``Module.to`` and a few constructors; ``Tensor.cuda``/``Module.cuda`` -> ``.npu``;
``nccl`` -> ``hccl`` in ``init_process_group``; ``torch.jit.script`` and triton turned off. It leaves
``torch.cuda.is_available()`` returning True (hence NPU-first detection in
:mod:`rlhf_ext.npu.backend`) and does nothing for:

* ``torch.distributed.device_mesh.init_device_mesh("cuda", ...)`` -- not in its list of wrapped
  functions, so the mesh would be built for a device type that does not exist: mapped by
  :mod:`rlhf_ext.npu.device_mesh`;
* ``torch.cuda.get_device_capability()``, which becomes torch_npu's and returns None (CANN has no
  compute capability) -- callers written for CUDA unpack or index it (``major, _ = ...``,
  ``...[0] >= 9`` in torch.distributed's broadcast): here it answers ``(0, 0)``, "no NVIDIA
  architecture", so those callers keep working and leave NVIDIA-only kernels off;
* HCCL/torch_npu environment defaults for RL jobs (:mod:`rlhf_ext.npu.hccl_env`);
* Ray resources, vLLM weight-sync communicators, flash-attn, CUDA IPC and ``torch.compile`` sites:
  those are framework-specific and live in :mod:`rlhf_ext.patches.retarget`.
"""

from __future__ import annotations

import functools
import threading
from typing import Optional

from rlhf_ext.seams import ledger
from rlhf_ext.npu.backend import CANN_SET_ENV_HINT, BackendUnavailableError, detect_backend, import_torch_npu
from rlhf_ext.npu.device_mesh import retarget_init_device_mesh
from rlhf_ext.npu.hccl_env import apply_hccl_defaults

_lock = threading.Lock()
_npu_applied = False

NO_NVIDIA_CAPABILITY = (0, 0)

TORCH_NPU_MAPPED_CUDA_FUNCTIONS = (
    "current_device", "set_device", "synchronize", "empty_cache", "current_stream", "default_stream", "stream",
    "device_count", "is_available", "get_device_properties", "get_device_name", "get_device_capability",
    "mem_get_info", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_stats", "manual_seed", "manual_seed_all",
)  # fmt: skip
"""``torch.cuda`` names that, after ``transfer_to_npu``, resolve to torch_npu's ``torch.npu`` functions
(its ``_patch_cuda`` maps the ``torch.cuda`` namespace onto ``torch_npu.npu``, which defines these in
``torch_npu/npu/utils.py`` and ``torch_npu/npu/memory.py``)."""


def _capability_never_none(fn):
    @functools.wraps(fn)
    def get_device_capability(*args, **kwargs):
        value = fn(*args, **kwargs)
        return NO_NVIDIA_CAPABILITY if value is None else value

    get_device_capability.__rlhf_ext_shim__ = True
    return get_device_capability


def transfer_to_npu() -> None:
    """Apply torch_npu's ``transfer_to_npu`` and the fixes it lacks in this process (idempotent).

    Raises :class:`~rlhf_ext.npu.backend.BackendUnavailableError` naming the missing piece when
    torch_npu or CANN cannot be loaded.
    """
    global _npu_applied
    with _lock:
        if _npu_applied:
            return
        import_torch_npu()
        try:
            import torch_npu.contrib.transfer_to_npu  # noqa: F401  (patches torch on import)
        except Exception as exc:
            raise BackendUnavailableError(
                f"torch_npu imported but its transfer_to_npu shim failed ({type(exc).__name__}: {exc}); "
                f"check that torch_npu matches your torch version and {CANN_SET_ENV_HINT}"
            ) from exc
        import torch

        ledger.wrap(torch.cuda, "get_device_capability", _capability_never_none)
        retarget_init_device_mesh("npu")
        apply_hccl_defaults()
        _npu_applied = True


def apply_device_shim(backend: Optional[str] = None) -> str:
    """Route CUDA calls to ``backend`` (detected when None): torch_npu's shim on NPU, the CPU shim on
    CPU, nothing on CUDA. Returns the backend used."""
    name = backend or detect_backend()
    if name == "npu":
        transfer_to_npu()
    elif name == "cpu":
        from rlhf_ext.npu.cpu_shim import transfer_to_cpu

        transfer_to_cpu()
    elif name != "cuda":
        raise ValueError(f"unknown backend {name!r}; expected npu, cuda or cpu")
    return name


def is_npu_shim_applied() -> bool:
    return _npu_applied


__all__ = [
    "NO_NVIDIA_CAPABILITY",
    "TORCH_NPU_MAPPED_CUDA_FUNCTIONS",
    "apply_device_shim",
    "is_npu_shim_applied",
    "transfer_to_npu",
]
