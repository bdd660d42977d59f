"""``flash_attn.utils.distributed.all_gather`` in plain ``torch.distributed``.

flash-attn's ``all_gather(input_, process_group)`` concatenates every rank's tensor along dim 0
(in rank order) and is differentiable: its backward sums the incoming gradients over the ranks
(reduce-scatter) and hands each rank the slice of its own input. Built here from ``all_gather``
and ``all_reduce``, which every backend implements (gloo on CPU, hccl on Ascend), instead of the
``*_into_tensor`` collectives some backends lack.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["all_gather", "all_gather_raw"]


def all_gather_raw(input_: torch.Tensor, process_group=None) -> torch.Tensor:
    """Concatenate ``input_`` from every rank of ``process_group`` along dim 0 (no autograd)."""
    world_size = dist.get_world_size(process_group)
    if world_size == 1:
        return input_
    parts = [torch.empty_like(input_) for _ in range(world_size)]
    dist.all_gather(parts, input_.contiguous(), group=process_group)
    return torch.cat(parts, dim=0)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_: torch.Tensor, process_group) -> torch.Tensor:
        # as in flash-attn, the output's autograd node holds the group: free the graph before
        # destroy_process_group, or gloo's threads outlive it until interpreter shutdown
        ctx.process_group = process_group
        ctx.rows = input_.shape[0]
        return all_gather_raw(input_, process_group)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        group = ctx.process_group
        if dist.get_world_size(group) == 1:
            return grad_output, None
        summed = grad_output.contiguous().clone()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        rank = dist.get_rank(group)
        return summed[rank * ctx.rows : (rank + 1) * ctx.rows], None


def all_gather(input_: torch.Tensor, process_group=None) -> torch.Tensor:
    """Differentiable all-gather along dim 0; every rank must pass a tensor of the same shape."""
    return _AllGather.apply(input_, process_group)
