"""Scenario: the OpenRLHF retarget with RLHF_EXT_DEVICE=cpu, on the real OpenRLHF classes.

No stand-in here: the CPU target runs for real -- the CPU device shim, OpenRLHF's DeepSpeed
strategy setting up gloo and a CPU device mesh, OpenRLHF's Actor loading a tiny model with the
attention implementation mapped, packed and unpacked forward passes, and a weight broadcast from
the trainer side to OpenRLHF's vLLM WorkerWrap over gloo. Run by tests/test_retarget_cpu_target.py.
"""

import faulthandler
import os
import tempfile
import threading
from types import SimpleNamespace

from _scenario import Results, free_port, install_flash_attn_fallback, ppo_args

results = Results()
faulthandler.dump_traceback_later(float(os.environ.get("SCENARIO_WATCHDOG_S", "280")), exit=True)

from rlhf_ext.patches.retarget import apply_openrlhf_retarget  # noqa: E402

results["backend"] = apply_openrlhf_retarget()


def plugin_after_retarget():
    """The opposite order to the NPU scenario: retarget first, then the algorithm plugin."""
    from rlhf_ext.patches import activate

    return activate(["rlhf_ext"], role="process")


results.check("plugin", plugin_after_retarget)

import torch  # noqa: E402  (the retarget's torch hook applies the CPU shim here)


def shim():
    path = os.path.join(tempfile.mkdtemp(), "t.pt")
    torch.save({"w": torch.arange(3.0)}, path)
    loaded = torch.load(path, map_location="cuda")
    module = torch.nn.Linear(2, 2).to("cuda:0")
    target = torch.device(f"cuda:{torch.cuda.current_device()}")  # OpenRLHF's replay-buffer target
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.current_stream().synchronize()
    return {
        "is_available": torch.cuda.is_available(),
        "current_device": torch.cuda.current_device(),
        "capability": list(torch.cuda.get_device_capability()),
        "properties_name": torch.cuda.get_device_properties(0).name,
        "devices": [
            torch.zeros(2, device="cuda").device.type,
            torch.tensor(3, device=0).device.type,
            torch.ones(2).to("cuda:0").device.type,
            torch.ones(2).to(target).device.type,
            torch.ones(2).to(torch.cuda.current_device()).device.type,
            torch.ones(2).cuda().device.type,
            torch.ones(2).new_zeros(3, device="cuda").device.type,
            loaded["w"].device.type,
            module.weight.device.type,
        ],
        "dtype_to_kept": str(torch.ones(2).to(torch.float64).dtype),
    }


results.check("shim", shim)

install_flash_attn_fallback()
import openrlhf.models.actor as actor_module  # noqa: E402
import openrlhf.trainer.ray.ppo_actor as ppo_actor  # noqa: E402
import openrlhf.utils.deepspeed.deepspeed as ds_module  # noqa: E402
import torch.distributed as dist  # noqa: E402
from openrlhf.models import Actor  # noqa: E402
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap  # noqa: E402


def _init_like_deepspeed_on_cuda(timeout=None, **kwargs):
    # DeepSpeed on a CUDA machine asks torch for NCCL. Its CPU accelerator would instead JIT-compile a
    # shared-memory comm op the first time (about 90 s, cached afterwards): too slow for a unit test,
    # and not what this scenario checks.
    dist.init_process_group(backend="nccl", timeout=timeout)


_strategies = []  # the strategy set up below, used again once the tiny model exists


def strategy_setup():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    ds_module.deepspeed.init_distributed = _init_like_deepspeed_on_cuda
    strategy = ds_module.DeepspeedStrategy(zero_stage=0, args=ppo_args())
    strategy.setup_distributed()  # OpenRLHF's own code: set_device, init_distributed, init_device_mesh("cuda")
    _strategies.append(strategy)
    extra = dist.new_group(ranks=[0], backend="nccl")
    return {
        "world_size": strategy.world_size,
        "backend": dist.get_backend(),
        "new_group_backend": dist.get_backend(extra),
        "mesh_device_type": strategy.ds_device_mesh.device_type,
        "mesh_dims": list(strategy.ds_device_mesh.mesh_dim_names),
    }


results.check("strategy_setup", strategy_setup)


def tiny_model_dir():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    path = tempfile.mkdtemp(prefix="rlhf_ext_tiny_qwen2_")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


MODEL_DIR = tiny_model_dir()


def load_actor(packing):
    actor = Actor(MODEL_DIR, packing_samples=packing)  # attn_implementation left at OpenRLHF's flash_attention_2
    actor.model.float().eval()
    return actor


