"""Every CUDA-specific site of OpenRLHF 0.11.2 and what the NPU/CPU retarget does about it.

Checked against the installed OpenRLHF by :func:`rlhf_ext.patches.retarget.inventory.check_inventory`
(and by tests/test_retarget_inventory.py): a site that appears, disappears or moves to a line these
entries do not describe fails that check. ``torch.cuda.<name>(...)`` calls are accounted for as a
class: both device shims must answer for ``<name>`` (see :func:`covered_torch_cuda_names`).

The kinds of site (:data:`PATTERNS`) and the entry type (:class:`KnownSite`) live here with the
table; the scanner in :mod:`~rlhf_ext.patches.retarget.inventory` reads all three.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet

PATTERNS: Dict[str, "re.Pattern[str]"] = {
    "torch.cuda": re.compile(r"\btorch\.cuda\.([A-Za-z_]\w*)"),
    '"cuda"': re.compile(r"""["']cuda(?::[^"']*)?["']"""),
    "nccl": re.compile(r"nccl", re.IGNORECASE),
    '"GPU"': re.compile(r"""["']GPU["']"""),
    "num_gpus": re.compile(r"\bnum_gpus\b"),
    "get_gpu_ids": re.compile(r"\bget_gpu_ids\b"),
    "CUDA_VISIBLE_DEVICES": re.compile(r"\bCUDA_VISIBLE_DEVICES\b"),
    "flash_attn": re.compile(r"flash_attn"),
    "flash_attention_2": re.compile(r"flash_attention_2"),
    "torch.compile": re.compile(r"\btorch\.compile\b"),
}
"""What makes a line of OpenRLHF a CUDA-specific site: kind -> regular expression."""


@dataclass(frozen=True)
class KnownSite:
    """Lines of ``path`` matching ``kind`` whose code contains ``contains``: ``count`` of them,
    either handled by the retarget (``handled_by`` says where) or allowlisted (``reason`` says why)."""

    path: str
    kind: str
    contains: str
    count: int
    handled_by: str = ""
    reason: str = ""

    def __post_init__(self):
        if bool(self.handled_by) == bool(self.reason):
            raise ValueError(f"{self}: give exactly one of handled_by and reason")
        if self.kind not in PATTERNS:
            raise ValueError(f"{self}: unknown pattern kind {self.kind!r}")


_PLACEMENT = "ray_placement.placement_group: bundle GPU -> NPU (dropped on CPU)"
_ACTOR_OPTIONS = "ray_placement.actor_class_remote: num_gpus -> resources={'NPU': n} (0 on CPU) for openrlhf actors"
_ROLLOUT_ENV = "ray_placement.configure_rollout_device_env: visible devices and VLLM_RAY_* for the target backend"
_ATTN = "models.map_attn_implementation via Actor.__init__ / get_llm_for_sequence_regression"
_RING = "strategy.setup_ring_attn refuses ring attention (ring_flash_attn is CUDA-only) on NPU/CPU"
_SHIM_TO = (
    "device shim: Tensor.to / tensor factories send CUDA devices to the target (torch_npu on NPU, cpu_shim on CPU)"
)
_SYNC = "weight_sync.retarget_sync_args: sync backend nccl -> hccl/gloo before ActorPPOTrainer reads it"

