"""Retarget OpenRLHF 0.11.x from CUDA to Ascend NPUs or to the CPU, without editing OpenRLHF.

One call, made by the rlhf_ext plugin in every process of a job (driver, Ray actors, vLLM
workers)::

    from rlhf_ext.patches.retarget import apply_openrlhf_retarget
    apply_openrlhf_retarget()          # backend from RLHF_EXT_DEVICE, else NPU if present, else no-op

What changes, per CUDA-specific site of OpenRLHF (the full list, checked against the installed
OpenRLHF, is :data:`~rlhf_ext.patches.retarget.sites.KNOWN_SITES`):

* ``torch.cuda.*``, ``"cuda"`` devices, NCCL process groups: torch_npu's ``transfer_to_npu`` plus
  :mod:`rlhf_ext.npu.transfer` on NPU, :mod:`rlhf_ext.npu.cpu_shim` on CPU;
* Ray: ``"GPU"`` bundles and ``num_gpus`` become ``"NPU"`` resources (CPU: none), local ranks and
  ``ASCEND_RT_VISIBLE_DEVICES`` come from Ray's NPU accelerator ids (:mod:`.ray_placement`);
* vLLM weight sync over HCCL with vllm-ascend's ``PyHcclCommunicator`` (CPU: gloo) instead of
  NCCL / CUDA IPC (:mod:`.weight_sync`), its rendezvous bounded and watching the engines
  (:mod:`.rendezvous`);
* on CPU, the rollout engine's KV cache sized from the model, not a fraction of RAM (:mod:`.vllm_memory`);
* ``flash_attention_2`` mapped to what the backend has, ``torch.compile`` off (:mod:`.models`);
  device mesh type and a ring-attention guard in the DeepSpeed strategy (:mod:`.strategy`).

``python -m rlhf_ext.patches.retarget`` lists OpenRLHF's CUDA sites and flags any the
retarget does not account for. NPU behaviour was verified against a stand-in ``torch_npu`` and by
reading torch_npu / vllm-ascend sources, not on Ascend hardware (docs/npu.md).
"""

from rlhf_ext.patches.retarget.apply import MODULE_PATCHES, applied_patches, apply_openrlhf_retarget
from rlhf_ext.patches.retarget.guard import TESTED_OPENRLHF_VERSIONS, RetargetError, openrlhf_version
from rlhf_ext.patches.retarget.inventory import InventoryReport, check_inventory, scan_openrlhf
from rlhf_ext.patches.retarget.models import map_attn_implementation
from rlhf_ext.patches.retarget.rendezvous import ENV_SYNC_TIMEOUT, WeightSyncRendezvousError
from rlhf_ext.patches.retarget.state import applied_backend, current_backend, retarget_backend
from rlhf_ext.patches.retarget.weight_sync import GlooBroadcaster

__all__ = [
    "ENV_SYNC_TIMEOUT",
    "MODULE_PATCHES",
    "TESTED_OPENRLHF_VERSIONS",
    "GlooBroadcaster",
    "InventoryReport",
    "RetargetError",
    "WeightSyncRendezvousError",
    "applied_backend",
    "applied_patches",
    "apply_openrlhf_retarget",
    "check_inventory",
    "current_backend",
    "map_attn_implementation",
    "openrlhf_version",
    "retarget_backend",
    "scan_openrlhf",
]
