"""rlhf_ext.npu pieces that patch nothing global, tested in-process: names per backend, Ray
resource translation, HCCL defaults, the patch ledger, post-import hooks, attention mapping."""

import importlib
import importlib.util
import sys
from types import SimpleNamespace

import pytest

from rlhf_ext import npu
from rlhf_ext.seams import import_hooks, ledger
from rlhf_ext.npu.hccl_env import HCCL_DEFAULTS
from rlhf_ext.patches.retarget import RetargetError, map_attn_implementation, retarget_backend
from rlhf_ext.patches.retarget.weight_sync import GlooBroadcaster, retarget_sync_args


@pytest.fixture
def no_device_env(monkeypatch):
    monkeypatch.delenv("RLHF_EXT_DEVICE", raising=False)
    monkeypatch.delenv("RLHF_EXT_ATTN_IMPLEMENTATION", raising=False)


@pytest.mark.parametrize(
    "backend, names",
    [
        (
            "npu",
            ("npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"),
        ),
        ("cuda", ("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")),
        ("cpu", ("cpu", "gloo", None, None, None)),
    ],
)
def test_names_per_backend(backend, names):
    got = (
        npu.device_name(backend),
        npu.comm_backend(backend),
        npu.ray_resource_name(backend),
        npu.visible_devices_env(backend),
        npu.ray_noset_visible_devices_env(backend),
    )
    assert got == names


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        npu.comm_backend("tpu")


def test_override_parsing(monkeypatch):
    monkeypatch.setenv("RLHF_EXT_DEVICE", "  Cpu ")
    assert npu.backend_override() == "cpu"
    assert npu.detect_backend() == "cpu"
    monkeypatch.setenv("RLHF_EXT_DEVICE", "")
    assert npu.backend_override() is None
    monkeypatch.setenv("RLHF_EXT_DEVICE", "gpu")
    with pytest.raises(ValueError, match=r"RLHF_EXT_DEVICE='gpu'.*npu, cuda, cpu"):
        npu.detect_backend()


def test_detection_without_torch_npu(no_device_env):
    import torch

    assert importlib.util.find_spec("torch_npu") is None  # this machine: no Ascend stack
    npu.reset_detection_cache()
    assert npu.detect_backend() == ("cuda" if torch.cuda.is_available() else "cpu")
    assert npu.torch_device_module("cpu") is torch.cpu


def test_missing_torch_npu_error_names_install_and_set_env():
    with pytest.raises(npu.BackendUnavailableError) as excinfo:
        npu.import_torch_npu()
    message = str(excinfo.value)
    assert "torch_npu, which is not installed" in message
    assert "set_env.sh" in message
    with pytest.raises(npu.BackendUnavailableError):
        npu.transfer_to_npu()


def test_retarget_backend_never_picks_cpu_by_itself(no_device_env, monkeypatch):
    # A Ray driver on a host without accelerators must not move the job to CPU.
    assert retarget_backend() == "cuda"
    monkeypatch.setenv("RLHF_EXT_DEVICE", "cpu")
    assert retarget_backend() == "cpu"


def test_bundle_translation():
    bundle = {"GPU": 1, "CPU": 1}
    assert npu.retarget_bundle(bundle, "npu") == {"CPU": 1, "NPU": 1}
    assert npu.retarget_bundle(bundle, "cpu") == {"CPU": 1}
    assert npu.retarget_bundle(bundle, "cuda") == bundle
    assert npu.retarget_bundle({"GPU": 2}, "cpu") == {"CPU": 2}  # never an empty bundle
    assert npu.retarget_bundle({"GPU": 1, "NPU": 1}, "npu") == {"NPU": 2}
    assert npu.retarget_bundle({"CPU": 4}, "npu") == {"CPU": 4}
    assert bundle == {"GPU": 1, "CPU": 1}  # input untouched


def test_actor_option_translation():
    opts = {"num_cpus": 0.2, "num_gpus": 0.2, "resources": {"custom": 1}}
    assert npu.retarget_actor_options(opts, "npu") == {
        "num_cpus": 0.2,
        "num_gpus": 0,
        "resources": {"custom": 1, "NPU": 0.2},
    }
    assert npu.retarget_actor_options(opts, "cpu") == {"num_cpus": 0.2, "num_gpus": 0, "resources": {"custom": 1}}
    assert npu.retarget_actor_options(opts, "cuda") == opts
    assert npu.retarget_actor_options({"num_cpus": 1}, "npu") == {"num_cpus": 1}
    assert npu.ray_actor_resources(2, "npu") == {"num_gpus": 0, "resources": {"NPU": 2}}
    assert npu.ray_actor_resources(1, "cuda") == {"num_gpus": 1}
    assert npu.ray_actor_resources(0, "npu") == {"num_gpus": 0}
    with pytest.raises(ValueError, match=">= 0"):
        npu.ray_actor_resources(-1, "npu")
    assert npu.local_device_ids("cpu") == []


