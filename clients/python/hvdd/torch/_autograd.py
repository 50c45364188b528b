"""Autograd functions behind the differentiable collectives, with Horovod's
backward rules (``horovod/torch/mpi_ops.py``).

Forward passes run the asynchronous collectives of
:mod:`hvdd.torch._async_ops` and wait for them. Backward passes run
differentiable collectives, as Horovod's do (so that higher derivatives flow
through them): these same functions, applied with the arguments that
``hvdd.torch.allreduce`` and the others give them when there is no
compression. :mod:`hvdd.torch.mpi_ops` imports this module, not the reverse."""

from __future__ import annotations

from typing import Any

import torch

from .. import basics as _basics
from ..basics import Average, Sum
from ..ops import synchronize
from . import _async_ops

__all__ = [
    "HorovodAllreduce",
    "HorovodGroupedAllreduce",
    "HorovodAllgather",
    "HorovodBroadcast",
    "HorovodAlltoall",
    "HorovodGroupedAllgather",
    "HorovodReducescatter",
    "HorovodGroupedReducescatter",
]


def _unnamed_like(ctx: Any) -> tuple:
    """An allreduce's arguments besides its tensors, as its forward pass had
    them (``ctx``) but unnamed: those of the backward allreduce."""
    return ctx.average, None, ctx.op, ctx.prescale_factor, ctx.postscale_factor, ctx.process_set


class HorovodAllreduce(torch.autograd.Function):
    """An autograd function that performs allreduce on a tensor."""

    @staticmethod
    def forward(ctx: Any, tensor, average, name, op, prescale_factor, postscale_factor, process_set):  # type: ignore[override]
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = _async_ops.allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output):  # type: ignore[override]
        return (
            HorovodAllreduce.apply(grad_output.contiguous(), *_unnamed_like(ctx)),
            None,
            None,
            None,
            None,
            None,
            None,
        )


class HorovodGroupedAllreduce(torch.autograd.Function):
    """An autograd function that performs a grouped allreduce."""

    @staticmethod
    def forward(ctx: Any, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):  # type: ignore[override]
        ctx.average = average
        ctx.op = op
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        ctx.process_set = process_set
        handle = _async_ops.grouped_allreduce_async(
            list(tensors), average, name, op, prescale_factor, postscale_factor, process_set
        )
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output):  # type: ignore[override]
        grads = HorovodGroupedAllreduce.apply(*_unnamed_like(ctx), *[g.contiguous() for g in grad_output])
        return (None, None, None, None, None, None, *grads)


class HorovodAllgather(torch.autograd.Function):
    """An autograd function that performs allgather on a tensor."""

    @staticmethod
    def forward(ctx: Any, tensor, name, process_set):  # type: ignore[override]
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        handle = _async_ops.allgather_async(tensor, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output):  # type: ignore[override]
        grad_reduced = HorovodAllreduce.apply(grad_output.contiguous(), None, None, Average, 1.0, 1.0, ctx.process_set)
        dim_t = torch.IntTensor([ctx.dim])
        dim = HorovodAllgather.apply(dim_t, None, ctx.process_set).view(ctx.process_set.size())
        r = ctx.process_set.rank()
        offset = int(torch.sum(dim.narrow(0, 0, r)).item()) if r != 0 else 0
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


class HorovodBroadcast(torch.autograd.Function):
    """An autograd function that broadcasts a tensor."""

    @staticmethod
    def forward(ctx: Any, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        handle = _async_ops.broadcast_async(tensor, root_rank, name, process_set)
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output):  # type: ignore[override]
        grad_reduced = HorovodAllreduce.apply(grad_output.contiguous(), None, None, Average, 1.0, 1.0, ctx.process_set)
        if _basics.rank() != ctx.root_rank:
            grad_reduced *= 0
        return grad_reduced, None, None, None


class HorovodAlltoall(torch.autograd.Function):
    """An autograd function that performs alltoall on a tensor."""

    @staticmethod
    def forward(ctx: Any, tensor, splits, name, process_set):  # type: ignore[override]
        handle = _async_ops.alltoall_async(tensor, splits, name, process_set)
        output, received_splits = synchronize(handle)
        ctx.process_set = process_set
        ctx.recvsplits = received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx: Any, grad_output, *dead_gradients):  # type: ignore[override]
        grad_wrt_tensor, _ = HorovodAlltoall.apply(grad_output.contiguous(), ctx.recvsplits, None, ctx.process_set)
        return grad_wrt_tensor, None, None, None


class HorovodGroupedAllgather(torch.autograd.Function):
    """An autograd function that performs allgather on a list of tensors."""

    @staticmethod
    def forward(ctx: Any, name, process_set, *tensors):  # type: ignore[override]
        ctx.dims = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        handle = _async_ops.grouped_allgather_async(list(tensors), name, process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output):  # type: ignore[override]
        grads = HorovodGroupedAllreduce.apply(
            None, None, Average, 1.0, 1.0, ctx.process_set, *[g.contiguous() for g in grad_output]
        )
        dim_ts = [torch.IntTensor([d]) for d in ctx.dims]
        dims = HorovodGroupedAllgather.apply(None, ctx.process_set, *dim_ts)
        r = ctx.process_set.rank()
        offsets = [int(torch.sum(d.narrow(0, 0, r)).item()) if r != 0 else 0 for d in dims]
        return (None, None, *[g.narrow(0, o, d) for g, o, d in zip(grads, offsets, ctx.dims)])


def _reducescatter_grad_scale(ctx: Any) -> float:
    """Horovod's factor for a reducescatter's gradient: the set's size for
    Sum (none for Average), times the prescale and postscale factors."""
    scale = float(ctx.prescale_factor) * float(ctx.postscale_factor)
    if ctx.op == Sum:
        scale *= ctx.process_set.size()
    return scale


class HorovodReducescatter(torch.autograd.Function):
    """An autograd function that performs reducescatter on a tensor.

    The gradient is Horovod's: the upstream gradient multiplied by the set's
    size for Sum and by the prescale and postscale factors, then allgathered
    (for Average the allgather alone: Horovod's tests expect ones for ones).
    """

    @staticmethod
    def forward(ctx: Any, tensor, name, op, process_set, prescale_factor, postscale_factor):  # type: ignore[override]
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        handle = _async_ops.reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        return synchronize(handle)

    @staticmethod
    def backward(ctx: Any, grad_output):  # type: ignore[override]
        scale = _reducescatter_grad_scale(ctx)
        g = grad_output * scale if scale != 1.0 else grad_output
        return HorovodAllgather.apply(g.contiguous(), None, ctx.process_set), None, None, None, None, None


class HorovodGroupedReducescatter(torch.autograd.Function):
    """An autograd function that performs reducescatter on a list of tensors
    (gradients as :class:`HorovodReducescatter`'s, by a grouped allgather)."""

    @staticmethod
    def forward(ctx: Any, name, op, process_set, prescale_factor, postscale_factor, *tensors):  # type: ignore[override]
        ctx.op = op
        ctx.process_set = process_set
        ctx.prescale_factor = prescale_factor
        ctx.postscale_factor = postscale_factor
        handle = _async_ops.grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor
        )
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grad_output):  # type: ignore[override]
        scale = _reducescatter_grad_scale(ctx)
        gs = [(g * scale if scale != 1.0 else g).contiguous() for g in grad_output]
        return (None, None, None, None, None, *HorovodGroupedAllgather.apply(None, ctx.process_set, *gs))
