"""The engine of a run, started and stopped: one vLLM ``LLM`` in this process, or ``--dp`` engines
as Ray actors (:mod:`.generation` drives them), and the devices it runs on (recorded in
``config.json``)."""

from __future__ import annotations

import os

from .generation import EngineSettings, RayDataParallel, engine_max_model_len, make_llm, platform_name
from .options import RunOptions


def local_devices(o: RunOptions) -> dict:
    """The devices of an engine in this process."""
    return {"platform": platform_name(), "engines": [{"node": os.uname().nodename}], "tp": o.tp, "dp": 1}


def open_engine(o: RunOptions):
    """``(engine, its context length, the devices it runs on)``: one vLLM ``LLM``, or Ray actors with ``--dp``."""
    settings = EngineSettings(model=o.model, tensor_parallel_size=o.tp, seed=o.seed,
                              gpu_memory_utilization=o.gpu_memory_utilization, kv_cache=o.kv_cache,
                              enforce_eager=o.enforce_eager, max_model_len=o.max_model_len, dtype=o.dtype, trust_remote_code=o.trust_remote_code)
    if o.dp > 1:
        backend = RayDataParallel(settings, o.dp, address=o.ray_address)
        devices = {"platform": backend.infos[0]["platform"], "engines": backend.infos, "tp": o.tp, "dp": o.dp}
        return backend, backend.max_model_len, devices
    llm = make_llm(settings)
    devices = local_devices(o)
    try:
        import torch

        if torch.cuda.is_available():
            devices["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return llm, engine_max_model_len(llm), devices


def close_engine(engine) -> None:
    if isinstance(engine, RayDataParallel):
        engine.close()
        return
    shutdown = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if shutdown is not None and hasattr(shutdown, "shutdown"):
        try:
            shutdown.shutdown()
        except Exception:
            pass
