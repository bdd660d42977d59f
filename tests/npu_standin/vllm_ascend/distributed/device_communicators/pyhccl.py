"""Stand-in for vllm_ascend.distributed.device_communicators.pyhccl (tests only).

Same constructor and ``broadcast(tensor, src, stream)`` as the real ``PyHcclCommunicator``, and the
same quiet failure mode: when the HCCL library cannot be loaded (``STANDIN_HCCL_LIBRARY=0`` here)
it sets ``available=False, disabled=True`` and every broadcast does nothing. Data moves through
vLLM's real ``StatelessProcessGroup.broadcast_obj`` instead of HCCL.
"""

import os

from torch_npu.standin import record


class PyHcclCommunicator:
    def __init__(self, group, device, library_path=None):
        self.group = group
        self.rank = group.rank
        self.world_size = group.world_size
        if isinstance(device, int):
            device = f"npu:{device}"
        self.device = str(device)
        self.available = os.environ.get("STANDIN_HCCL_LIBRARY", "1") == "1"
        self.disabled = not self.available
        record("PyHcclCommunicator", self.rank, self.world_size, self.device, self.available)

    def broadcast(self, tensor, src, stream=None):
        if self.disabled:
            return
        record("hccl_broadcast", self.rank, src, tuple(tensor.shape), getattr(stream, "npu_stream", None))
        payload = tensor.detach().to("cpu").clone() if self.rank == src else None
        received = self.group.broadcast_obj(payload, src=src)
        if self.rank != src:
            tensor.copy_(received)
