"""Model-building side of the retarget: attention implementation and ``torch.compile``.

Attention. OpenRLHF defaults ``--ds.attn_implementation`` to ``flash_attention_2`` and forces it
with ``--ds.packing_samples``. The flash-attn package builds only for CUDA. What each target gets:

* NPU: ``flash_attention_2`` is kept when transformers ships its Ascend integration
  (``transformers/integrations/npu_flash_attention.py``): transformers then runs its FA2 path on
  torch_npu's fused attention (``npu_fusion_attention``), including the varlen form that packed
  samples need. Without that integration, ``sdpa``.
* CPU: ``sdpa``.
* Other flash variants (``flash_attention_3``, hub kernels) become ``sdpa`` on both.

Packing stays correct under ``sdpa``: OpenRLHF packs samples into one row with ``attention_mask=None``
and position ids restarting at 0 for each sample; transformers (``masking_utils.
find_packed_sequence_indices``) turns those restarts into a block-diagonal causal mask, so no
token attends across samples (tested against separate forward passes in tests/test_npu_attention.py).
``RLHF_EXT_ATTN_IMPLEMENTATION`` forces one implementation for every model on NPU/CPU.

torch.compile. ``openrlhf/models/utils.py`` decorates ``compute_entropy`` with ``@torch.compile``.
Inductor has no Ascend backend, and on a CPU smoke test it needs a C++ toolchain and minutes of
compile time, so on both targets the compiled functions of the modules below are swapped for the
functions they wrap (``_torchdynamo_orig_callable``); numerics are unchanged.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from typing import Optional

from rlhf_ext.seams import ledger
from rlhf_ext.patches.retarget.guard import require
from rlhf_ext.patches.retarget.state import current_backend

ENV_ATTN = "RLHF_EXT_ATTN_IMPLEMENTATION"
_KEPT = ("eager", "sdpa", "flex_attention")


def transformers_has_npu_flash_attention() -> bool:
    return importlib.util.find_spec("transformers.integrations.npu_flash_attention") is not None


def map_attn_implementation(value: Optional[str], backend: Optional[str] = None) -> Optional[str]:
    """The attention implementation to load a model with on ``backend`` when OpenRLHF asked for ``value``."""
    backend = backend or current_backend()
    if backend == "cuda" or value is None:
        return value
    forced = os.environ.get(ENV_ATTN, "").strip()
    if forced:
        return forced
    if value in _KEPT:
        return value
    if "flash" in value:
        if backend == "npu" and value == "flash_attention_2" and transformers_has_npu_flash_attention():
            return "flash_attention_2"
        return "sdpa"
    return value


def _call_with_mapped_attn(fn, args, kwargs):
    signature = inspect.signature(fn)
    bound = signature.bind_partial(*args, **kwargs)
    asked = bound.arguments.get("attn_implementation", signature.parameters["attn_implementation"].default)
    mapped = map_attn_implementation(asked)
    if mapped != asked:
        bound.arguments["attn_implementation"] = mapped
    return fn(*bound.args, **bound.kwargs)


def actor_init(self, *args, **kwargs):
    """``openrlhf.models.Actor.__init__`` loading the model with :func:`map_attn_implementation`."""
    from openrlhf.models.actor import Actor

    return _call_with_mapped_attn(ledger.original(Actor, "__init__"), (self,) + args, kwargs)


def get_llm_for_sequence_regression(*args, **kwargs):
    """``openrlhf.models.get_llm_for_sequence_regression`` with :func:`map_attn_implementation`."""
    import openrlhf.models.model as model_module

    return _call_with_mapped_attn(ledger.original(model_module, "get_llm_for_sequence_regression"), args, kwargs)


def patch_actor(module, backend: str) -> None:
    require(module, "Actor.__init__", "attention implementation", params=["pretrain_or_model", "attn_implementation"])
    ledger.replace_function(module.Actor, "__init__", actor_init)
    unwrap_compiled(module)


def patch_model(module, backend: str) -> None:
    require(module, "get_llm_for_sequence_regression", "attention implementation", params=["attn_implementation"])
    ledger.replace_function(module, "get_llm_for_sequence_regression", get_llm_for_sequence_regression)


def patch_regression_importer(module, backend: str) -> None:
    """A module holding ``get_llm_for_sequence_regression`` under its own name (imported earlier)."""
    import openrlhf.models.model as model_module

    current = require(module, "get_llm_for_sequence_regression", f"attention implementation in {module.__name__}")
    if current is not get_llm_for_sequence_regression and current is ledger.original(
        model_module, "get_llm_for_sequence_regression"
    ):
        ledger.replace_function(module, "get_llm_for_sequence_regression", get_llm_for_sequence_regression)


def unwrap_compiled(module) -> list:
    """Replace each ``torch.compile``-wrapped function in ``module``'s namespace by the function it wraps."""
    unwrapped = []
    for name, value in list(vars(module).items()):
        eager = getattr(value, "_torchdynamo_orig_callable", None)
        if callable(eager) and not isinstance(value, type):
            ledger.replace(module, name, eager)
            unwrapped.append(name)
    return unwrapped


def patch_compiled_utils(module, backend: str) -> None:
    require(module, "compute_entropy", "torch.compile off")
    unwrap_compiled(module)


def patch_models_package(module, backend: str) -> None:
    patch_regression_importer(module, backend)


__all__ = [
    "ENV_ATTN",
    "actor_init",
    "get_llm_for_sequence_regression",
    "map_attn_implementation",
    "patch_actor",
    "patch_compiled_utils",
    "patch_model",
    "patch_models_package",
    "patch_regression_importer",
    "transformers_has_npu_flash_attention",
    "unwrap_compiled",
]
