"""SyncBatchNorm: batch normalisation with statistics over every rank's batch.

Horovod's version is GPU-only; hvdd's runs on CPU (and any device) by summing
per-channel sums, squared sums and counts with one differentiable allreduce,
so autograd produces the synchronised backward pass on its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..basics import Sum, size
from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous version of N-dimensional BatchNorm.

    In this version, normalization parameters are synchronized across workers
    during forward pass. This is very useful in situations where each GPU can
    fit a very small number of examples.

    See https://pytorch.org/docs/stable/nn.html#batchnorm2d for more detail.

    Arguments:
        num_features: number of channels `C` from the shape `(N, C, ...)`
        eps: a value added to the denominator for numerical stability. Default:
            1e-5
        momentum: the value used for the running_mean and running_var
            computation. Can be set to `None` for cumulative moving average
            (i.e. simple average). Default: 0.1
        affine: a boolean value that when set to `True`, this module has
            learnable affine parameters. Default: `True`
        track_running_stats: a boolean value that when set to `True`, this
            module tracks the running mean and variance, and when set to
            `False`, this module does not track such statistics and always uses
            batch statistics in both training and eval modes. Default: `True`
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)

        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked)
            else:
                exponential_average_factor = self.momentum
        else:
            exponential_average_factor = 0.0

        if (not self.training and self.track_running_stats) or size() == 1:
            # Local statistics (torch's own _BatchNorm.forward): batch ones
            # while training or without running stats, the running ones else.
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                exponential_average_factor,
                self.eps,
            )

        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.tensor([float(x.numel() // c)], dtype=x.dtype)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        stats = allreduce(stats, op=Sum)
        total = stats[-1]
        mean = stats[:c] / total
        var = (stats[c : 2 * c] / total - mean * mean).clamp_min(0)

        if self.training and self.track_running_stats:
            with torch.no_grad():
                n = float(total.item())
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - exponential_average_factor).add_(exponential_average_factor * mean.detach())
                self.running_var.mul_(1 - exponential_average_factor).add_(exponential_average_factor * unbiased)

        shape = [1, c] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
