"""0/1 masks and comparison flags as floating-point tensors, and the cheap ways to get them.

The losses combine masks and flags with arithmetic (a product with a 0/1 float is exact: ``x * 1 = x``,
``x * 0 = 0`` for finite ``x``), which avoids ``torch.where`` and boolean tensors. On the CPU the
difference is large: at 8 x 4096 tokens (float32, one thread, ``benchmarks/plugin_step_cost.py``'s
shape) a comparison that writes a boolean tensor costs about 15 us and one that writes into a float
tensor about 4 us, converting a boolean tensor to float about 14 us and its ``uint8`` view about
3 us, a ``torch.where`` about 100 us, a float product about 3 us. On an accelerator each is one
kernel either way, so nothing is lost there.
"""

from __future__ import annotations

from typing import Callable, Union

import torch

Operand = Union[torch.Tensor, float]


def float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` (boolean, or any 0/1 tensor) as a 0/1 tensor of ``dtype``.

    A boolean tensor is read through its ``uint8`` view (same bytes, 0 or 1), which converts several
    times faster than the boolean itself on the CPU."""
    if mask.dtype == torch.bool:
        return mask.view(torch.uint8).to(dtype)
    return (mask != 0).to(dtype)


def flag(op: Callable[..., torch.Tensor], a: torch.Tensor, b: Operand) -> torch.Tensor:
    """``op(a, b)`` (``torch.lt``, ``le``, ``gt``, ``ge``, ``eq``, ``ne``) as 0/1 in ``a``'s float dtype and
    shape, written straight into a float tensor (no boolean intermediate). ``a`` must be a
    floating-point tensor at least as large as the broadcast result; no gradient flows through a flag."""
    a = a.detach()
    if isinstance(b, torch.Tensor):
        b = b.detach()
    return op(a, b, out=torch.empty_like(a))


def rows_all_nonempty(mask: torch.Tensor) -> torch.Tensor:
    """0-dim ``uint8`` tensor, 1 if every row of the 2-D ``mask`` has a true entry, else 0 (no host
    synchronisation; a number, so that a caller can fold it into another value it reads anyway).

    The row maximum of the ``uint8`` view, then the minimum over rows: a few microseconds where
    ``mask.any(dim=1).all()`` takes tens on the CPU."""
    m = mask.view(torch.uint8) if mask.dtype == torch.bool else (mask != 0).view(torch.uint8)
    return m.amax(dim=1).amin()
