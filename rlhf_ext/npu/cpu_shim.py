"""``transfer_to_cpu``: the CPU counterpart of torch_npu's ``transfer_to_npu``.

Code written for CUDA (OpenRLHF, parts of DeepSpeed's and transformers' glue) calls
``torch.cuda.current_device()``, moves tensors with ``.to("cuda")`` or ``.to(<int>)``, creates them
with ``device="cuda"`` and asks ``init_process_group`` for NCCL. This module routes all of that to the
host so such code can be smoke-tested on a laptop:

* ``torch.cuda`` functions in :data:`CPU_ROUTED_CUDA_FUNCTIONS` become host equivalents
  (``current_device()`` is 0, synchronisation and cache calls do nothing, memory queries report the
  host, ``get_device_capability()`` is ``(0, 0)``). ``torch.cuda.is_available()`` keeps answering
  False, so libraries that branch on it still take their CPU paths.
* A CUDA device -- ``"cuda"``, ``"cuda:1"``, ``torch.device("cuda")`` or a bare device index -- given
  to the tensor factories in :data:`DEVICE_ARG_FACTORIES`, to ``Tensor.to``, ``Module.to``,
  ``Tensor.new_*`` or ``torch.load(map_location=...)`` becomes ``"cpu"``; ``Tensor.cuda()`` and
  ``Module.cuda()`` return the object on the host.
* ``torch.distributed.init_process_group`` / ``new_group`` use gloo where NCCL was asked for, and
  ``init_device_mesh("cuda", ...)`` builds a CPU mesh.

The same idea as torch_npu's shim (``torch_npu/contrib/transfer_to_npu.py``), written for the host.
It patches torch process-wide: use it only in processes that are meant to run on the CPU.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from types import SimpleNamespace
from typing import Any

from rlhf_ext.seams import ledger
from rlhf_ext.npu.device_mesh import retarget_init_device_mesh

_lock = threading.Lock()
_applied = False

DEVICE_ARG_FACTORIES = (
    "arange", "as_tensor", "empty", "empty_like", "empty_strided", "eye", "full", "full_like", "linspace",
    "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
    "tensor", "zeros", "zeros_like",
)  # fmt: skip
TENSOR_DEVICE_METHODS = ("new_empty", "new_full", "new_ones", "new_tensor", "new_zeros")

CPU_ROUTED_CUDA_FUNCTIONS = (
    "current_device", "set_device", "synchronize", "empty_cache", "ipc_collect", "current_stream",
    "default_stream", "stream", "get_device_properties", "get_device_name", "get_device_capability",
    "mem_get_info", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_stats", "is_available",
)  # fmt: skip
"""``torch.cuda`` names the CPU shim answers for (``is_available`` keeps torch's own False)."""


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _host_free_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class HostStream:
    """Stands in for a CUDA stream: work on the host is already ordered, so every call is a no-op."""

    def __init__(self, device=None, priority=0, **_):
        import torch

        self.device = torch.device("cpu")

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        return event

    def query(self) -> bool:
        return True

    def __eq__(self, other):
        return isinstance(other, HostStream)

    def __hash__(self):
        return hash(HostStream)

    def __repr__(self) -> str:
        return "<rlhf_ext HostStream (cpu)>"


_HOST_STREAM = HostStream()


class _StreamContext:
    def __init__(self, stream=None):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


def _host_function(name: str, body):
    """A distinct function object per ``torch.cuda`` name: torch._dynamo keys its tracing rules by
    object, and one object standing for both e.g. ``synchronize`` and ``empty_cache`` trips its check."""

    def host(*args, **kwargs):
        return body(*args, **kwargs)

    host.__name__ = host.__qualname__ = name
    host.__doc__ = f"torch.cuda.{name} routed to the host by rlhf_ext's CPU shim."
    return host


def _get_device_properties(device=None) -> SimpleNamespace:
    return SimpleNamespace(
        name="cpu",
        total_memory=_host_memory_bytes(),
        multi_processor_count=os.cpu_count() or 1,
        major=0,
        minor=0,
        # OpenRLHF keys CUDA-IPC handles by this; one host is one "device".
        uuid=f"cpu-{socket.gethostname()}",
        is_integrated=True,
        # torch inductor keys its compile cache on .name (CUDA builds) or .gcnArchName (others):
        # vLLM's workers compile their sampled-token log-prob ranking with inductor.
        gcnArchName="cpu",
    )


def _nothing(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


_CUDA_BEHAVIOUR = {
    "current_device": lambda: 0,
    "set_device": _nothing,
    "synchronize": _nothing,
    "empty_cache": _nothing,
    "ipc_collect": _nothing,
    "current_stream": lambda device=None: _HOST_STREAM,
    "default_stream": lambda device=None: _HOST_STREAM,
    "get_device_properties": _get_device_properties,
    "get_device_name": lambda device=None: "cpu",
    "get_device_capability": lambda device=None: (0, 0),
    "mem_get_info": lambda device=None: (_host_free_bytes(), _host_memory_bytes()),
    "memory_allocated": _zero,
    "max_memory_allocated": _zero,
    "memory_reserved": _zero,
    "max_memory_reserved": _zero,
    "reset_peak_memory_stats": _nothing,
    "reset_max_memory_allocated": _nothing,
    "memory_stats": lambda device=None: {},
}


def to_cpu_device(value: Any, bare_index_is_device: bool = True) -> Any:
    """``value`` with any CUDA device replaced by the CPU; anything else unchanged.

    A bare int counts as a device index where the argument can only be a device (``device=0``),
    and not where an int means something else.
    """
    import torch

    if isinstance(value, str):
        return "cpu" if value.split(":", 1)[0] == "cuda" else value
    if isinstance(value, torch.device):
        return torch.device("cpu") if value.type == "cuda" else value
    if bare_index_is_device and isinstance(value, int) and not isinstance(value, bool):
        return "cpu"
    return value


def _map_location_to_cpu(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: to_cpu_device(v, bare_index_is_device=False) for k, v in value.items()}
    return to_cpu_device(value)


def _with_cpu_device_kwarg(fn):
    @functools.wraps(fn)
    def factory(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = to_cpu_device(device)
        return fn(*args, **kwargs)

    factory.__rlhf_ext_cpu_shim__ = True
    return factory


def _with_cpu_to_args(fn):
    """``Tensor.to`` / ``Module.to``: the first positional argument may be a device, dtype or tensor."""

    @functools.wraps(fn)
    def to(self, *args, **kwargs):
        if args:
            args = (to_cpu_device(args[0]),) + args[1:]
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = to_cpu_device(device)
        return fn(self, *args, **kwargs)

    to.__rlhf_ext_cpu_shim__ = True
    return to


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=None):
    extra = {} if memory_format is None else {"memory_format": memory_format}
    return self.to("cpu", non_blocking=non_blocking, **extra)


def _module_cuda(self, device=None):
    return self.to("cpu")


def _tensor_pin_memory(self, device=None):
    # Pinned memory only speeds host-to-device copies; with no device there is nothing to pin.
    return self


def _nccl_to_gloo(backend):
    if isinstance(backend, str) and "nccl" in backend.lower():
        return "gloo"
    return backend


def _with_gloo_backend(fn, backend_position: int):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _nccl_to_gloo(kwargs["backend"])
        elif len(args) > backend_position:
            args = args[:backend_position] + (_nccl_to_gloo(args[backend_position]),) + args[backend_position + 1 :]
        return fn(*args, **kwargs)

    call.__rlhf_ext_cpu_shim__ = True
    return call


def transfer_to_cpu() -> None:
    """Route CUDA calls, devices and NCCL to the CPU and gloo in this process (idempotent)."""
    global _applied
    with _lock:
        if _applied:
            return
        import torch
        import torch.distributed as dist

        # torch's device-context mode (e.g. transformers' meta-device model init) recognises factories by
        # identity from a set it builds on first use: build it now, from the unwrapped functions, as
        # torch_npu's transfer_to_npu also does; otherwise buffers such as rotary inv_freq come out
        # uninitialised after from_pretrained.
        from torch.utils._device import _device_constructors

        _device_constructors()
        for name, behaviour in _CUDA_BEHAVIOUR.items():
            ledger.replace(torch.cuda, name, _host_function(name, behaviour))
        ledger.replace(torch.cuda, "stream", _StreamContext)
        for name in DEVICE_ARG_FACTORIES:
            if hasattr(torch, name):
                ledger.wrap(torch, name, _with_cpu_device_kwarg)
        for name in TENSOR_DEVICE_METHODS:
            ledger.wrap(torch.Tensor, name, _with_cpu_device_kwarg)
        ledger.wrap(torch.Tensor, "to", _with_cpu_to_args)
        ledger.wrap(torch.nn.Module, "to", _with_cpu_to_args)
        ledger.replace(torch.Tensor, "cuda", _tensor_cuda)
        ledger.replace(torch.nn.Module, "cuda", _module_cuda)
        ledger.replace(torch.Tensor, "pin_memory", _tensor_pin_memory)
        ledger.wrap(torch, "load", _wrap_torch_load)
        if dist.is_available():
            ledger.wrap(dist, "init_process_group", lambda fn: _with_gloo_backend(fn, 0))
            ledger.wrap(dist, "new_group", lambda fn: _with_gloo_backend(fn, 2))
        retarget_init_device_mesh("cpu")
        _applied = True


def _wrap_torch_load(fn):
    @functools.wraps(fn)
    def load(*args, **kwargs):
        if "map_location" in kwargs:
            kwargs["map_location"] = _map_location_to_cpu(kwargs["map_location"])
        elif len(args) > 1:
            args = (args[0], _map_location_to_cpu(args[1])) + args[2:]
        return fn(*args, **kwargs)

    load.__rlhf_ext_cpu_shim__ = True
    return load


def is_applied() -> bool:
    return _applied


def _forget_applied() -> None:
    """Tests only: after :func:`rlhf_ext.seams.ledger.restore_all`, allow applying again."""
    global _applied
    _applied = False


__all__ = [
    "CPU_ROUTED_CUDA_FUNCTIONS",
    "DEVICE_ARG_FACTORIES",
    "HostStream",
    "TENSOR_DEVICE_METHODS",
    "is_applied",
    "to_cpu_device",
    "transfer_to_cpu",
]
