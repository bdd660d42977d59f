"""Stand-in for torch_npu (tests only): ``torch.npu`` routed to the CPU, every call recorded.

Importing it does what importing the real torch_npu does that rlhf_ext relies on: registers
``torch.npu`` and an ``hccl`` process-group backend (gloo underneath here). See README.md.
"""

import os
import sys

if os.environ.get("STANDIN_TORCH_NPU_BROKEN") == "1":
    # What the real import raises when CANN's set_env.sh was not sourced.
    raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory")

import torch
import torch.distributed as dist

from torch_npu import npu, standin  # noqa: E402

__version__ = "2.13.0.standin"
STANDIN = True

# The real torch_npu renames torch's PrivateUse1 device to "npu" and registers torch.npu as a device
# module. The stand-in only registers the module (its "NPU" memory is host memory, and a renamed
# PrivateUse1 without C++ hooks would make torch.distributed look for a device that cannot exist).
torch.npu = npu
sys.modules["torch.npu"] = npu


def _hccl_process_group(store, group_rank, group_size, timeout):
    standin.record("hccl_process_group", group_rank, group_size)
    return dist.ProcessGroupGloo(store, group_rank, group_size, timeout)


if dist.is_available() and "hccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("hccl", _hccl_process_group, devices=["cpu"])


def npu_fusion_attention(*args, **kwargs):
    """Name imported by transformers' Ascend flash-attention integration; the kernel needs real NPUs."""
    standin.record("npu_fusion_attention")
    raise RuntimeError("stand-in torch_npu: npu_fusion_attention runs only on Ascend hardware")
