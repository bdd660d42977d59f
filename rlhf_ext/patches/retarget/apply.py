"""Apply the OpenRLHF device retarget in this process: the one entry point the plugin calls.

Nothing is imported here up front. The device shim is attached to ``import torch`` and each
OpenRLHF/Ray patch to the import of the module it patches (:mod:`rlhf_ext.seams.import_hooks`), so
calling :func:`apply_openrlhf_retarget` at interpreter start-up costs almost nothing, and a module
is patched before any other code can use it. Modules imported before the call are patched at once.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

from rlhf_ext.npu.backend import BACKENDS, ENV_DEVICE
from rlhf_ext.seams.import_hooks import when_imported
from rlhf_ext.patches.retarget import (cpu_processes, float32_training, models, ray_placement, strategy, vllm_cpu_weights,
                                       weight_sync)
from rlhf_ext.patches.retarget.guard import RetargetError, warn_if_untested_version
from rlhf_ext.patches.retarget.state import APPLY_LOCK, applied_backend, retarget_backend, set_applied

logger = logging.getLogger("rlhf_ext.retarget")

Patch = Callable[[object, str], None]

MODULE_PATCHES: Tuple[Tuple[str, Tuple[Patch, ...]], ...] = (
    ("ray.actor", (ray_placement.patch_ray_actor_class,)),
    ("ray.util.placement_group", (ray_placement.patch_ray_placement_group,)),
    ("openrlhf.utils.distributed_util", (weight_sync.patch_distributed_util,)),
    ("openrlhf.utils.utils", (float32_training.patch_utils,)),
    ("openrlhf.models.utils", (models.patch_compiled_utils,)),
    ("openrlhf.models.model", (models.patch_model,)),
    ("openrlhf.models.actor", (models.patch_actor,)),
    ("openrlhf.models", (models.patch_models_package,)),
    ("openrlhf.utils.deepspeed.deepspeed", (strategy.patch_deepspeed_strategy, float32_training.patch_ds_configs)),
    ("openrlhf.trainer.ray.launcher", (ray_placement.patch_launcher, ray_placement.patch_placement_group_importer,
                                       models.patch_regression_importer)),
    ("openrlhf.trainer.ray.ppo_critic", (models.patch_regression_importer,)),
    ("openrlhf.trainer.ray.ppo_actor", (weight_sync.patch_ppo_actor,)),
    ("openrlhf.trainer.ray.vllm_engine", (ray_placement.patch_vllm_engine,)),
    ("openrlhf.cli.train_ppo_ray", (ray_placement.patch_placement_group_importer,)),
    ("vllm.model_executor.layers.utils", (vllm_cpu_weights.patch_cpu_gemm_dispatch,)),
    ("deepspeed.runtime.engine", (float32_training.patch_ds_engine,)),
)  # fmt: skip
"""Module -> patches applied when it is imported, for the NPU and CPU targets."""

_applied_patches: Dict[str, List[str]] = {}


def _run_patches(module_name: str, patches: Tuple[Patch, ...], backend: str, module) -> None:
    for patch in patches:
        patch(module, backend)
        _applied_patches.setdefault(module_name, []).append(patch.__name__)


def _apply_shim(backend: str, _torch_module) -> None:
    from rlhf_ext.npu.transfer import apply_device_shim

    apply_device_shim(backend)


def apply_openrlhf_retarget(backend: Optional[str] = None) -> str:
    """Retarget OpenRLHF to ``backend`` in this process; idempotent; returns the backend.

    ``backend`` defaults to :func:`~rlhf_ext.patches.retarget.state.retarget_backend`:
    ``RLHF_EXT_DEVICE`` if set, else ``"npu"`` on an Ascend machine, else ``"cuda"``, for which
    nothing is changed. For ``"npu"`` and ``"cpu"`` it

    * routes ``torch.cuda``, CUDA devices and NCCL to the target once torch is imported
      (:func:`rlhf_ext.npu.transfer_to_npu` / :func:`rlhf_ext.npu.transfer_to_cpu`);
    * patches Ray and OpenRLHF as each of their modules is imported (:data:`MODULE_PATCHES`);
    * exports ``RLHF_EXT_DEVICE`` so processes started from this one (vLLM workers, a local Ray
      cluster started by ``ray.init``) make the same choice;
    * on ``"cpu"``, exports the process-layout defaults of :mod:`.cpu_processes` (vLLM's model runner
      in its engine-core process), unless set.

    Raises :class:`RetargetError` when asked for a different backend than an earlier call applied,
    or when an OpenRLHF/Ray target of a patch is missing or changed.
    """
    with APPLY_LOCK:
        target = backend or retarget_backend()
        if target not in BACKENDS:
            raise ValueError(f"unknown backend {target!r}; expected one of: {', '.join(BACKENDS)}")
        already = applied_backend()
        if already is not None:
            if already != target:
                raise RetargetError(
                    f"OpenRLHF was already retargeted to {already!r} in this process; cannot switch to {target!r}"
                )
            return target
        set_applied(target)
        if target == "cuda":
            return target
        os.environ[ENV_DEVICE] = target
        if target == "cpu":
            cpu_processes.prefer_single_process_vllm()
        warn_if_untested_version()
        when_imported("torch", functools.partial(_apply_shim, target))
        for module_name, patches in MODULE_PATCHES:
            when_imported(module_name, functools.partial(_run_patches, module_name, patches, target))
        logger.info("rlhf_ext: OpenRLHF retargeted to %s", target)
        return target


def applied_patches() -> Dict[str, List[str]]:
    """Module name -> names of the patches already run in this process (diagnostics, tests)."""
    return {name: list(patches) for name, patches in _applied_patches.items()}


__all__ = ["MODULE_PATCHES", "apply_openrlhf_retarget", "applied_patches"]