def attention_and_packing():
    packed_actor = load_actor(True)
    padded_actor = load_actor(False)
    torch.manual_seed(1)
    # Two samples, left padding as OpenRLHF's rollouts produce: lengths 7 and 4 in a width of 8.
    sequences = torch.randint(1, 96, (2, 8))
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1]])
    sequences = sequences * attention_mask
    action_mask = torch.ones(2, 3)
    with torch.no_grad():
        packed = packed_actor(sequences, action_mask, attention_mask)
        padded = padded_actor(sequences, action_mask, attention_mask)
        # Each sample alone, no padding at all: the reference both must match.
        alone = []
        for row in range(2):
            keep = attention_mask[row].bool()
            alone.append(padded_actor(sequences[row][keep][None], torch.ones(1, 3), torch.ones(1, int(keep.sum())))[0])
        alone = torch.stack(alone)
        # Negative control: the same packed row with positions 0..n-1 straight through (no restart
        # between the samples), so the second sample attends to the first.
        flat = sequences[attention_mask.bool()][None]
        logits = packed_actor.model(flat, position_ids=torch.arange(flat.shape[1])[None]).logits
        leaked = torch.log_softmax(logits[0, -4:-1], dim=-1).gather(-1, flat[0, -3:, None]).squeeze(-1)
    config = packed_actor.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]
    expected_inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return {
        # A buffer transformers rebuilds after loading on the meta device: wrong if the shim hid the
        # factories from torch's device-context mode.
        "inv_freq_error": float((packed_actor.model.model.rotary_emb.inv_freq - expected_inv_freq).abs().max()),
        "attn_packed": packed_actor.model.config._attn_implementation,
        "attn_padded": padded_actor.model.config._attn_implementation,
        "packed_vs_alone": float((packed - alone).abs().max()),
        "padded_vs_alone": float((padded - alone).abs().max()),
        "leaky_vs_alone": float((leaked - alone[1]).abs().max()),
    }


results.check("attention_and_packing", attention_and_packing)


def train_dtype():
    """What OpenRLHF's own model loader, DeepSpeed configs and rollout engine arguments get for
    ``--ds.param_dtype bf16`` under each ``RLHF_EXT_CPU_DTYPE`` (read at call time)."""
    from openrlhf.utils.utils import convert_to_torch_dtype
    from rlhf_ext.npu.cpu_dtype import ENV_CPU_DTYPE, native_bf16
    from rlhf_ext.patches.retarget.vllm_memory import rollout_engine_kwargs

    strategy = ds_module.DeepspeedStrategy(zero_stage=0, args=ppo_args())
    seen = {"native_bf16": native_bf16()}
    for setting in ("fp32", "asked", "auto"):
        os.environ[ENV_CPU_DTYPE] = setting
        try:
            actor = Actor(MODEL_DIR, param_dtype="bf16")
            train_config, eval_config = strategy.get_ds_train_config(), strategy.get_ds_eval_config()
            engine = rollout_engine_kwargs({"model": MODEL_DIR, "max_model_len": 64, "dtype": "bfloat16"}, "cpu")
            seen[setting] = {
                "convert": str(convert_to_torch_dtype("bf16")),
                "actor_params": sorted({str(p.dtype) for p in actor.model.parameters()}),
                "ds_train_bf16": train_config["bf16"]["enabled"], "ds_eval_bf16": eval_config["bf16"]["enabled"],
                "ds_fp16": train_config["fp16"]["enabled"] or eval_config["fp16"]["enabled"],
                "vllm_dtype": engine["dtype"],
            }  # fmt: skip
        finally:
            os.environ.pop(ENV_CPU_DTYPE, None)
    os.environ[ENV_CPU_DTYPE] = "bogus"
    try:
        convert_to_torch_dtype("bf16")
        seen["bogus"] = "accepted"
    except ValueError as exc:
        seen["bogus"] = str(exc)
    finally:
        os.environ.pop(ENV_CPU_DTYPE, None)
    return seen


results.check("train_dtype", train_dtype)


