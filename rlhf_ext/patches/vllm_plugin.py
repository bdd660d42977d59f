"""Forwarding module, kept for one release: an install made by an older rlhf_ext declares vLLM's
entry point as ``rlhf_ext = rlhf_ext.patches.vllm_plugin:register``.

The entry point lives in :mod:`rlhf_ext.patches.activation.vllm_plugin`; import from there.
"""

from .activation.vllm_plugin import register

__all__ = ["register"]
