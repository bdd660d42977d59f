"""Stand-in for torch_npu.contrib.transfer_to_npu (tests only).

On import, like the real module: every ``torch.cuda`` function torch_npu provides is replaced by
the ``torch.npu`` one (so ``torch.cuda.is_available()`` now answers for the NPU), CUDA device
arguments of tensor factories / ``Tensor.to`` / ``Module.to`` become NPU devices, ``.cuda()``
becomes ``.npu()``, and ``init_process_group`` gets ``hccl`` where ``nccl`` was asked for. The
difference: "NPU" tensors live in host memory, so the rewritten device is recorded and then
placed on the CPU.
"""

import functools

import torch
import torch.distributed as dist
import torch.utils._device

from torch_npu import npu
from torch_npu.standin import record

_CUDA_NAMES = [
    "current_device", "set_device", "synchronize", "empty_cache", "current_stream", "default_stream", "stream",
    "device_count", "is_available", "get_device_properties", "get_device_name", "get_device_capability",
    "mem_get_info", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "memory_stats", "manual_seed", "manual_seed_all",
    "Stream", "Event", "device",
]  # fmt: skip
_FACTORIES = ["empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "rand", "randn", "randint",
              "empty_like", "zeros_like", "ones_like", "full_like", "eye", "linspace"]  # fmt: skip


def _npu_then_host(value, bare_int):
    """Rewrite a CUDA device to the NPU (recorded), then place it on the host (the stand-in's NPU)."""
    is_cuda = (
        (isinstance(value, str) and value.split(":")[0] == "cuda")
        or (isinstance(value, torch.device) and value.type == "cuda")
        or (bare_int and isinstance(value, int) and not isinstance(value, bool))
    )
    is_npu = isinstance(value, str) and value.split(":")[0] == "npu"
    if is_cuda:
        if isinstance(value, int):
            index = value
        elif isinstance(value, torch.device):
            index = value.index
        else:
            index = torch.device(value).index
        record("device_to_npu", "npu" if index is None else f"npu:{index}")
        return "cpu"
    if is_npu:
        return "cpu"
    return value


def _device_kwarg(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if kwargs.get("device") is not None:
            kwargs["device"] = _npu_then_host(kwargs["device"], True)
        return fn(*args, **kwargs)

    return wrapper


def _to(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if args:
            args = (_npu_then_host(args[0], True),) + args[1:]
        if kwargs.get("device") is not None:
            kwargs["device"] = _npu_then_host(kwargs["device"], True)
        return fn(self, *args, **kwargs)

    return wrapper


def _hccl(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if isinstance(kwargs.get("backend"), str) and "nccl" in kwargs["backend"]:
            kwargs["backend"] = kwargs["backend"].replace("nccl", "hccl")
        elif args and isinstance(args[0], str) and "nccl" in args[0]:
            args = (args[0].replace("nccl", "hccl"),) + args[1:]
        record("init_process_group", args[0] if args else kwargs.get("backend"))
        return fn(*args, **kwargs)

    return wrapper


# As the real module does first: cache torch's factory set before the factories are wrapped.
torch.utils._device._device_constructors()

for _name in _CUDA_NAMES:
    setattr(torch.cuda, _name, getattr(npu, _name))
for _name in _FACTORIES:
    setattr(torch, _name, _device_kwarg(getattr(torch, _name)))
torch.Tensor.to = _to(torch.Tensor.to)
torch.nn.Module.to = _to(torch.nn.Module.to)
torch.Tensor.cuda = lambda self, *a, **k: (record("tensor.npu"), self.to("cpu"))[1]
torch.nn.Module.cuda = lambda self, *a, **k: (record("module.npu"), self.to("cpu"))[1]
dist.init_process_group = _hccl(dist.init_process_group)
record("transfer_to_npu_imported")
