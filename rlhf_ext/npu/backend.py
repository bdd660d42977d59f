"""Which accelerator backend a process runs on, and the names each backend uses.

Three backends: ``"npu"`` (Huawei Ascend through ``torch_npu``), ``"cuda"`` (``torch.cuda``) and
``"cpu"``. Every other part of rlhf_ext asks these helpers instead of hard-coding CUDA names.

Detection order matters: once ``torch_npu.contrib.transfer_to_npu`` is imported,
``torch.cuda.is_available()`` answers for the NPU (it returns True on an Ascend machine), so the
NPU is probed first (torch_npu's own ``torch.npu.is_available()``) and CUDA second. The variable
``RLHF_EXT_DEVICE=npu|cuda|cpu`` overrides detection; it is the way to pin one backend across a Ray
cluster whose driver host has no accelerator.

Names are the ones the libraries define: Ray's resource ``"NPU"`` and ``ASCEND_RT_VISIBLE_DEVICES``
(``ray/_private/accelerators/npu.py``), HCCL as torch_npu's process-group backend, ``hccl`` /
``nccl`` / ``gloo`` as ``torch.distributed`` backend names.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional

BACKENDS = ("npu", "cuda", "cpu")
ENV_DEVICE = "RLHF_EXT_DEVICE"

CANN_SET_ENV_HINT = (
    "source the CANN environment first, e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh` "
    "(use your CANN install path), in the same shell or job that starts Python and Ray"
)

_COMM_BACKEND = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
_RAY_RESOURCE = {"npu": "NPU", "cuda": "GPU", "cpu": None}
_VISIBLE_DEVICES_ENV = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES", "cpu": None}
_RAY_NOSET_ENV = {
    "npu": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    "cuda": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "cpu": None,
}


class BackendUnavailableError(RuntimeError):
    """A backend was asked for (or detected) but its software stack cannot be loaded."""


def backend_override() -> Optional[str]:
    """The backend forced by ``RLHF_EXT_DEVICE``, or None when the variable is unset or empty."""
    raw = os.environ.get(ENV_DEVICE, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value not in BACKENDS:
        raise ValueError(f"{ENV_DEVICE}={raw!r} is not a backend rlhf_ext knows; use one of: {', '.join(BACKENDS)}")
    return value


def import_torch_npu() -> ModuleType:
    """Import ``torch_npu``, or raise :class:`BackendUnavailableError` saying what to install or source."""
    if "torch_npu" in sys.modules:
        return sys.modules["torch_npu"]
    if importlib.util.find_spec("torch_npu") is None:
        raise BackendUnavailableError(
            "the Ascend NPU backend needs torch_npu, which is not installed in this Python environment: "
            "install the torch_npu build that matches your torch version (pip install torch-npu==<torch version>, "
            f"see docs/npu.md), and {CANN_SET_ENV_HINT}"
        )
    try:
        import torch_npu
    except Exception as exc:  # ImportError, OSError (missing libascendcl.so) or RuntimeError from CANN init
        raise BackendUnavailableError(
            f"`import torch_npu` failed ({type(exc).__name__}: {exc}). torch_npu loads the CANN libraries when "
            f"imported: {CANN_SET_ENV_HINT}. Set {ENV_DEVICE}=cuda or {ENV_DEVICE}=cpu to skip NPU detection on a "
            "machine that has torch_npu installed but no Ascend stack."
        ) from exc
    return torch_npu


@functools.lru_cache(maxsize=1)
def _probe_hardware() -> str:
    # torch_npu is probed only when it is installed: importing it is what tells whether CANN and NPUs are
    # there, and a broken install must say so rather than silently run the job on CPU.
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None:
        import_torch_npu()
        import torch

        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            return "npu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def detect_backend() -> str:
    """``"npu"``, ``"cuda"`` or ``"cpu"``: ``RLHF_EXT_DEVICE`` if set, else the NPU, then CUDA, then CPU."""
    return backend_override() or _probe_hardware()


def resolve_backend(backend: Optional[str]) -> str:
    """``backend`` checked against :data:`BACKENDS`, or the detected one when None."""
    if backend is None:
        return detect_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of: {', '.join(BACKENDS)}")
    return backend


def device_name(backend: Optional[str] = None) -> str:
    """The torch device type string: ``"npu"``, ``"cuda"`` or ``"cpu"``."""
    return resolve_backend(backend)


def torch_device_module(backend: Optional[str] = None) -> ModuleType:
    """``torch.npu``, ``torch.cuda`` or ``torch.cpu``: the module with ``synchronize``, ``current_device``..."""
    name = resolve_backend(backend)
    import torch

    if name == "npu":
        import_torch_npu()
        module = getattr(torch, "npu", None)
        if module is None:
            raise BackendUnavailableError("torch_npu imported but did not register torch.npu")
        return module
    return getattr(torch, name)


def comm_backend(backend: Optional[str] = None) -> str:
    """The ``torch.distributed`` backend: ``"hccl"``, ``"nccl"`` or ``"gloo"``."""
    return _COMM_BACKEND[resolve_backend(backend)]


def ray_resource_name(backend: Optional[str] = None) -> Optional[str]:
    """Ray's resource name for one device: ``"NPU"``, ``"GPU"``, or None on CPU (no accelerator resource)."""
    return _RAY_RESOURCE[resolve_backend(backend)]


def visible_devices_env(backend: Optional[str] = None) -> Optional[str]:
    """The variable that restricts a process to some devices: ``ASCEND_RT_VISIBLE_DEVICES`` /
    ``CUDA_VISIBLE_DEVICES``, None on CPU."""
    return _VISIBLE_DEVICES_ENV[resolve_backend(backend)]


def ray_noset_visible_devices_env(backend: Optional[str] = None) -> Optional[str]:
    """The variable that stops Ray from setting :func:`visible_devices_env` for each worker."""
    return _RAY_NOSET_ENV[resolve_backend(backend)]


def reset_detection_cache() -> None:
    """Forget the probed hardware (tests, or after changing what is importable)."""
    _probe_hardware.cache_clear()


__all__ = [
    "BACKENDS",
    "ENV_DEVICE",
    "BackendUnavailableError",
    "backend_override",
    "comm_backend",
    "detect_backend",
    "device_name",
    "import_torch_npu",
    "ray_noset_visible_devices_env",
    "ray_resource_name",
    "reset_detection_cache",
    "resolve_backend",
    "torch_device_module",
    "visible_devices_env",
]
