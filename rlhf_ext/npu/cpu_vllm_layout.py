"""vLLM on CPU with one interpreter fewer: the engine's model runner in the engine-core process.

vLLM's CPU platform replaces the single-process (``uni``) executor with its multiprocess one while
``VLLM_ENABLE_V1_MULTIPROCESSING`` is 1 (``vllm/platforms/cpu.py``, so that it can bind OpenMP
threads per worker), so every CPU engine costs one more interpreter importing torch and vLLM: about
10 CPU-s at start-up on a 2-core EPYC (docs/benchmarks.md, "CPU process layout"), more than a small evaluation's generation. With the variable
at 0 an offline ``vllm.LLM`` runs its engine core in the calling process, and OpenRLHF's
``AsyncLLMEngine`` keeps its engine-core process with the model runner inside it, as with tensor
parallel 1 on a GPU. Set the variable yourself to choose otherwise: a value already set is kept.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

ENV_VLLM_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def prefer_single_process_vllm(environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless it is set (call before vLLM builds an engine)."""
    environ = os.environ if environ is None else environ
    environ.setdefault(ENV_VLLM_MULTIPROCESSING, "0")


__all__ = ["ENV_VLLM_MULTIPROCESSING", "prefer_single_process_vllm"]