KNOWN_SITES = (
    # --- CLI defaults: the flag value reaches the model loaders, which map it.
    KnownSite("cli/serve_rm.py", "flash_attention_2", "flash_attention_2", 2, handled_by=_ATTN),
    KnownSite("cli/train_dpo.py", "flash_attention_2", "flash_attention_2", 3, handled_by=_ATTN),
    KnownSite("cli/train_rm.py", "flash_attention_2", "flash_attention_2", 3, handled_by=_ATTN),
    KnownSite("cli/train_sft.py", "flash_attention_2", "flash_attention_2", 3, handled_by=_ATTN),
    KnownSite("cli/train_ppo_ray.py", "flash_attention_2", "flash_attention_2", 3, handled_by=_ATTN),
    KnownSite("cli/train_ppo_ray.py", "nccl", "NCCL_DEBUG", 1,
              reason="passes NCCL_DEBUG to Ray workers; only NCCL reads it, so it is inert on NPU and CPU"),
    KnownSite("cli/train_ppo_ray.py", "nccl", "--vllm.sync_backend", 1, handled_by=_SYNC),
    KnownSite("cli/train_ppo_ray.py", '"GPU"', "bundles", 2, handled_by=_PLACEMENT),
    # --- models
    KnownSite("models/actor.py", "flash_attention_2", "attn_implementation", 1, handled_by=_ATTN),
    KnownSite("models/model.py", "flash_attention_2", "attn_implementation", 1, handled_by=_ATTN),
    KnownSite("models/ring_attn_utils.py", "flash_attn", "from flash_attn.", 2,
              handled_by="rlhf_ext.patches.flash_attn_fallback serves pure-torch bert_padding / all_gather"),
    KnownSite("models/ring_attn_utils.py", "flash_attn", "flash_attn", 7, handled_by=_RING),
    KnownSite("models/utils.py", "flash_attn", "flash_attn.ops.triton.cross_entropy", 1,
              reason="inside try/except ImportError: without flash-attn kernels OpenRLHF uses torch log-softmax"),
    KnownSite("models/utils.py", "torch.compile", "@torch.compile", 1,
              handled_by="models.unwrap_compiled: compute_entropy runs eagerly on NPU/CPU"),
    # --- experience buffer
    KnownSite("trainer/ppo_utils/replay_buffer.py", '"cuda"', "target_device", 1, handled_by=_SHIM_TO),
    # --- Ray launcher: actor groups
    KnownSite("trainer/ray/launcher.py", "get_gpu_ids", "LOCAL_RANK", 1,
              handled_by="ray_placement.RayWithBackendDeviceIds: launcher's ray.get_gpu_ids() returns NPU ids"),
    KnownSite("trainer/ray/launcher.py", "num_gpus", "num_gpus", 6, handled_by=_ACTOR_OPTIONS),
    KnownSite("trainer/ray/launcher.py", '"GPU"', "bundles", 1, handled_by=_PLACEMENT),
    # --- policy actor and its trainer
    KnownSite("trainer/ray/ppo_actor.py", "nccl", 'backend = getattr(self.strategy.args.vllm', 1, handled_by=_SYNC),
    KnownSite("trainer/ray/ppo_actor.py", "nccl", "use_cuda_ipc", 1,
              handled_by=_SYNC + "; CUDA IPC is then off since the backend is no longer nccl"),
    KnownSite("trainer/ray/ppo_actor.py", "nccl", "NCCL_CUMEM_ENABLE", 1,
              reason="sets NCCL_CUMEM_ENABLE, an NCCL-only variable: inert on NPU and CPU"),
    KnownSite("trainer/ray/ppo_actor.py", "nccl", '== "nccl"', 1,
              reason="guards the NCCL_CUMEM_ENABLE line above (runs before the sync backend is retargeted): inert"),
    KnownSite("trainer/ray/ppo_actor.py", '"cuda"', "moving_average", 2, handled_by=_SHIM_TO),
    KnownSite("trainer/ray/ppo_actor.py", "num_gpus", "@ray.remote(num_gpus=1)", 1, handled_by=_ACTOR_OPTIONS),
    KnownSite("trainer/ray/ppo_critic.py", "num_gpus", "@ray.remote(num_gpus=1)", 1, handled_by=_ACTOR_OPTIONS),
    # --- vLLM engines
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", 'kwargs.pop("num_gpus")', 1, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", "def _configure_device_env", 1, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", "VLLM_RAY_PER_WORKER_GPUS", 1, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", '"num_gpus": 0.2', 1, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", "num_gpus = ", 2, handled_by=_ACTOR_OPTIONS),
    KnownSite("trainer/ray/vllm_engine.py", "num_gpus", "=num_gpus,", 2, handled_by=_ACTOR_OPTIONS),
    KnownSite("trainer/ray/vllm_engine.py", "CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", 2, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", "get_gpu_ids", "get_gpu_ids", 1, handled_by=_ROLLOUT_ENV),
    KnownSite("trainer/ray/vllm_engine.py", '"GPU"', "bundles", 1, handled_by=_PLACEMENT),
    KnownSite("trainer/ray/vllm_worker_wrap.py", "nccl", 'backend="nccl"', 1,
              reason="default of an argument the trainer always passes, already retargeted by " + _SYNC),
    KnownSite("trainer/ray/vllm_worker_wrap.py", '"cuda"', 'device="cuda"', 1, handled_by=_SHIM_TO),
    # --- DeepSpeed strategy and helpers
    KnownSite("utils/deepspeed/deepspeed.py", '"cuda"', '"cuda", (dp_size', 1,
              handled_by="strategy.init_device_mesh: the mesh is built for the target device type"),
    KnownSite("utils/deepspeed/deepspeed.py", "flash_attn", "flash_attn", 4, handled_by=_RING),
    KnownSite("utils/distributed_util.py", "nccl", "nccl", 3,
              handled_by="weight_sync.stateless_init_process_group: HCCL (vllm-ascend PyHcclCommunicator) / gloo"),
)  # fmt: skip


def covered_torch_cuda_names() -> FrozenSet[str]:
    """``torch.cuda`` names that both torch_npu's mapping and rlhf_ext's CPU shim answer for."""
    from rlhf_ext.npu.cpu_shim import CPU_ROUTED_CUDA_FUNCTIONS
    from rlhf_ext.npu.transfer import TORCH_NPU_MAPPED_CUDA_FUNCTIONS

    return frozenset(CPU_ROUTED_CUDA_FUNCTIONS) & frozenset(TORCH_NPU_MAPPED_CUDA_FUNCTIONS)


__all__ = ["KNOWN_SITES", "covered_torch_cuda_names"]