def adam_optimizer():
    """The optimizer DeepSpeed really builds for OpenRLHF's Adam config on the CPU target (torch's AdamW:
    rlhf_ext.patches.retarget.cpu_optimizer), and one step of it changing the weights."""
    from torch.optim import AdamW

    os.environ["RLHF_EXT_CPU_DTYPE"] = "fp32"
    try:
        strategy = _strategies[0]
        actor = Actor(MODEL_DIR, param_dtype="bf16")
        cfg = {"optim": "adam", "adam": {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
               "lr_scheduler": "constant", "lr_warmup_ratio": 0.0, "min_lr_ratio": 0.1, "max_norm": 1.0,
               "scheduler_steps": 1}  # fmt: skip
        actor, optimizer, _ = strategy.prepare((actor, cfg))
        engine = actor.model  # OpenRLHF's Actor now holds the DeepSpeed engine
        inner = getattr(optimizer, "optimizer", optimizer)
        before = [p.detach().clone() for p in engine.module.parameters()]
        logits = engine(input_ids=torch.randint(0, 96, (2, 8))).logits
        engine.backward(logits.float().pow(2).mean())
        grads = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
        expected_norm = float(torch.stack(grads).norm())  # before clipping changes the gradients
        engine.step()
        changed = sum(not torch.equal(b, p.detach()) for b, p in zip(before, engine.module.parameters()))
        return {"optimizer": type(inner).__name__, "is_torch_adamw": isinstance(inner, AdamW),
                "changed": changed, "params": len(before), "bf16": engine.bfloat16_enabled(),
                "grad_norm": engine.get_global_grad_norm(), "expected_grad_norm": expected_norm}
    finally:
        os.environ.pop("RLHF_EXT_CPU_DTYPE", None)


results.check("adam_optimizer", adam_optimizer)


def entropy_eager():
    logits = torch.randn(2, 5, 7)
    expected = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    fn = actor_module.compute_entropy
    return {
        "compiled": hasattr(fn, "_torchdynamo_orig_callable"),
        "max_error": float((fn(logits) - expected).abs().max()),
    }


results.check("entropy_eager", entropy_eager)


class _FakeVllmWorker(WorkerWrap):
    def __init__(self):
        self.device = torch.device("cpu")
        self.model_config = SimpleNamespace(dtype=torch.float32)
        self.loaded = []
        self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load))

    def _load(self, weights):
        self.loaded.extend((name, tensor.clone()) for name, tensor in weights)


def weight_sync():
    # Both ends run as threads of this one process here (in a real job they are separate processes).
    # vLLM's gloo group setup silences fd 1 around a C call with dup/dup2; two threads doing that at
    # once can leave fd 1 on /dev/null, which would swallow this scenario's result line. Keep a copy.
    saved_stdout = os.dup(1)
    try:
        return _weight_sync()
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)


def _weight_sync():
    port = free_port()
    sent = torch.linspace(-1, 1, 10).reshape(2, 5)
    worker = _FakeVllmWorker()
    errors = []
    ready = threading.Barrier(2, timeout=60)

    def vllm_side():
        try:
            worker.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo", use_ray=False)
            ready.wait()
            worker.update_weight("w", torch.float32, (2, 5))
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))
            ready.abort()

    thread = threading.Thread(target=vllm_side)
    thread.start()
    group = ppo_actor.stateless_init_process_group("127.0.0.1", port, 0, 2, torch.cuda.current_device())
    ready.wait()
    group.broadcast(sent, src=0, stream=torch.cuda.current_stream())
    thread.join(timeout=120)
    return {
        "errors": errors,
        "group_type": type(group).__name__,
        "received_equal": bool(worker.loaded and torch.equal(worker.loaded[0][1], sent)),
    }


results.check("weight_sync", weight_sync)


def actor_trainer():
    args = ppo_args(sync_backend="nccl", colocate_all=True)
    strategy = ds_module.DeepspeedStrategy(zero_stage=0, args=args)
    trainer = ppo_actor.ActorPPOTrainer(
        strategy, actor=None, ema_model=None, actor_optim=None, actor_scheduler=None, vllm_engines=None
    )
    return {"sync_backend": args.vllm.sync_backend, "use_cuda_ipc": trainer.use_cuda_ipc}


results.check("actor_trainer", actor_trainer)


def coexistence():
    from rlhf_ext.patches.openrlhf import applied
    from rlhf_ext.patches.retarget import weight_sync

    init = ppo_actor.ActorPPOTrainer.__init__
    layers = []
    while init is not None and len(layers) < 5:
        layers.append(getattr(init, "__rlhf_ext_patch__", None) or f"{init.__module__}.{init.__qualname__}")
        if init is weight_sync.actor_ppo_trainer_init:
            init = weight_sync.ledger.original(ppo_actor.ActorPPOTrainer, "__init__")
        else:
            init = getattr(init, "__wrapped__", None)
    return {"layers": layers, "plugin_patches": applied().get("openrlhf.trainer.ray.ppo_actor", [])}


results.check("coexistence", coexistence)


def ring_guard():
    try:
        ds_module.DeepspeedStrategy.setup_ring_attn(SimpleNamespace(ring_attn_size=4), None)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


results.check("ring_guard", ring_guard)
results.emit()
