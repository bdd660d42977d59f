"""DeepSpeed -> vLLM weight sync on NPU (HCCL) and CPU (gloo).

OpenRLHF 0.11.2 broadcasts each parameter from DeepSpeed rank 0 to every vLLM worker through a
group made by ``openrlhf.utils.distributed_util.stateless_init_process_group``: vLLM's
``StatelessProcessGroup`` plus ``PyNcclCommunicator`` (NCCL only), or, when ``--vllm.sync_backend``
is ``nccl`` and all models are colocated, CUDA IPC handles. Both are CUDA-only. Here:

* the sync backend ``nccl`` becomes the target's (``hccl`` / ``gloo``) before ``ActorPPOTrainer``
  reads it, which also turns CUDA IPC off (OpenRLHF enables IPC only for ``nccl``);
* on NPU the group's communicator is vllm-ascend's ``PyHcclCommunicator(group, device)``
  (``vllm_ascend/distributed/device_communicators/pyhccl.py``), whose
  ``broadcast(tensor, src, stream)`` matches what OpenRLHF calls. It quietly turns itself into a
  no-op when it cannot load the HCCL library; that would leave vLLM generating with stale weights,
  so it is checked here and reported as an error;
* on CPU a gloo process group from vLLM's ``stateless_init_torch_distributed_process_group`` is
  wrapped in :class:`GlooBroadcaster`, which offers the same ``broadcast``;
* on both, the group's rendezvous is bounded and watches the engines (:mod:`.rendezvous`), so an
  engine that died at start ends the run with its error instead of a silent wait;
* ``--vllm.sync_with_ray`` goes through ``ray.util.collective``, which knows only NCCL and GLOO:
  fine on CPU, an explicit error on NPU.
"""

from __future__ import annotations

import inspect
from datetime import timedelta

from rlhf_ext.seams import ledger
from rlhf_ext.npu.backend import CANN_SET_ENV_HINT, comm_backend
from rlhf_ext.patches.retarget.guard import RetargetError, require
from rlhf_ext.patches.retarget.rendezvous import peers_checked_by, ray_actors_alive_check, rendezvous, sync_timeout
from rlhf_ext.patches.retarget.state import current_backend


class GlooBroadcaster:
    """``broadcast(tensor, src, stream=None)`` over a gloo process group, like ``PyNcclCommunicator``'s.

    ``src`` is a rank of this group. The group is not registered with ``torch.distributed``, so the
    call goes to the process group object directly (``torch.distributed.broadcast`` would translate
    ranks through the default group, which this group is not part of).
    """

    def __init__(self, group, rank: int, world_size: int):
        self.group = group
        self.rank = rank
        self.world_size = world_size

    def broadcast(self, tensor, src: int, stream=None) -> None:
        import torch.distributed as dist

        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast source rank {src} is outside this group of {self.world_size}")
        buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        options = dist.BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        self.group.broadcast([buffer], options).wait()
        if buffer is not tensor:
            tensor.copy_(buffer)


def _hccl_group(master_address, master_port, rank, world_size, device):
    from vllm.distributed.utils import StatelessProcessGroup

    try:
        from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator
    except ImportError as exc:
        raise RetargetError(
            "weight sync from DeepSpeed to vLLM on Ascend needs vllm-ascend (PyHcclCommunicator): "
            f"`from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator` failed ({exc}). "
            "Install the vllm-ascend release that matches your vLLM (docs/npu.md)."
        ) from exc
    store = rendezvous(master_address, master_port, rank, world_size)
    group = StatelessProcessGroup(rank=rank, world_size=world_size, store=store)
    communicator = PyHcclCommunicator(group, device=device)
    if world_size > 1 and (getattr(communicator, "disabled", False) or not getattr(communicator, "available", True)):
        raise RetargetError(
            "vllm-ascend's PyHcclCommunicator could not load the HCCL library, so it would skip every broadcast "
            f"and vLLM would keep generating with the initial weights; {CANN_SET_ENV_HINT}"
        )
    return communicator


