"""Stand-in for ``torch_npu`` as MindSpeed-RL uses it (tests only).

What MindSpeed-RL's code paths that rlhf_ext touches need: ``torch_npu.npu.mstx.range_start`` /
``range_end`` as no-ops (a timing decorator wraps ``compute_advantage`` and the reward functions
with them), ``manual_seed``/``manual_seed_all``, and ``Tensor.npu()`` returning the tensor itself
(the "NPU" is the host here). Everything else is an on-demand stand-in name.

Unlike tests/npu_standin/torch_npu this one does not register ``torch.npu``: with it,
transformers would believe an NPU is present and pick NPU code paths in the test process.
"""

import sys
import types

import torch

import rlhf_ext_standin_core as _core

_core.install()
_core.add_auto_attributes(sys.modules[__name__])

__version__ = "2.7.1.standin"
STANDIN = True


def _noop(*args, **kwargs):
    return None


npu = _core.make_module("torch_npu.npu")
npu.mstx = types.SimpleNamespace(range_start=_noop, range_end=_noop, mark=_noop)
npu.manual_seed = torch.manual_seed
npu.manual_seed_all = torch.manual_seed
npu.is_available = lambda: False
npu.device_count = lambda: 0
sys.modules["torch_npu.npu"] = npu


def _to_host(self, *args, **kwargs):
    return self


if not hasattr(torch.Tensor, "npu"):
    torch.Tensor.npu = _to_host
if not hasattr(torch.nn.Module, "npu"):
    torch.nn.Module.npu = _to_host
