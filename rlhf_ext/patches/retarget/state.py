"""Which backend the OpenRLHF retarget targets in this process.

The retarget acts on ``"npu"`` and ``"cpu"``; ``"cuda"`` means "leave OpenRLHF as written". The CPU
target is never chosen by detection, only by ``RLHF_EXT_DEVICE=cpu``: a Ray driver often runs on a
head node without accelerators, and retargeting it to CPU would silently move the whole job off
the cluster's GPUs.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Optional

from rlhf_ext.npu.backend import BACKENDS, backend_override, detect_backend

APPLY_LOCK = threading.RLock()  # held while the retarget is applied (apply.py)
_applied: Optional[str] = None


def retarget_backend() -> str:
    """``RLHF_EXT_DEVICE`` if set; else ``"npu"`` when an NPU is detected; else ``"cuda"`` (no change).

    Cheap on machines without torch_npu: it does not import torch there.
    """
    override = backend_override()
    if override is not None:
        return override
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None:
        return "npu" if detect_backend() == "npu" else "cuda"
    return "cuda"


def applied_backend() -> Optional[str]:
    """The backend :func:`~rlhf_ext.patches.retarget.apply_openrlhf_retarget` applied here, or None."""
    return _applied


def current_backend() -> str:
    """The applied backend, or the one :func:`retarget_backend` would pick (for code that runs in a
    process where the retarget was not applied, e.g. a function Ray shipped by reference)."""
    return _applied or retarget_backend()


def set_applied(backend: Optional[str]) -> None:
    """Record the backend the retarget applied in this process (:mod:`.apply`, under :data:`APPLY_LOCK`)."""
    global _applied
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    _applied = backend


__all__ = ["APPLY_LOCK", "applied_backend", "current_backend", "retarget_backend", "set_applied"]
