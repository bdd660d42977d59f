"""LoRA RL with vLLM rollouts: the weight sync sends the merged policy under the base model's names.

OpenRLHF 0.11.2's ``ActorPPOTrainer.broadcast_to_vllm`` (``openrlhf/trainer/ray/ppo_actor.py``)
sends ``named_parameters()`` of the trained model. With ``--ds.lora.rank`` that model is PEFT's
wrapper, so vLLM is handed ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight``
and ``...lora_A.default.weight`` and stops the run at the first sync ("There is no module or
parameter named 'base_model' in Qwen2ForCausalLM").

Here, when the actor holds LoRA layers, the sync sends, under the base model's own names
(``model.layers.0.self_attn.q_proj.weight``), what training can move:

* for a LoRA layer's base weight (linear or embedding), ``W + sum_a scaling_a * B_a @ A_a`` over its active, unmerged
  adapters, computed as PEFT's safe merge does (``peft/tuners/lora/layer.py``, ``Linear.merge``
  with ``safe_merge=True``: a copy of ``W`` plus ``get_delta_weight``, which applies PEFT's own
  ``scaling`` — ``alpha / r``, or ``alpha / sqrt(r)`` with rslora — and no dropout, cast back to
  ``W``'s dtype); the module's parameters are never written to;
* ``lora_bias`` adapters add ``scaling * lora_B.bias`` to the base bias, as the same merge does;
* every other trainable parameter as it is (tied parameters once, as ``named_parameters()`` does).

The frozen rest is not sent again: vLLM loaded it from the same checkpoint as the trainer, and
OpenRLHF's sleep (level 1) keeps it; this is OpenRLHF's own rule for a VLM's frozen vision tower.

Under ZeRO-3 a LoRA layer's base weight and adapter matrices are gathered together (DeepSpeed's
``GatheredParameters``, as upstream's ``_gather_params_ctx`` does per parameter). The tensors go
over the same channels as upstream's: the sync group's ``broadcast`` (NCCL, or the CPU/NPU
retarget's gloo/HCCL group, :mod:`rlhf_ext.patches.retarget.weight_sync`), Ray collectives with
``--vllm.sync_with_ray``, or CUDA IPC handles (``update_weight_cuda_ipc``) when OpenRLHF chose IPC.
Checkpoints are untouched: OpenRLHF still saves the adapter.

Why merged weights and not vLLM's LoRA support (``enable_lora`` + a ``LoRARequest`` per request):
both are exact, but a merged sync costs at most what a full fine-tuning sync costs and leaves generation
as fast as without LoRA, while vLLM's LoRA path adds the adapter's matmuls to every generated
token for the whole run, reserves LoRA slots in the engine, limits the modules and models that
can carry adapters, and would need every rollout request rewritten to name the adapter. Measured
on the smoke shapes: ``benchmarks/lora_weight_sync.py`` (docs/benchmarks.md, "LoRA weight sync").

Refused at start-up (:func:`finalize`, one line each): ``--ds.load_in_4bit`` (the trainer's base
is the NF4-quantised weight, vLLM's is the checkpoint's), DeepSpeed AutoTP
(``--ds.tensor_parallel_size > 1`` splits the adapter matrices themselves) and LoRA on a tied
embedding / output layer (vLLM would apply the merged embedding to the output layer too, PEFT
does not). A LoRA variant with its own merge rule (DoRA) is refused at the first sync.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

# No torch / peft at module level: the CLI imports this module at interpreter start-up.


class LoraSyncError(RuntimeError):
    """The LoRA adapter cannot be turned into the exact weights vLLM samples from."""


class SyncEntry:
    """One tensor of the base model, as vLLM's ``load_weights`` names it.

    ``params``: the trainer's parameters to gather (ZeRO-3) before ``materialize()`` is called;
    ``materialize()``: the tensor to send; ``fresh``: whether that is a new tensor (a merge) rather
    than a parameter's own storage; ``changes``: whether training can move it (a LoRA merge, or a
    trainable parameter).
    """

    __slots__ = ("name", "params", "materialize", "fresh", "changes")

    def __init__(self, name: str, params: Tuple[object, ...], materialize: Callable[[], object], fresh: bool,
                 changes: bool):
        self.name, self.params, self.materialize, self.fresh, self.changes = name, params, materialize, fresh, changes

    def __repr__(self) -> str:
        return f"SyncEntry({self.name!r}, merged={self.fresh})"


def _lora_layer_class():
    from peft.tuners.lora import LoraLayer

    return LoraLayer


def has_lora_layers(model) -> bool:
    """Whether ``model`` (the actor's module, a PEFT model under LoRA) holds PEFT LoRA layers."""
    try:
        lora_layer = _lora_layer_class()
    except ImportError:  # no PEFT installed: OpenRLHF could not have built a LoRA actor
        return False
    return any(isinstance(m, lora_layer) for m in model.modules())


def _base_model(model):
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def adapters_to_merge(layer) -> List[str]:
    """The adapters of a PEFT LoRA layer that the policy applies and its base weight lacks."""
    if getattr(layer, "disable_adapters", False):
        return []
    merged = set(getattr(layer, "merged_adapters", ()))
    active = getattr(layer, "active_adapters", ())
    # an embedding's adapter lives in lora_embedding_A/B, a linear or conv layer's in lora_A/B
    own = set(layer.lora_A) | set(getattr(layer, "lora_embedding_A", {}))
    return [a for a in active if a in own and a not in merged]


def merged_weight(layer, adapters: Sequence[str]):
    """``W + sum_a get_delta_weight(a)`` on a copy of the base weight (PEFT's safe merge, out of place)."""
    weight = layer.get_base_layer().weight
    out = weight.detach().clone()
    for adapter in adapters:
        out += layer.get_delta_weight(adapter).to(out.dtype)
    return out


def merged_bias(layer, adapters: Sequence[str]):
    bias = layer.get_base_layer().bias
    out = bias.detach().clone()
    for adapter in adapters:
        if layer.lora_bias.get(adapter, False):
            out += (layer.lora_B[adapter].bias * layer.scaling[adapter]).to(out.dtype)
    return out


def _check_mergeable(layer, prefix: str, adapters: Sequence[str]) -> None:
    variants = getattr(layer, "lora_variant", {}) or {}
    for adapter in adapters:
        if adapter in variants or getattr(layer, "use_dora", {}).get(adapter, False):
            raise LoraSyncError(
                f"LoRA layer {prefix.rstrip('.')} uses the variant {type(variants.get(adapter)).__name__} "
                f"(adapter {adapter!r}, e.g. DoRA), whose merge is not W + scale*B*A; rlhf_ext's vLLM weight sync "
                "sends only plain LoRA merges"
            )
    if not hasattr(layer, "get_delta_weight"):
        raise LoraSyncError(f"LoRA layer {prefix.rstrip('.')} ({type(layer).__name__}) has no get_delta_weight")


def _layer_entries(layer, prefix: str) -> Iterator[SyncEntry]:
    adapters = adapters_to_merge(layer)
    _check_mergeable(layer, prefix, adapters)
    base = layer.get_base_layer()
    own = {id(p) for p in base.parameters()}
    # every adapter parameter of the layer (A, B, embedding A/B, bias): what a merge may read under ZeRO-3
    lora_params = [p for p in layer.parameters() if id(p) not in own]
    for pname, param in base.named_parameters(recurse=False):
        if pname == "weight":
            materialize = functools.partial(merged_weight, layer, adapters)
        elif pname == "bias" and any(layer.lora_bias.get(a, False) for a in adapters):
            materialize = functools.partial(merged_bias, layer, adapters)
        else:
            yield SyncEntry(prefix + pname, (param,), functools.partial(_data, param), False, param.requires_grad)
            continue
        yield SyncEntry(prefix + pname, (param, *lora_params), materialize, True, bool(adapters) or param.requires_grad)


def _data(param):
    return param.data


def sync_entries(model, only_changing: bool = False) -> List[SyncEntry]:
    """What the sync sends for a PEFT LoRA ``model``, in the base model's names and module order.

    ``only_changing``: just the tensors training can move (OpenRLHF's rule for VLMs, whose frozen
    vision tower is never sent). Raises :class:`LoraSyncError` for an adapter the merge cannot serve.
    """
    lora_layer = _lora_layer_class()
    entries: List[SyncEntry] = []
    owner = {}  # id(parameter) -> the name it is sent under (tied parameters go once)
    lora_bases = {}  # id(LoRA base weight) -> its layer's name

    def walk(module, prefix: str) -> None:
        if isinstance(module, lora_layer):
            for entry in _layer_entries(module, prefix):
                key = id(entry.params[0])
                if key in owner:
                    raise LoraSyncError(_tied_message(prefix, owner[key]))
                owner[key] = entry.name
                lora_bases[key] = entry.name
                entries.append(entry)
            return
        if type(module).__name__ == "ModulesToSaveWrapper":
            raise LoraSyncError(f"{prefix.rstrip('.')} is a PEFT modules_to_save copy, which OpenRLHF's LoRA "
                                "never creates and rlhf_ext's vLLM weight sync does not map")
        for pname, param in module._parameters.items():
            if param is None:
                continue
            key = id(param)
            if key in lora_bases:
                raise LoraSyncError(_tied_message(lora_bases[key], prefix + pname))
            if key in owner:
                continue
            owner[key] = prefix + pname
            entries.append(SyncEntry(prefix + pname, (param,), functools.partial(_data, param), False,
                                     param.requires_grad))
        for cname, child in module._modules.items():
            if child is not None:
                walk(child, prefix + cname + ".")

    walk(_base_model(model), "")
    return [e for e in entries if e.changes] if only_changing else entries


def _tied_message(lora_name: str, other: str) -> str:
    return (f"the LoRA layer {lora_name.rstrip('.')} adapts a weight tied to {other}: vLLM would use the merged "
            "weight for both, PEFT only for the adapted layer; leave tied embeddings out of --ds.lora.target_modules")


def merged_state(model) -> List[Tuple[str, object]]:
    """``(name, tensor)`` of everything the sync sends, without gathering (tests, benchmarks, ZeRO <= 2)."""
    return [(e.name, e.materialize()) for e in sync_entries(model)]


# --- the sync -----------------------------------------------------------------------------------


def _send_broadcast(trainer, name: str, tensor, last: bool) -> None:
    """Rank 0: the engines post a receive (``update_weight``), then the tensor goes over the sync group."""
    import ray
    import torch

    refs = [engine.update_weight.remote(name, dtype=tensor.dtype, shape=tensor.shape, empty_cache=last)
            for engine in trainer.vllm_engines]  # fmt: skip
    if getattr(trainer.strategy.args.vllm, "sync_with_ray", False):
        import ray.util.collective as collective

        collective.broadcast(tensor, 0, group_name=trainer._model_update_group)
    else:
        trainer._model_update_group.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
    ray.get(refs)


def _send_cuda_ipc(trainer, name: str, tensor, last: bool) -> None:
    """Every rank shares its copy through a CUDA IPC handle; rank 0 hands all of them to the engines."""
    import ray
    import torch
    from openrlhf.trainer.ray.utils import get_physical_gpu_id
    from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync
    from torch.multiprocessing.reductions import reduce_tensor

    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, {get_physical_gpu_id(): reduce_tensor(tensor)})
    if torch.distributed.get_rank() == 0:
        handles = {}
        for part in gathered:
            handles.update(part)
        refs = [engine.update_weight_cuda_ipc.remote(name, dtype=tensor.dtype, shape=tensor.shape,
                                                     ipc_handles=handles, empty_cache=last)
                for engine in trainer.vllm_engines]  # fmt: skip
        ray.get(refs)
    torch_dist_barrier_and_cuda_sync()  # the engines have copied it before this rank frees it


