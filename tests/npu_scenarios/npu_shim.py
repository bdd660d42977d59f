"""Scenario: backend detection and ``rlhf_ext.npu.transfer_to_npu`` against the stand-in torch_npu.

Run by tests/test_npu_shim.py with tests/npu_standin on PYTHONPATH. Order matters: detection and
the broken-install checks run before the shim is applied, the CUDA-call checks after.
"""

import os
import tempfile

from _scenario import Results

results = Results()

from rlhf_ext import npu  # noqa: E402
from rlhf_ext.seams import ledger  # noqa: E402
from rlhf_ext.seams.import_hooks import when_imported  # noqa: E402


def broken_install():
    """torch_npu present but its import fails, as it does when CANN's set_env.sh was not sourced."""
    os.environ["STANDIN_TORCH_NPU_BROKEN"] = "1"
    out = {}
    try:
        npu.reset_detection_cache()
        for label, call in (("detect", npu.detect_backend), ("transfer", npu.transfer_to_npu)):
            try:
                out[label] = call()
            except Exception as exc:
                out[label] = f"{type(exc).__name__}: {exc}"
        os.environ["RLHF_EXT_DEVICE"] = "cpu"
        out["detect_with_override"] = npu.detect_backend()
    finally:
        del os.environ["STANDIN_TORCH_NPU_BROKEN"]
        os.environ.pop("RLHF_EXT_DEVICE", None)
        npu.reset_detection_cache()
    return out


results.check("broken_install", broken_install)


def no_devices():
    """torch_npu imports but sees no NPU (e.g. a Ray worker given none): not an NPU process."""
    os.environ["STANDIN_NPU_COUNT"] = "0"
    try:
        npu.reset_detection_cache()
        return npu.detect_backend()
    finally:
        del os.environ["STANDIN_NPU_COUNT"]
        npu.reset_detection_cache()


results.check("no_devices", no_devices)


def detection():
    out = {"auto": npu.detect_backend()}
    for value in ("cpu", "cuda", "NPU "):
        os.environ["RLHF_EXT_DEVICE"] = value
        out[f"override_{value.strip().lower()}"] = npu.detect_backend()
    os.environ["RLHF_EXT_DEVICE"] = "tpu"
    try:
        npu.detect_backend()
        out["override_invalid"] = None
    except ValueError as exc:
        out["override_invalid"] = str(exc)
    del os.environ["RLHF_EXT_DEVICE"]
    out["names"] = {
        "device_name": npu.device_name(),
        "comm_backend": npu.comm_backend(),
        "ray_resource_name": npu.ray_resource_name(),
        "visible_devices_env": npu.visible_devices_env(),
        "ray_noset_env": npu.ray_noset_visible_devices_env(),
    }
    return out


results.check("detection", detection)

MESH_CALLS = []


def _mesh_recorder(device_mesh):
    def recorder(device_type, mesh_shape, **kwargs):
        MESH_CALLS.append(device_type)

    device_mesh.init_device_mesh = recorder


when_imported("torch.distributed.device_mesh", _mesh_recorder)
os.environ["HCCL_EXEC_TIMEOUT"] = "77"  # the user's own value must survive the defaults


def shim():
    npu.transfer_to_npu()
    import torch

    capability = torch.cuda.get_device_capability
    npu.transfer_to_npu()  # idempotent: nothing wrapped twice
    return {
        "cuda_is_available": torch.cuda.is_available(),
        "detect_after_shim": npu.detect_backend(),
        "device_module_is_npu": npu.torch_device_module() is torch.npu,
        "same_capability_wrapper": torch.cuda.get_device_capability is capability,
        "patches": ledger.replaced_names(),
        "env": {k: os.environ.get(k) for k in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "PYTORCH_NPU_ALLOC_CONF",
                                                "VLLM_WORKER_MULTIPROC_METHOD")},
    }  # fmt: skip


results.check("shim", shim)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch_npu import standin  # noqa: E402


def cuda_calls():
    standin.clear()
    torch.cuda.set_device(3)
    current = torch.cuda.current_device()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    stream = torch.cuda.current_stream()
    props = torch.cuda.get_device_properties(current)
    return {
        "current_device": current,
        "recorded": [c[0] for c in standin.calls()],
        "stream_has_npu_handle": hasattr(stream, "npu_stream"),
        "device_name": props.name,
        "capability": list(torch.cuda.get_device_capability()),
        "npu_capability_untouched": torch.npu.get_device_capability(),
    }


results.check("cuda_calls", cuda_calls)


def device_strings():
    standin.clear()
    created = torch.zeros(2, device="cuda")
    moved = torch.ones(2).to("cuda:1")
    by_index = torch.tensor([1.0], device=torch.cuda.current_device())
    module = torch.nn.Linear(2, 2).cuda()
    return {
        "rewritten_to": [c[1][0] for c in standin.calls("device_to_npu")],
        "module_moved": [c[0] for c in standin.calls("module.npu")],
        "placed_on": [t.device.type for t in (created, moved, by_index, module.weight)],
    }


results.check("device_strings", device_strings)


def process_group():
    standin.clear()
    path = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1)
    value = torch.tensor([2.0, 3.0])
    dist.all_reduce(value)
    return {
        "asked": [c[1][0] for c in standin.calls("init_process_group")],
        "backend": dist.get_backend(),
        "hccl_groups": len(standin.calls("hccl_process_group")),
        "all_reduce": value.tolist(),
    }


results.check("process_group", process_group)


def device_mesh():
    import torch.distributed.device_mesh as dm

    dm.init_device_mesh("cuda", (1,))
    dm.init_device_mesh("cpu", (1,))
    return list(MESH_CALLS)


results.check("device_mesh", device_mesh)
results.emit()