def test_hccl_defaults_fill_only_missing(monkeypatch):
    monkeypatch.delenv("RLHF_EXT_HCCL_DEFAULTS", raising=False)
    env = {"HCCL_EXEC_TIMEOUT": "42"}
    applied = npu.apply_hccl_defaults(env)
    assert env["HCCL_EXEC_TIMEOUT"] == "42"
    assert "HCCL_EXEC_TIMEOUT" not in applied
    assert env["HCCL_CONNECT_TIMEOUT"] == HCCL_DEFAULTS["HCCL_CONNECT_TIMEOUT"] == "1800"
    assert set(applied) == set(HCCL_DEFAULTS) - {"HCCL_EXEC_TIMEOUT"}
    monkeypatch.setenv("RLHF_EXT_HCCL_DEFAULTS", "0")
    fresh = {}
    assert npu.apply_hccl_defaults(fresh) == {} and fresh == {}


def test_patch_ledger_replace_original_restore():
    target = SimpleNamespace(f=lambda: "orig")
    original = target.f
    try:
        assert ledger.replace(target, "f", lambda: "new") is original
        assert target.f() == "new"
        assert ledger.original(target, "f") is original
        # Applying again keeps the first original: a wrapper never wraps a wrapper.
        assert ledger.replace(target, "f", lambda: "newer") is original
        wrapper = ledger.wrap(target, "f", lambda fn: lambda: "wrapped " + fn())
        assert wrapper is target.f and target.f() == "newer"
        ledger.replace(target, "added", 1)
        assert ledger.is_replaced(target, "added")
    finally:
        undone = [ledger.restore(target, "f"), ledger.restore(target, "added"), ledger.restore(target, "f")]
    assert undone == [True, True, False]
    assert target.f is original
    assert not hasattr(target, "added")


def test_when_imported_runs_after_module_code(tmp_path, monkeypatch):
    (tmp_path / "rlhf_ext_hook_probe.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    import_hooks.when_imported("rlhf_ext_hook_probe", lambda module: seen.append(module.VALUE + 1))
    assert "rlhf_ext_hook_probe" in import_hooks.pending_modules()
    try:
        module = importlib.import_module("rlhf_ext_hook_probe")
        assert seen == [42]
        assert type(module.__loader__).__name__ == "SourceFileLoader"  # real loader handed back
        import_hooks.when_imported("rlhf_ext_hook_probe", lambda module: seen.append("again"))
        assert seen == [42, "again"]  # already imported: runs at once
    finally:
        sys.modules.pop("rlhf_ext_hook_probe", None)
    assert "rlhf_ext_hook_probe" not in import_hooks.pending_modules()


@pytest.mark.parametrize(
    "backend, asked, expected",
    [
        ("cuda", "flash_attention_2", "flash_attention_2"),
        ("cpu", "flash_attention_2", "sdpa"),
        ("cpu", "flash_attention_3", "sdpa"),
        ("cpu", "kernels-community/vllm-flash-attn3", "sdpa"),
        ("cpu", "eager", "eager"),
        ("npu", "sdpa", "sdpa"),
        ("npu", "flash_attention_3", "sdpa"),
        ("npu", "flash_attention_2", "flash_attention_2"),  # transformers' Ascend FA2 integration exists
        ("cpu", None, None),
    ],
)
def test_attention_mapping(no_device_env, backend, asked, expected):
    assert map_attn_implementation(asked, backend) == expected


def test_attention_override(monkeypatch):
    monkeypatch.setenv("RLHF_EXT_ATTN_IMPLEMENTATION", "eager")
    assert map_attn_implementation("flash_attention_2", "npu") == "eager"
    assert map_attn_implementation("flash_attention_2", "cuda") == "flash_attention_2"


def test_sync_args_on_cpu():
    args = SimpleNamespace(vllm=SimpleNamespace(sync_backend="nccl", sync_with_ray=True))
    retarget_sync_args(args, "cpu")  # Ray's collectives do have GLOO: allowed on CPU
    assert args.vllm.sync_backend == "gloo"
    retarget_sync_args(SimpleNamespace(), "npu")  # args without a vllm section: nothing to do
    with pytest.raises(RetargetError, match="sync_with_ray"):
        retarget_sync_args(SimpleNamespace(vllm=SimpleNamespace(sync_backend="nccl", sync_with_ray=True)), "npu")


def test_gloo_broadcaster_rejects_foreign_source_rank():
    import torch

    broadcaster = GlooBroadcaster(group=None, rank=0, world_size=2)
    with pytest.raises(ValueError, match="source rank 2 is outside this group of 2"):
        broadcaster.broadcast(torch.zeros(2), src=2)
