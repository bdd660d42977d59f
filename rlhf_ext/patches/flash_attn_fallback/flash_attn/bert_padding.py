"""Padding helpers with the interface of ``flash_attn.bert_padding`` (flash-attn >= 2.6), in plain torch.

flash-attn's varlen kernels take sequences concatenated without padding; these helpers convert
between the padded ``(batch, seqlen, ...)`` layout and that packed ``(total_tokens, ...)`` layout.
The behaviour follows flash-attn's documented contract (docstrings of
``flash_attn/bert_padding.py`` in github.com/Dao-AILab/flash-attention); gradients come from
torch's own indexing autograd instead of flash-attn's hand-written Functions, which compute the
same thing (indices are unique, so scatter and scatter-add agree).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

try:  # OpenRLHF imports ``rearrange`` from here, as flash-attn re-exports einops' function.
    from einops import rearrange, repeat  # noqa: F401
except ImportError:  # einops is an OpenRLHF dependency; say so only if someone asks for it.

    def rearrange(*args, **kwargs):
        raise ImportError("flash_attn.bert_padding.rearrange needs einops: pip install einops")

    repeat = rearrange

__all__ = ["index_first_axis", "index_put_first_axis", "pad_input", "unpad_input", "rearrange"]


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``input[indices]`` of a tensor of shape ``(n, ...)`` (``input.ndim >= 2``)."""
    if input.dim() < 2:
        raise ValueError(f"index_first_axis: input must have at least 2 dims, got shape {tuple(input.shape)}")
    return input.index_select(0, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A zero tensor of shape ``(first_axis_dim, ...)`` with ``values[i]`` written at row ``indices[i]``."""
    if indices.dim() != 1:
        raise ValueError(f"index_put_first_axis: indices must be 1-D, got shape {tuple(indices.shape)}")
    if values.dim() < 2:
        raise ValueError(f"index_put_first_axis: values must have at least 2 dims, got shape {tuple(values.shape)}")
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    # Out-of-place index_put keeps the result differentiable with respect to ``values``.
    return out.index_put((indices,), values)


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Pack the valid tokens of a padded batch.

    Arguments:
        hidden_states: ``(batch, seqlen, ...)``.
        attention_mask: ``(batch, seqlen)``, bool or int, nonzero = valid token.
        unused_mask: optional ``(batch, seqlen)``, nonzero = allocated but unused; those tokens are
            kept in the packed output too.

    Returns ``(packed, indices, cu_seqlens, max_seqlen_in_batch, seqused)``:

    * ``packed``: ``(total_nnz, ...)``, the selected tokens in row-major order;
    * ``indices``: ``(total_nnz,)`` int64 positions of those tokens in the flattened ``batch * seqlen``;
    * ``cu_seqlens``: ``(batch + 1,)`` int32 cumulative counts of selected tokens, starting at 0;
    * ``max_seqlen_in_batch``: Python int, the largest per-sequence count;
    * ``seqused``: ``(batch,)`` int32 number of valid tokens (``attention_mask`` only) per sequence.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"unpad_input: attention_mask must be (batch, seqlen), got shape {tuple(attention_mask.shape)}")
    if tuple(hidden_states.shape[:2]) != tuple(attention_mask.shape):
        raise ValueError(
            f"unpad_input: hidden_states {tuple(hidden_states.shape)} does not start with the attention_mask "
            f"shape {tuple(attention_mask.shape)}"
        )
    selected = attention_mask.bool()
    if unused_mask is not None:
        selected = selected | unused_mask.bool()
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad_input`: scatter ``(total_nnz, ...)`` back into zeros of ``(batch, seqlen, ...)``."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
