"""Model FLOPs per token and peak FLOP/s per device: what an MFU estimate needs (docs/report.md).

**FLOPs per token** of one training pass (forward + backward) over a decoder-only transformer,
PaLM's count (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B,
after Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1)::

    6 N + 12 L H Q T

``N``: parameters that take part in a matrix multiply per token (attention projections, MLP,
the output head; the embedding lookup, norms and biases are left out, as there), ``L`` layers,
``H`` attention heads of size ``Q``, ``T`` the sequence length. The ``6`` is 2 FLOPs per
multiply-add, times 3 for forward + backward; ``12 L H Q T`` is the two attention matmuls
(``QK^T`` and ``AV``, 2 x 2 T H Q per layer forward) times 3, over the full sequence as PaLM counts
it (no halving for the causal mask). Grouped-query attention shrinks ``N`` (smaller k/v projections),
not the attention term. Gated MLPs (SwiGLU: Llama, Qwen2, Mistral) have three ``d x I`` matrices,
plain ones two.

**Peak FLOP/s**: :data:`PEAK_BF16_DENSE`, dense bf16 tensor-core figures per device, each with its
source. MFU (model FLOPs utilisation) = model FLOPs of the work done / (seconds x peak x devices);
a device not in the table gives no MFU and says why (:func:`device_peak`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

NVIDIA = "NVIDIA datasheet, bf16 tensor core, dense (half the 'with sparsity' figure)"
# (substring of the device name, peak bf16 dense FLOP/s, source). First match wins: the specific
# forms (PCIe / NVL boards, clocked lower) come before the family name.
PEAK_BF16_DENSE: Tuple[Tuple[str, float, str], ...] = (
    ("H100 PCIe", 756e12, NVIDIA + ": H100 PCIe 1,513 TFLOPS sparse"),
    ("H100 NVL", 835e12, NVIDIA + ": H100 NVL 1,671 TFLOPS sparse"),
    ("H100", 989e12, NVIDIA + ": H100 SXM 1,979 TFLOPS sparse"),
    ("H200 NVL", 835e12, NVIDIA + ": H200 NVL 1,671 TFLOPS sparse"),
    ("H200", 989e12, NVIDIA + ": H200 SXM 1,979 TFLOPS sparse"),
    ("H800 PCIe", 756e12, NVIDIA + ": H800 PCIe, as H100 PCIe"),
    ("H800", 989e12, NVIDIA + ": H800 SXM, as H100 SXM"),
    ("H20", 148e12, NVIDIA + ": H20 296 TFLOPS sparse"),
    ("A100", 312e12, NVIDIA + ": A100 (SXM and PCIe) 624 TFLOPS sparse"),
    ("A800", 312e12, NVIDIA + ": A800, as A100"),
    ("L40S", 362.05e12, NVIDIA + ": L40S 733 TFLOPS sparse"),
    ("L40", 181.05e12, NVIDIA + ": L40 362.1 TFLOPS sparse"),
    ("A40", 149.7e12, NVIDIA + ": A40 299.4 TFLOPS sparse"),
    ("L4", 121e12, NVIDIA + ": L4 242 TFLOPS sparse"),
    ("910B", 354e12, "verl 0.9.1 verl/utils/flops_counter.py (one figure for the Ascend 910B family; "
                     "Huawei publishes no per-variant bf16 dense figure)"),
)  # fmt: skip


def device_peak(name: Optional[str]) -> Tuple[Optional[float], str]:
    """(peak bf16 dense FLOP/s, source) of a device name as torch reports it, or (None, why not)."""
    if not name:
        return None, "the run record names no device"
    for key, peak, source in PEAK_BF16_DENSE:
        if key.lower() in name.lower():
            return peak, source
    known = ", ".join(k for k, _, _ in PEAK_BF16_DENSE)
    return None, f"no peak-FLOPs figure for device {name!r} (the table in rlhf_ext/runs/flops.py covers {known})"


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs count needs from a decoder-only transformer's config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True

    @property
    def matmul_params(self) -> int:
        """``N``: weights multiplied per token (q, k, v, o projections, MLP, output head)."""
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + self.hidden * self.vocab

    def train_flops_per_token(self, seq_len: float) -> float:
        """``6 N + 12 L H Q T`` (PaLM, Appendix B) for a sequence of ``seq_len`` tokens."""
        return 6.0 * self.matmul_params + 12.0 * self.layers * self.heads * self.head_dim * seq_len

    def to_json(self) -> Dict[str, Any]:
        """The shape, ``N``, and the count's two coefficients: FLOPs per token = ``flops_per_token_fixed``
        + ``flops_per_token_per_position`` x T (what :func:`rlhf_ext.runs.throughput.step_mfu` reads)."""
        return {**asdict(self), "matmul_params": self.matmul_params,
                "flops_per_token_fixed": 6.0 * self.matmul_params,
                "flops_per_token_per_position": 12.0 * self.layers * self.heads * self.head_dim}


_PLAIN_MLP = ("gpt2", "gpt_neox", "opt", "bloom", "falcon", "phi")


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (Llama/Qwen2/Mistral names, GPT-2's
    ``n_layer``/``n_embd``/``n_head``); raises ``ValueError`` naming the missing key."""

    def get(*keys, default=None):
        for key in keys:
            if config.get(key) is not None:
                return config[key]
        if default is not None:
            return default
        raise ValueError(f"the model config has none of {', '.join(keys)}")

    layers = int(get("num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(get("hidden_size", "n_embd", "d_model"))
    heads = int(get("num_attention_heads", "n_head"))
    kv_heads = int(get("num_key_value_heads", default=heads))
    head_dim = int(get("head_dim", default=hidden // heads))
    model_type = str(config.get("model_type", ""))
    gated = not model_type.startswith(_PLAIN_MLP)
    intermediate = int(get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden))
    vocab = int(get("vocab_size"))
    if min(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab) <= 0:
        raise ValueError("the model config has a zero or negative size")
    return ModelShape(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, gated)


def read_model_shape(model: str) -> ModelShape:
    """The shape of a local model directory (its ``config.json``) or of a model in the local Hugging
    Face cache; raises ``ValueError`` with the reason when neither is there."""
    path = os.path.join(os.path.expanduser(model), "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return shape_from_config(json.load(f))
    try:
        from transformers import AutoConfig

        return shape_from_config(AutoConfig.from_pretrained(model, local_files_only=True).to_dict())
    except (OSError, ValueError) as exc:
        raise ValueError(f"no readable config for model {model!r}: {exc}") from None


def compute_block(model: Optional[str], device_count: Optional[int], updates_per_step: Optional[int],
                  device: Optional[str], device_error: Optional[str] = None) -> Dict[str, Any]:
    """A run record's ``compute`` block: the device and how many train the policy, their peak and its
    source, the model's shape, and ``mfu_unavailable``: why there will be no MFU (``None`` when there
    will be). ``device``: the name torch gives it (``None`` with ``device_error`` when it could not be read)."""
    peak, source = device_peak(device)
    shape, why = None, None
    try:
        shape = read_model_shape(model).to_json() if model else None
        if shape is None:
            why = "the run names no model"
    except ValueError as exc:
        why = str(exc)
    if peak is None:
        why = why or (device_error if device is None and device_error else source)
    if not device_count or device_count < 1:
        why = why or "the number of training devices is unknown"
    return {"device": device, "device_count": device_count, "peak_flops_per_device": peak,
            "peak_source": source if peak is not None else None, "model_shape": shape,
            "updates_per_step": updates_per_step or 1, "mfu_unavailable": why}