def broadcast_lora_to_vllm(trainer) -> None:
    """``ActorPPOTrainer.broadcast_to_vllm`` for a LoRA actor: merged weights, base names."""
    import deepspeed
    import ray
    import torch
    from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

    args = trainer.strategy.args
    if int(getattr(args.ds, "tensor_parallel_size", 1) or 1) > 1:
        raise LoraSyncError(TP_MESSAGE.format(tp=args.ds.tensor_parallel_size))
    rank = torch.distributed.get_rank()
    cache_resets = []
    if getattr(args.vllm, "enable_prefix_caching", False) and rank == 0:
        cache_resets = [engine.reset_prefix_cache.remote() for engine in trainer.vllm_engines]
    torch.cuda.empty_cache()
    model = trainer.actor.model
    model = getattr(model, "module", model)
    # what training can move, as OpenRLHF sends a VLM's trainable parameters only: frozen weights are vLLM's already
    entries = sync_entries(model, only_changing=True)
    zero3 = args.ds.zero_stage == 3
    ipc = bool(getattr(trainer, "use_cuda_ipc", False))
    for count, entry in enumerate(entries, 1):
        last = count == len(entries)
        with deepspeed.zero.GatheredParameters(list(entry.params), enabled=zero3):
            if ipc:
                tensor = entry.materialize()
                # a fresh tensor that outlives the handle, as upstream's clone of param.data
                _send_cuda_ipc(trainer, entry.name, tensor if entry.fresh else tensor.clone(), last)
            elif rank == 0:
                _send_broadcast(trainer, entry.name, entry.materialize().contiguous(), last)
    if cache_resets:
        ray.get(cache_resets)
    torch.cuda.empty_cache()
    torch_dist_barrier_and_cuda_sync()


