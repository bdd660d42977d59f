"""Scenario: the OpenRLHF retarget applied for NPU, driven through the stand-in torch_npu / vllm-ascend.

Run by tests/test_retarget_npu.py with tests/npu_standin on PYTHONPATH and no RLHF_EXT_DEVICE,
so the backend comes from detection. Every check works on the real installed OpenRLHF classes.
"""

import os
import threading
from types import SimpleNamespace

from _scenario import Results, free_port, init_single_process_group, install_flash_attn_fallback, ppo_args

results = Results()

from rlhf_ext.seams.import_hooks import when_imported  # noqa: E402
from rlhf_ext.patches.retarget import apply_openrlhf_retarget  # noqa: E402

# A recorder in place of torch's init_device_mesh, installed as soon as that module loads and so
# before the device shim wraps it: it shows which device type finally reaches torch.
MESH_CALLS = []


def _install_mesh_recorder(device_mesh):
    def recorder(device_type, mesh_shape, **kwargs):
        MESH_CALLS.append(device_type)
        return ("mesh", device_type, tuple(mesh_shape))

    device_mesh.init_device_mesh = recorder


when_imported("torch.distributed.device_mesh", _install_mesh_recorder)


def plugin_first():
    """Production order: the rlhf_ext plugin activates (algorithm patches), then the retarget."""
    from rlhf_ext.patches import activate

    return activate(["rlhf_ext"], role="process")


results.check("plugin", plugin_first)
results.check("backend", lambda: {"applied": apply_openrlhf_retarget(), "env": os.environ.get("RLHF_EXT_DEVICE")})

import torch  # noqa: E402  (the retarget's torch hook applies transfer_to_npu here)
from torch_npu import standin  # noqa: E402


def shim():
    return {
        "transfer_imported": len(standin.calls("transfer_to_npu_imported")),
        "cuda_is_available": torch.cuda.is_available(),
        "capability": list(torch.cuda.get_device_capability()),
        "hccl_connect_timeout": os.environ.get("HCCL_CONNECT_TIMEOUT"),
    }


results.check("shim", shim)

install_flash_attn_fallback()
import sys  # noqa: E402

import openrlhf.trainer.ray.launcher as launcher  # noqa: E402
import openrlhf.trainer.ray.ppo_actor as ppo_actor  # noqa: E402
import openrlhf.trainer.ray.ppo_critic as ppo_critic  # noqa: E402
import openrlhf.trainer.ray.vllm_engine as vllm_engine  # noqa: E402
import openrlhf.utils.deepspeed.deepspeed as ds_module  # noqa: E402
import openrlhf.utils.distributed_util as distributed_util  # noqa: E402
import ray  # noqa: E402
import ray.actor  # noqa: E402

pg_module = sys.modules["ray.util.placement_group"]
from rlhf_ext.patches.retarget import applied_patches, models, ray_placement, strategy, weight_sync  # noqa: E402


def patched():
    import openrlhf.models as models_pkg
    import openrlhf.models.actor as actor_module
    import openrlhf.models.utils as utils_module

    modified = vllm_engine.RolloutRayActor.__ray_metadata__.modified_class
    body = modified.__ray_actor_class__
    return {
        "placement_group": [
            m.placement_group is ray_placement.placement_group for m in (pg_module, launcher, vllm_engine)
        ],
        "ray_util_placement_group": ray.util.placement_group is ray_placement.placement_group,
        "actor_remote": ray.actor.ActorClass._remote is ray_placement.actor_class_remote,
        "launcher_ray": type(launcher.ray).__name__,
        # Ray calls the copy in its wrapper class, not the user class's method: both must be replaced
        "rollout_env": all(cls._configure_device_env is ray_placement.configure_rollout_device_env
                           for cls in (modified, body)),
        "rollout_backend": body._rlhf_ext_backend,
        "sync_group": [
            m.stateless_init_process_group is weight_sync.stateless_init_process_group
            for m in (distributed_util, ppo_actor)
        ],
        "regression_loader": [
            m.get_llm_for_sequence_regression is models.get_llm_for_sequence_regression
            for m in (models_pkg, launcher, ppo_critic)
        ],
        "entropy_compiled": [
            hasattr(m.compute_entropy, "_torchdynamo_orig_callable") for m in (utils_module, actor_module)
        ],
        "modules": sorted(applied_patches()),
    }


results.check("patched", patched)


def attention():
    out = {
        "flash_attention_2": models.map_attn_implementation("flash_attention_2"),
        "flash_attention_3": models.map_attn_implementation("flash_attention_3"),
        "sdpa": models.map_attn_implementation("sdpa"),
    }
    os.environ["RLHF_EXT_ATTN_IMPLEMENTATION"] = "eager"
    out["forced"] = models.map_attn_implementation("flash_attention_2")
    del os.environ["RLHF_EXT_ATTN_IMPLEMENTATION"]
    return out


results.check("attention", attention)


def device_mesh():
    # The DeepSpeed strategy's own name for the function, as setup_distributed calls it.
    ds_module.init_device_mesh("cuda", (1, 1, 1), mesh_dim_names=("dp", "sp", "tp"))
    import torch.distributed.device_mesh as dm

    dm.init_device_mesh("cuda", (1,))  # torch's name, wrapped by the device shim
    return list(MESH_CALLS)


