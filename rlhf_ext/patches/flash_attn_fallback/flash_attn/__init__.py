"""Pure-torch stand-in for the parts of ``flash_attn`` that OpenRLHF imports at module level.

Served under the name ``flash_attn`` by :mod:`rlhf_ext.patches.flash_attn_fallback` only when the
real package is not installed (CPU, Ascend): OpenRLHF's ``openrlhf/models/ring_attn_utils.py``
imports ``flash_attn.bert_padding`` and ``flash_attn.utils.distributed`` unconditionally, so
``import openrlhf.models`` fails without them. Only those two modules exist here; the attention
kernels themselves do not, so code that probes for them (``flash_attn.ops...``) still sees an
ImportError and takes its non-flash path.
"""

# No __version__ and no distribution metadata: transformers' is_flash_attn_2_available() keys
# on the installed "flash-attn" distribution, so it keeps reporting flash attention as absent.
RLHF_EXT_FALLBACK = True


def __getattr__(name):
    raise AttributeError(
        f"flash_attn.{name} is not available: this is rlhf_ext's pure-torch fallback for machines without "
        "the real flash-attn package, and it provides only flash_attn.bert_padding (pad_input, unpad_input, "
        "index_first_axis) and flash_attn.utils.distributed.all_gather"
    )