def make_broadcast_to_vllm(original, module=None):
    @functools.wraps(original)
    def broadcast_to_vllm(self):
        lora = getattr(self, "_rlhf_ext_lora_actor", None)
        if lora is None:
            model = self.actor.model
            lora = has_lora_layers(getattr(model, "module", model))
            self._rlhf_ext_lora_actor = lora
        if not lora:
            return original(self)
        return broadcast_lora_to_vllm(self)

    return broadcast_to_vllm


# --- start-up ------------------------------------------------------------------------------------

TP_MESSAGE = (
    "--ds.lora.rank with --ds.tensor_parallel_size {tp}: DeepSpeed AutoTP splits the LoRA matrices across ranks, "
    "and rlhf_ext's LoRA weight sync for vLLM merges whole matrices (ZeRO-3 is supported); use --ds.zero_stage 3 "
    "instead of DeepSpeed tensor parallelism"
)
QLORA_MESSAGE = (
    "--ds.load_in_4bit with --ds.lora.rank and vLLM rollouts: the trainer's policy is the NF4-quantised base plus "
    "the adapter, while vLLM holds the checkpoint's full-precision base, so no merged weight the sync could send is "
    "exactly the trained policy; train LoRA on a bf16 base (drop --ds.load_in_4bit)"
)
_TIED_TARGETS = ("embed_tokens", "lm_head", "wte", "embed_in", "embed_out", "output")


