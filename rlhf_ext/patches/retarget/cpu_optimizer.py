"""The CPU target's Adam: torch's ``AdamW`` instead of DeepSpeed's compiled ``FusedAdam``.

OpenRLHF 0.11.2 hands DeepSpeed an ``{"type": "AdamW"}`` optimizer config
(``DeepspeedStrategy._ds_init_train_model``), and DeepSpeed builds ``FusedAdam`` for it. On the CPU
accelerator that is a C++ extension JIT-compiled with ``-O3`` on first use (DeepSpeed's
``FusedAdamBuilder``: about 140 s of CPU on a 2-core EPYC, more on a slower machine, and a rebuild
whenever the compiler flags it derives from the CPU change). DeepSpeed's own optimizer parameter
``torch_adam: true`` (``DeepSpeedEngine.get_optimizer_configuration``) selects ``torch.optim.AdamW``
instead: the same update rule (Loshchilov & Hutter 2019, decoupled weight decay), the same config
keys, nothing to compile. The CPU target sets it unless the config already chose, and leaves
optimizer offload (DeepSpeedCPUAdam) and non-Adam optimizers (Muon) alone. Nothing changes on NPU or
CUDA.
"""

from __future__ import annotations

import copy

TORCH_ADAM = "torch_adam"
_ADAM_TYPES = ("adam", "adamw")


def with_torch_adam(ds_config: dict) -> dict:
    """``ds_config`` (a DeepSpeed config dict) with torch's Adam chosen for an Adam/AdamW optimizer."""
    optimizer = ds_config.get("optimizer")
    if not isinstance(optimizer, dict) or str(optimizer.get("type", "")).lower() not in _ADAM_TYPES:
        return ds_config
    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    if offload.get("device") not in (None, "none"):
        return ds_config  # ZeRO-Offload runs DeepSpeedCPUAdam, whatever the optimizer config says
    params = optimizer.get("params") or {}
    if TORCH_ADAM in params:
        return ds_config
    out = copy.deepcopy(ds_config)
    out["optimizer"].setdefault("params", {})[TORCH_ADAM] = True
    return out


__all__ = ["TORCH_ADAM", "with_torch_adam"]
