"""A per-token loss given by its value and its derivative, instead of by autograd through its formula.

Most registered losses are, per token, a detached value whose derivative with respect to ``log pi``
has a closed form (PPO-style clips: the branch the ``min`` kept times the ratio; GMPO: the sequence
factor where the token's log-ratio was not clipped; CISPO / DPPO / VESPO: the detached weight
itself). Letting autograd differentiate the formula runs a backward node per forward operation
(``clamp``, ``minimum`` and ``where`` backward each cost a comparison and a ``where`` over the
micro-batch); computing the derivative alongside the value costs a few products, and the backward
pass is then a single product.

:func:`with_derivative` attaches the derivative: ``value + (lp - sg(lp)) * d``. ``lp - sg(lp)`` is
exactly 0 for finite ``lp``, so the forward value is ``value`` bit for bit (``x + 0 = x``); its
derivative with respect to ``lp`` is ``d`` (the same straight-through construction as the score
``exp(log pi - sg(log pi))`` that GSPO and the CISPO paper use).
"""

from __future__ import annotations

import torch


def with_derivative(value: torch.Tensor, log_probs: torch.Tensor, derivative: torch.Tensor) -> torch.Tensor:
    """``value`` (detached) in the forward pass, ``derivative * grad_out`` as the gradient of ``log_probs``.

    ``log_probs`` must be finite (the losses pass their zeroed inputs), ``value`` and ``derivative``
    detached and finite where the loss is; shapes broadcast to ``log_probs``'."""
    return torch.addcmul(value, log_probs - log_probs.detach(), derivative)
