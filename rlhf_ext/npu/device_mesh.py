"""``init_device_mesh("cuda", ...)`` for hosts without CUDA: build the mesh for the device there is.

Neither torch_npu's ``transfer_to_npu`` nor anything in torch maps the device type of
``torch.distributed.device_mesh.init_device_mesh``, so code written for CUDA builds a mesh for a
device type that does not exist. Both device shims -- :mod:`rlhf_ext.npu.transfer` (NPU) and
:mod:`rlhf_ext.npu.cpu_shim` (CPU) -- map it with :func:`retarget_init_device_mesh`.
"""

from __future__ import annotations

import functools

from rlhf_ext.seams import ledger


def _mesh_device_mapper(device_type: str):
    def make(fn):
        @functools.wraps(fn)
        def init_device_mesh(mesh_device_type, *args, **kwargs):
            if isinstance(mesh_device_type, str) and mesh_device_type.split(":", 1)[0] == "cuda":
                mesh_device_type = device_type
            return fn(mesh_device_type, *args, **kwargs)

        init_device_mesh.__rlhf_ext_shim__ = True
        return init_device_mesh

    return make


def retarget_init_device_mesh(device_type: str) -> None:
    """Make ``init_device_mesh("cuda", ...)`` build a ``device_type`` mesh, for callers that import it later.

    Modules that already hold the function under their own name (OpenRLHF's DeepSpeed strategy)
    are patched by :mod:`rlhf_ext.patches.retarget`.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed.device_mesh as device_mesh

    wrapper = ledger.wrap(device_mesh, "init_device_mesh", _mesh_device_mapper(device_type))
    if getattr(dist, "init_device_mesh", None) is ledger.original(device_mesh, "init_device_mesh"):
        ledger.replace(dist, "init_device_mesh", wrapper)


__all__ = ["retarget_init_device_mesh"]