def _ties_word_embeddings(model_path) -> Optional[bool]:
    """``tie_word_embeddings`` of a local model's ``config.json`` (its text config for VLMs); None if unknown."""
    path = os.path.join(str(model_path), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or {}
    value = config.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    return None if value is None else bool(value)


def finalize(namespace) -> None:
    """Driver, after parsing: refuse a LoRA setup the merged sync cannot serve exactly (``ValueError``)."""
    rank = int(getattr(namespace, "ds.lora.rank", 0) or 0)
    engines = int(getattr(namespace, "vllm.num_engines", 0) or 0)
    if rank <= 0 or engines <= 0:
        return
    if getattr(namespace, "ds.load_in_4bit", False):
        raise ValueError(QLORA_MESSAGE)
    tp = int(getattr(namespace, "ds.tensor_parallel_size", 1) or 1)
    if tp > 1:
        raise ValueError(TP_MESSAGE.format(tp=tp))
    targets = getattr(namespace, "ds.lora.target_modules", "all-linear")
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    tied_targets = [t for t in targets if t.split(".")[-1] in _TIED_TARGETS]
    model = getattr(namespace, "actor.model_name_or_path")
    if tied_targets and model and _ties_word_embeddings(model):
        raise ValueError(
            f"--ds.lora.target_modules {' '.join(tied_targets)} on {model}, whose input and output embeddings are tied "
            "(tie_word_embeddings): vLLM would apply the merged weight to both, PEFT's adapter only to the adapted "
            "layer, so vLLM would not sample from the trained policy; leave the embeddings out of the LoRA targets"
        )


__all__ = [
    "LoraSyncError",
    "QLORA_MESSAGE",
    "SyncEntry",
    "TP_MESSAGE",
    "adapters_to_merge",
    "broadcast_lora_to_vllm",
    "finalize",
    "has_lora_layers",
    "make_broadcast_to_vllm",
    "merged_bias",
    "merged_state",
    "merged_weight",
    "sync_entries",
]
