"""The CPU target's dtype decision applied to OpenRLHF, DeepSpeed and vLLM: float32 where the CPU would
only emulate bf16.

The decision itself (``RLHF_EXT_CPU_DTYPE``, the CPU's native bf16) has one owner,
:mod:`rlhf_ext.npu.cpu_dtype`; this module only carries its answer into the host's arguments.

OpenRLHF 0.11.2 accepts ``--ds.param_dtype bf16|fp16`` only, and reads it in two places: the model is
loaded in ``convert_to_torch_dtype(param_dtype)`` (``openrlhf/utils/utils.py``, imported inside the
model builders at call time), and the DeepSpeed configs enable their bf16/fp16 mode from it
(``get_train_ds_config`` / ``get_eval_ds_config``, imported by name into
``openrlhf/utils/deepspeed/deepspeed.py``). The rollout engine's dtype is a literal ``"bfloat16"`` in
``create_vllm_engines``; the CPU target's ``RolloutRayActor.__init__`` wrapper
(:mod:`.vllm_memory`) rewrites it with :func:`rollout_dtype`.

When :func:`rlhf_ext.npu.cpu_dtype.cpu_train_dtype` answers ``fp32`` (an AVX2-only CPU, or
``RLHF_EXT_CPU_DTYPE=fp32``), these three answer float32, so the actor, the reference model, the
optimizer and vLLM all run in float32 and the weight sync moves float32 tensors. Checkpoints are then
saved in float32. Nothing changes on NPU or CUDA, nor on a CPU with native bf16 unless asked.
"""

from __future__ import annotations

import inspect
import logging

from rlhf_ext.seams import ledger
from rlhf_ext.npu.cpu_dtype import ENV_CPU_DTYPE, cpu_train_dtype
from rlhf_ext.patches.retarget.cpu_optimizer import with_torch_adam
from rlhf_ext.patches.retarget.guard import RetargetError, require

logger = logging.getLogger("rlhf_ext.retarget")

_VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_PARAM_DTYPES = {v: k for k, v in _VLLM_DTYPES.items()}
_announced = False


def _announce(asked: str, chosen: str) -> None:
    global _announced
    if chosen != asked and not _announced:
        _announced = True
        logger.warning(
            "rlhf_ext: this CPU has no native bf16 (no AVX-512-BF16 or AMX): training and rollouts run in float32 "
            "instead of %s (%s=asked keeps %s)", asked, ENV_CPU_DTYPE, asked)  # fmt: skip


def train_dtype(asked: str) -> str:
    """``asked`` (an OpenRLHF ``param_dtype``) as the CPU target trains it, announced once per process."""
    chosen = cpu_train_dtype(asked)
    _announce(asked, chosen)
    return chosen


def convert_to_torch_dtype(param_dtype: str):
    """``openrlhf.utils.utils.convert_to_torch_dtype`` answering float32 where the CPU target trains in it."""
    import torch
    import openrlhf.utils.utils as utils_module

    if train_dtype(param_dtype) == "fp32":
        return torch.float32
    return ledger.original(utils_module, "convert_to_torch_dtype")(param_dtype)


def _with_cpu_dtype(name: str, args: tuple, kwargs: dict):
    import openrlhf.utils.deepspeed.deepspeed as strategy_module

    original = ledger.original(strategy_module, name)
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    bound.arguments["param_dtype"] = train_dtype(bound.arguments["param_dtype"])
    return original(*bound.args, **bound.kwargs)


def get_train_ds_config(*args, **kwargs):
    """``get_train_ds_config`` with bf16/fp16 off where the CPU target trains in float32, and torch's
    AdamW for an Adam optimizer (:mod:`.cpu_optimizer`: nothing to compile)."""
    return with_torch_adam(_with_cpu_dtype("get_train_ds_config", args, kwargs))


def get_eval_ds_config(*args, **kwargs):
    """``get_eval_ds_config`` with bf16/fp16 off where the CPU target runs the model in float32."""
    return _with_cpu_dtype("get_eval_ds_config", args, kwargs)


def clip_fp32_gradients(self):
    """``DeepSpeedEngine.clip_fp32_gradients`` keeping the norm it computes as the engine's grad norm.

    DeepSpeed's float32 path (no bf16/fp16, no ZeRO: what the CPU target trains in on a CPU without
    native bf16) clips with ``clip_grad_norm_`` and drops its return value; the engine's
    ``get_global_grad_norm()`` is then ``None``, which OpenRLHF logs as ``actor_grad_norm`` 0 at every
    step, a silent wrong number. The bf16 optimizer and ZeRO record it themselves.
    """
    from deepspeed.runtime.utils import clip_grad_norm_

    norm = clip_grad_norm_(parameters=self.module.parameters(), max_norm=self.gradient_clipping(), mpu=self.mpu)
    self._global_grad_norm = float(norm)
    return norm


def rollout_dtype(dtype):
    """The vLLM ``dtype`` engine argument on the CPU target: float32 where training runs in float32."""
    asked = _PARAM_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if asked is None or asked == "fp32":
        return dtype
    return _VLLM_DTYPES[train_dtype(asked)]


def patch_utils(module, backend: str) -> None:
    if backend != "cpu":
        return
    require(module, "convert_to_torch_dtype", "CPU training dtype", params=["param_dtype"])
    ledger.replace_function(module, "convert_to_torch_dtype", convert_to_torch_dtype)


def patch_ds_configs(module, backend: str) -> None:
    """``openrlhf.utils.deepspeed.deepspeed``: its by-name imports of the two DeepSpeed config builders."""
    if backend != "cpu":
        return
    for name, replacement in (("get_train_ds_config", get_train_ds_config), ("get_eval_ds_config", get_eval_ds_config)):
        require(module, name, "CPU training dtype", params=["param_dtype"])
        ledger.replace_function(module, name, replacement)


def patch_ds_engine(module, backend: str) -> None:
    """``deepspeed.runtime.engine``: the float32 path's gradient norm recorded (:func:`clip_fp32_gradients`)."""
    if backend != "cpu":
        return
    import deepspeed.runtime.utils as ds_utils

    method = require(module, "DeepSpeedEngine.clip_fp32_gradients", "CPU float32 grad norm")
    if list(inspect.signature(method).parameters) != ["self"]:
        raise RetargetError(f"rlhf_ext CPU float32 grad norm: DeepSpeedEngine.clip_fp32_gradients"
                            f"{inspect.signature(method)} is not the (self) it was written for")
    require(ds_utils, "clip_grad_norm_", "CPU float32 grad norm", params=["parameters", "max_norm", "mpu"])
    ledger.replace_function(module.DeepSpeedEngine, "clip_fp32_gradients", clip_fp32_gradients)


__all__ = [
    "clip_fp32_gradients",
    "convert_to_torch_dtype",
    "get_eval_ds_config",
    "get_train_ds_config",
    "patch_ds_configs",
    "patch_ds_engine",
    "patch_utils",
    "rollout_dtype",
    "train_dtype",
]