def _gloo_group(master_address, master_port, rank, world_size):
    from torch.distributed import PrefixStore
    from vllm.distributed.utils import init_gloo_process_group

    timeout = sync_timeout()
    store = rendezvous(master_address, master_port, rank, world_size, timeout)
    # The prefix keeps gloo's keys apart from the join markers in the same store.
    group = init_gloo_process_group(PrefixStore(f"tcp://{master_address}:{master_port}", store), rank, world_size,
                                    timedelta(seconds=timeout))
    return GlooBroadcaster(group, rank, world_size)


def stateless_init_process_group(master_address, master_port, rank, world_size, device):
    """``openrlhf.utils.distributed_util.stateless_init_process_group`` for the target backend."""
    backend = current_backend()
    if backend == "npu":
        return _hccl_group(master_address, master_port, rank, world_size, device)
    if backend == "cpu":
        return _gloo_group(master_address, master_port, rank, world_size)
    import openrlhf.utils.distributed_util as distributed_util

    return ledger.original(distributed_util, "stateless_init_process_group")(
        master_address, master_port, rank, world_size, device
    )


def retarget_sync_args(args, backend: str) -> None:
    """Point ``args.vllm.sync_backend`` at ``backend``'s collective library (``nccl`` only; an explicit
    other choice is kept), and refuse ``--vllm.sync_with_ray`` where Ray's collectives cannot run."""
    vllm_args = getattr(args, "vllm", None)
    if vllm_args is None:
        return
    if getattr(vllm_args, "sync_backend", "nccl") == "nccl":
        vllm_args.sync_backend = comm_backend(backend)
    if backend == "npu" and getattr(vllm_args, "sync_with_ray", False):
        raise RetargetError(
            "--vllm.sync_with_ray uses ray.util.collective, which supports only NCCL and GLOO, not HCCL: "
            "drop the flag on Ascend (weights then go over HCCL with vllm-ascend's PyHcclCommunicator)"
        )


def actor_ppo_trainer_init(self, strategy, *args, **kwargs):
    """``ActorPPOTrainer.__init__`` that retargets the sync backend before OpenRLHF reads it."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    retarget_sync_args(strategy.args, current_backend())
    init = ledger.original(ActorPPOTrainer, "__init__")
    engines = inspect.signature(init).bind_partial(self, strategy, *args, **kwargs).arguments.get("vllm_engines")
    # The sync group is formed inside __init__: let its rendezvous notice an engine that died.
    with peers_checked_by(ray_actors_alive_check(engines) if engines else None):
        return init(self, strategy, *args, **kwargs)


def patch_distributed_util(module, backend: str) -> None:
    require(module, "stateless_init_process_group", "vLLM weight-sync group",
            params=["master_address", "master_port", "rank", "world_size", "device"])  # fmt: skip
    ledger.replace_function(module, "stateless_init_process_group", stateless_init_process_group)


def patch_ppo_actor(module, backend: str) -> None:
    import openrlhf.utils.distributed_util as distributed_util

    current = require(module, "stateless_init_process_group", "vLLM weight-sync group")
    if current is ledger.original(distributed_util, "stateless_init_process_group"):
        ledger.replace_function(module, "stateless_init_process_group", stateless_init_process_group)
    require(module, "ActorPPOTrainer.__init__", "vLLM sync backend", params=["strategy", "vllm_engines"])
    require(module, "ActorPPOTrainer._init_vllm_sync_group", "vLLM sync backend", params=["backend"])
    ledger.replace_function(module.ActorPPOTrainer, "__init__", actor_ppo_trainer_init)


__all__ = [
    "GlooBroadcaster",
    "actor_ppo_trainer_init",
    "patch_distributed_util",
    "patch_ppo_actor",
    "retarget_sync_args",
    "stateless_init_process_group",
]
