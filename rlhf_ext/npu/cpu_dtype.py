"""Which floating-point type a CPU job should train and roll out in, from what the CPU does natively.

Machines of the same kind range from AVX2-only CPUs to AMX ones. bf16 arithmetic is native on CPUs
with AVX-512-BF16 or AMX and emulated on the others, where one bf16 training step of the tiny task's
model costs about 8x the float32 step (``benchmarks/cpu_train_dtype.py``, docs/benchmarks.md). A CPU
smoke run is there to exercise the recipe's code paths, not its precision, so on such a CPU the
CPU target trains (and rolls out) in float32 unless told otherwise.

``RLHF_EXT_CPU_DTYPE`` decides:

* ``auto`` (default): keep the recipe's dtype where the CPU has native bf16; otherwise float32;
* ``asked``: always the recipe's dtype (``--ds.param_dtype``), even where bf16 is emulated;
* ``fp32``: always float32.

Only the CPU target reads this; on NPU and CUDA the recipe's dtype is never touched.
"""

from __future__ import annotations

import os
import platform
from typing import Optional

ENV_CPU_DTYPE = "RLHF_EXT_CPU_DTYPE"
CPU_DTYPE_CHOICES = ("auto", "asked", "fp32")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (x86: AVX-512-BF16 or AMX tiles), as torch probes it.

    torch's own probes are used (not ``/proc/cpuinfo``) because they are what torch's and vLLM's
    kernel choice follows, and what ``scripts/avx2_only`` overrides to reproduce an AVX2-only CPU.
    Other architectures answer False: no bf16 path there has been measured to be fast.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe() for probe in probes if callable(probe))


def cpu_dtype_setting(environ: Optional[dict] = None) -> str:
    """The validated ``RLHF_EXT_CPU_DTYPE`` (``auto`` when unset)."""
    value = (environ if environ is not None else os.environ).get(ENV_CPU_DTYPE, "").strip().lower() or "auto"
    if value not in CPU_DTYPE_CHOICES:
        raise ValueError(f"{ENV_CPU_DTYPE}={value!r} is not one of {', '.join(CPU_DTYPE_CHOICES)}")
    return value


def cpu_train_dtype(asked: str, environ: Optional[dict] = None, native: Optional[bool] = None) -> str:
    """The dtype (``"bf16"``, ``"fp16"`` or ``"fp32"``) a CPU job trains in when the recipe asked ``asked``.

    ``native`` (default: :func:`native_bf16`) says whether the CPU computes bf16 natively; fp16 is
    emulated on every CPU torch supports here, so ``auto`` replaces it as it replaces bf16 there.
    """
    setting = cpu_dtype_setting(environ)
    if setting == "asked" or asked == "fp32":
        return asked
    if setting == "fp32":
        return "fp32"
    if native is None:
        native = native_bf16()
    return asked if (asked == "bf16" and native) else "fp32"


__all__ = ["CPU_DTYPE_CHOICES", "ENV_CPU_DTYPE", "cpu_dtype_setting", "cpu_train_dtype", "native_bf16"]
