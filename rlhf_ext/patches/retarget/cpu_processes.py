"""The CPU target's process layout: fewer interpreters per run, the same code paths.

A training run on the CPU target is a smoke test on a small box, where every extra Python
interpreter costs seconds of CPU just importing torch, vLLM and DeepSpeed (measured on a 2-core
EPYC, docs/benchmarks.md "CPU process layout"): the start-up of the run, not its steps, is what a
CPU run spends its time on. Two processes are dropped by default; both can be kept.

* **vLLM's worker process.** With ``tensor_parallel_size=1`` OpenRLHF asks vLLM for its ``uni``
  executor (the model runner inside the engine-core process), which is what runs on a GPU. vLLM's
  CPU platform replaces ``uni`` with its multiprocess executor while
  ``VLLM_ENABLE_V1_MULTIPROCESSING`` is 1 (``vllm/platforms/cpu.py``: so that it can bind OpenMP
  threads per worker), adding one interpreter per engine. The CPU target sets the variable to 0
  unless it is set: the engine core stays a separate process (``AsyncLLM`` always starts one), the
  model runner lives in it as on a GPU, and weight sync reaches it through the same
  ``collective_rpc``. ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` keeps vLLM's CPU layout.
* **Ray's dashboard.** A local cluster that ``ray.init`` starts runs the dashboard's head and ten
  module processes (~13 CPU-s at start-up: docs/benchmarks.md, "CPU process layout"). The CPU target's ``ray.init`` passes
  ``include_dashboard=False`` unless the caller chose; ``RLHF_EXT_RAY_DASHBOARD=1`` keeps it.
  Ray's job submission (``ray job submit``) runs on clusters started by ``ray start``, which this
  does not touch.

Nothing changes on NPU or CUDA.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

from rlhf_ext.npu.cpu_vllm_layout import ENV_VLLM_MULTIPROCESSING, prefer_single_process_vllm

ENV_RAY_DASHBOARD = "RLHF_EXT_RAY_DASHBOARD"


def dashboard_wanted(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_RAY_DASHBOARD, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV_RAY_DASHBOARD}={environ[ENV_RAY_DASHBOARD]!r}: expected 1 or 0")


def ray_init_kwargs(kwargs: dict, target: Optional[str], environ: Optional[MutableMapping[str, str]] = None) -> dict:
    """``ray.init``'s keyword arguments as the ``target`` device runs them: on ``cpu`` without the
    dashboard unless the caller or ``RLHF_EXT_RAY_DASHBOARD=1`` asked for it; elsewhere unchanged."""
    if target != "cpu" or "include_dashboard" in kwargs or kwargs.get("address") or dashboard_wanted(environ):
        return kwargs
    return {**kwargs, "include_dashboard": False}


__all__ = ["ENV_RAY_DASHBOARD", "ENV_VLLM_MULTIPROCESSING", "dashboard_wanted", "ray_init_kwargs",
           "prefer_single_process_vllm"]
