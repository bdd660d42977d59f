"""DeepSpeed-strategy side of the retarget (``openrlhf/utils/deepspeed/deepspeed.py``).

* ``setup_distributed`` builds its mesh with ``init_device_mesh("cuda", ...)``, a name imported
  into the module before any shim could wrap torch's: that name is replaced by one that builds the
  mesh for the target device (torch_npu's ``transfer_to_npu`` does not cover device meshes).
* Ring attention (``--ds.ring_attn_size > 1``) runs on ``ring_flash_attn``, built on CUDA
  flash-attn kernels: on NPU/CPU ``setup_ring_attn`` stops with an explanation instead of failing
  later inside an import.

Everything else the strategy does on the device goes through ``torch.cuda.*`` and ``Tensor.to``,
which the device shims route (``rlhf_ext.npu``); DeepSpeed itself picks its NPU or CPU accelerator.
"""

from __future__ import annotations

from rlhf_ext.seams import ledger
from rlhf_ext.npu.backend import device_name
from rlhf_ext.patches.retarget.guard import RetargetError, require
from rlhf_ext.patches.retarget.state import current_backend


def init_device_mesh(device_type, *args, **kwargs):
    """``init_device_mesh`` as the DeepSpeed strategy calls it, with ``"cuda"`` meaning the target device."""
    import torch.distributed.device_mesh as device_mesh

    if isinstance(device_type, str) and device_type.split(":", 1)[0] == "cuda":
        device_type = device_name(current_backend())
    # torch's own name, looked up now: it may carry the device shim's wrapper, which passes this type through.
    return device_mesh.init_device_mesh(device_type, *args, **kwargs)


def setup_ring_attn(self, ds_device_mesh):
    """``DeepspeedStrategy.setup_ring_attn`` refusing ring attention where ring_flash_attn cannot run."""
    from openrlhf.utils.deepspeed.deepspeed import DeepspeedStrategy

    backend = current_backend()
    if getattr(self, "ring_attn_size", 1) > 1 and backend in ("npu", "cpu"):
        raise RetargetError(
            f"--ds.ring_attn_size {self.ring_attn_size} needs ring_flash_attn, which runs only on CUDA flash-attn "
            f"kernels; it is not available on {backend.upper()}. Use --ds.ring_attn_size 1 (sequence packing with "
            "--ds.packing_samples still works)."
        )
    return ledger.original(DeepspeedStrategy, "setup_ring_attn")(self, ds_device_mesh)


def patch_deepspeed_strategy(module, backend: str) -> None:
    require(module, "init_device_mesh", "device mesh type")
    require(module, "DeepspeedStrategy.setup_distributed", "device mesh type")
    require(module, "DeepspeedStrategy.setup_ring_attn", "ring attention guard", params=["ds_device_mesh"])
    ledger.replace_function(module, "init_device_mesh", init_device_mesh)
    ledger.replace_function(module.DeepspeedStrategy, "setup_ring_attn", setup_ring_attn)


__all__ = ["init_device_mesh", "patch_deepspeed_strategy", "setup_ring_attn"]