results.check("device_mesh", device_mesh)


def ring_guard():
    fake = SimpleNamespace(ring_attn_size=2)
    try:
        ds_module.DeepspeedStrategy.setup_ring_attn(fake, None)
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None}


results.check("ring_guard", ring_guard)


def sync_args():
    out = {}
    for label, kwargs in {"default": {}, "explicit_gloo": {"sync_backend": "gloo"}}.items():
        args = ppo_args(**kwargs)
        weight_sync.retarget_sync_args(args, "npu")
        out[label] = args.vllm.sync_backend
    try:
        weight_sync.retarget_sync_args(ppo_args(sync_with_ray=True), "npu")
        out["sync_with_ray"] = None
    except Exception as exc:
        out["sync_with_ray"] = f"{type(exc).__name__}: {exc}"
    return out


results.check("sync_args", sync_args)


def actor_trainer():
    backend = init_single_process_group("nccl")  # what DeepSpeed's init asks for on CUDA
    args = ppo_args(sync_backend="nccl", colocate_all=True)
    strategy_obj = ds_module.DeepspeedStrategy(zero_stage=0, args=args)
    standin.clear()
    trainer = ppo_actor.ActorPPOTrainer(
        strategy_obj, actor=None, ema_model=None, actor_optim=None, actor_scheduler=None, vllm_engines=None
    )
    npu_calls = sorted({c[0] for c in standin.calls()})
    standin.clear()
    moved = torch.ones(2).to(trainer.replay_buffer.target_device)  # what Experience.to_device does
    return {
        "process_group_backend": backend,
        "sync_backend": args.vllm.sync_backend,
        "use_cuda_ipc": trainer.use_cuda_ipc,
        "replay_target": str(trainer.replay_buffer.target_device),
        "replay_move": [c[1][0] for c in standin.calls("device_to_npu")] + [moved.device.type],
        "npu_calls": npu_calls,
    }


results.check("actor_trainer", actor_trainer)


class _FakeVllmWorker(__import__("openrlhf.trainer.ray.vllm_worker_wrap", fromlist=["WorkerWrap"]).WorkerWrap):
    """The attributes OpenRLHF's WorkerWrap reads from the vLLM worker it is mixed into."""

    def __init__(self, device):
        self.device = device
        self.model_config = SimpleNamespace(dtype=torch.float32)
        self.loaded = []
        self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))

    def _load(self, weights):
        self.loaded.extend((name, tensor.clone()) for name, tensor in weights)


def weight_sync_roundtrip():
    torch.cuda.set_device(0)
    standin.clear()
    port = free_port()
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5
    worker = _FakeVllmWorker("npu:1")
    errors = []
    ready = threading.Barrier(2, timeout=60)

    def vllm_side():
        try:
            worker.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="hccl", use_ray=False)
            ready.wait()
            worker.update_weight("layer.weight", torch.float32, (3, 4))
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))
            ready.abort()

    thread = threading.Thread(target=vllm_side)
    thread.start()
    # Trainer side, exactly as ActorPPOTrainer._init_vllm_sync_group / _broadcast_param call it.
    group = ppo_actor.stateless_init_process_group("127.0.0.1", port, 0, 2, torch.cuda.current_device())
    ready.wait()
    group.broadcast(sent, src=0, stream=torch.cuda.current_stream())
    thread.join(timeout=120)
    received = worker.loaded[0][1] if worker.loaded else None
    return {
        "errors": errors,
        "communicators": [c[1] for c in standin.calls("PyHcclCommunicator")],
        "broadcasts": [c[1] for c in standin.calls("hccl_broadcast")],
        "received_equal": bool(received is not None and torch.equal(received, sent)),
        "loaded_names": [name for name, _ in worker.loaded],
    }


results.check("weight_sync", weight_sync_roundtrip)


def hccl_library_missing():
    os.environ["STANDIN_HCCL_LIBRARY"] = "0"
    port = free_port()
    outcome = {}

    def side(rank):
        try:
            weight_sync.stateless_init_process_group("127.0.0.1", port, rank, 2, rank)
            outcome[rank] = None
        except Exception as exc:
            outcome[rank] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=side, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    del os.environ["STANDIN_HCCL_LIBRARY"]
    return outcome


results.check("hccl_library_missing", hccl_library_missing)


def coexistence():
    """The plugin's ActorPPOTrainer.__init__ patch and the retarget's wrap each other, both checked."""
    from rlhf_ext.patches.openrlhf import applied

    chain = []
    fn = ppo_actor.ActorPPOTrainer.__init__
    while fn is not None and len(chain) < 5:
        chain.append(getattr(fn, "__rlhf_ext_patch__", None) or f"{fn.__module__}.{fn.__qualname__}")
        fn = getattr(fn, "__wrapped__", None) or (
            weight_sync.ledger.original(ppo_actor.ActorPPOTrainer, "__init__")
            if fn is weight_sync.actor_ppo_trainer_init
            else None
        )
    return {"chain": chain, "plugin_patches": applied().get("openrlhf.trainer.ray.ppo_actor", [])}


results.check("coexistence", coexistence)


def strategy_init_mesh_name():
    return ds_module.init_device_mesh is strategy.init_device_mesh


results.check("strategy_mesh_patched", strategy_init_mesh_name)
results.emit()
