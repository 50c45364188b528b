"""Horovod's ``horovod/torch/optimizer.py``: DistributedOptimizer.

Each parameter's gradient accumulator gets a hook that starts the gradient's
asynchronous allreduce as soon as backward has produced it, so communication
overlaps the rest of backward; ``step()`` (or ``synchronize()``) waits for them.
With ``op=Adasum`` (and more than one rank) the hook instead takes the local
optimizer step and Adasum-reduces the parameter's delta (Horovod's
``_DistributedAdasumOptimizer``).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional

import torch

from .. import _env
from ..basics import Adasum, Average, ProcessSet, global_process_set, rocm_built, size
from .compression import Compression
from .functions import broadcast_object
from .mpi_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

__all__ = ["DistributedOptimizer"]


def split_list(x: List[Any], n: int) -> List[List[Any]]:
    """Splits x into n contiguous, nearly equal parts (Horovod's helper)."""
    d, r = divmod(len(x), n)
    return [x[i * d + min(i, r) : (i + 1) * d + min(i + 1, r)] for i in range(n)]


def _parameter_names(param_groups: Any, named_parameters: List[Any]) -> dict:
    """Validates named_parameters as Horovod's optimizers do (tuples, unique
    names, every parameter of param_groups named) and maps each parameter to
    its name."""
    if any([not isinstance(p, tuple) for p in named_parameters]):
        raise ValueError(
            "named_parameters should be a sequence of "
            "tuples (name, parameter), usually produced by "
            "model.named_parameters()."
        )
    dups = _DistributedOptimizer.find_duplicates([k for k, _ in named_parameters])
    if len(dups) > 0:
        raise ValueError(
            "Parameter names in named_parameters must be unique. " "Found duplicates: %s" % ", ".join(dups)
        )
    all_param_ids = {id(v) for param_group in param_groups for v in param_group["params"]}
    named_param_ids = {id(v) for k, v in named_parameters}
    unnamed_param_ids = all_param_ids - named_param_ids
    if len(unnamed_param_ids):
        raise ValueError(
            "named_parameters was specified, but one or more model "
            "parameters were not named. Python object ids: "
            "%s" % ", ".join(str(id) for id in unnamed_param_ids)
        )
    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


class _DistributedOptimizer(torch.optim.Optimizer):
    _hvdd_distributed = True

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int = 1,
        op: int = Average,
        gradient_predivide_factor: float = 1.0,
        groups: Any = None,
        sparse_as_dense: bool = False,
        process_set: ProcessSet = global_process_set,
    ) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        self._compression = compression

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [
                ("allreduce.noname.%s.%s" % (i, j), v)
                for i, param_group in enumerate(self.param_groups)
                for j, v in enumerate(param_group["params"])
            ]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {
            v: self.backward_passes_per_step for _, v in sorted(named_parameters, key=lambda kv: kv[0])
        }
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        self._handles: dict = {}
        self._grad_accs: List[Any] = []
        self._requires_update: set = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
            if isinstance(groups, list):
                grouped_parameter_ids = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in grouped_parameter_ids:
                            raise ValueError("A parameter can only appear once in groups.")
                        grouped_parameter_ids.add(id(p))
        self._groups = groups
        self._p_to_group: dict = {}
        self._group_counts: dict = {}

        if self.process_set.included() and (size() > 1 or _env.elastic_requested()):
            self._register_hooks()

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)  # type: ignore[misc]

    @staticmethod
    def find_duplicates(lst: List[Any]) -> set:
        seen = set()
        dups = set()
        for el in lst:
            if el in seen:
                dups.add(el)
            seen.add(el)
        return dups

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self) -> None:
        if self._groups is not None:
            p_list = []
            # Get list of parameters with grads
            for param_group in self.param_groups:
                for p in param_group["params"]:
                    if p.requires_grad:
                        p_list.append(p)

            # To ensure parameter order and group formation is consistent, broadcast p_list order
            # from rank 0 and use for every worker
            p_list_names = [self._parameter_names.get(p) for p in p_list]
            p_list_names = broadcast_object(p_list_names, root_rank=0, process_set=self.process_set)
            p_list = sorted(p_list, key=lambda p: p_list_names.index(self._parameter_names.get(p)))

            # Form groups
            if isinstance(self._groups, list):
                p_groups = []
                grouped_id = set()
                p_list_ids = [id(p) for p in p_list]
                for group in self._groups:
                    p_groups.append([p for p in group if id(p) in p_list_ids])
                    for p in p_groups[-1]:
                        grouped_id.add(id(p))
                for p in p_list:
                    if id(p) not in grouped_id:
                        p_groups.append([p])
            else:
                p_groups = split_list(p_list, self._groups)

            p_groups = [tuple(p) for p in p_groups]
            for group in p_groups:
                for p in group:
                    self._p_to_group[p] = group
                self._group_counts[group] = 0

        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _scales(self) -> tuple:
        if self.op == Average:
            # Split average operation across pre/postscale factors
            # The daemon applies an additional 1 / size() factor to postscale_factor for op == Average.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple:
        if p.grad is None:
            # Gradient was not computed, but we still need to submit a tensor to allreduce
            # as one of the other ranks may have computed it (due to dynamic forward functions).
            #
            # NOTE: this will not work if the gradient is sparse and we perform an allgather.
            # Unfortunately, there doesn't appear to be a good way to detect that the parameter will
            # produce sparse gradients before computing the gradient.
            p.grad = p.data.new(p.size()).zero_()

        name = self._parameter_names.get(p)
        tensor = p.grad

        if p.grad.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return self._sparse_allreduce_grad_async(p, name)

        tensor_compressed, ctx = self._compression.compress(tensor)
        prescale_factor, postscale_factor = self._scales()
        handle = allreduce_async_(
            tensor_compressed,
            name=name,
            op=self.op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=self.process_set,
        )
        return handle, ctx

    def _grouped_allreduce_grad_async(self, ps: tuple) -> tuple:
        name = self._parameter_names.get(ps[0])
        tensors_compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in ps])
        prescale_factor, postscale_factor = self._scales()
        handle = grouped_allreduce_async_(
            list(tensors_compressed),
            name=name,
            op=self.op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=self.process_set,
        )
        return handle, ctxs

    def _sparse_allreduce_grad_async(self, p: torch.Tensor, name: Optional[str]) -> tuple:
        handle = sparse_allreduce_async(p.grad, name=name, op=self.op, process_set=self.process_set)
        return handle, None

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*ignore: Any) -> None:
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than "
                        "backward_passes_per_step times before call "
                        "to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally."
                    )
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        handle, ctxs = self._grouped_allreduce_grad_async(group)
                        self._handles[group] = (handle, ctxs)
                        # Remove any None entries from previous no-op hook calls
                        for gp in group:
                            self._handles.pop(gp, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce (starting those whose hooks did
        not fire) and writes the averaged gradients into ``p.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return

        completed = set()
        for x in self._handles.keys():
            completed.update(x) if isinstance(x, tuple) else completed.add(x)
        missing_p = self._requires_update - completed
        for p in missing_p:
            handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        for p, (handle, ctx) in self._handles.items():
            if handle is None:
                handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
        try:
            for p, (handle, ctx) in self._handles.items():
                if isinstance(p, tuple):
                    # This was a grouped result, need to unpack
                    outputs = synchronize(handle)
                    for gp, output, gctx in zip(p, outputs, ctx):
                        self._allreduce_delay[gp] = self.backward_passes_per_step
                        gp.grad.set_(self._compression.decompress(output, gctx))
                    if self._groups is not None:
                        self._group_counts[p] = 0
                    continue
                if callable(handle):
                    # sparse allreduce: the handle returns the aggregated
                    # (uncompressed) sparse gradient
                    output = handle()
                else:
                    output = self._compression.decompress(synchronize(handle), ctx)
                self._allreduce_delay[p] = self.backward_passes_per_step
                if self._groups is not None:
                    # a member of a group whose other members' hooks had not
                    # all fired: the group starts counting afresh
                    self._group_counts[self._p_to_group[p]] = 0
                if p.grad.is_sparse:
                    if not output.is_sparse:
                        # sparse_as_dense: back to the gradient's layout
                        output = output.to_sparse(p.grad.sparse_dim())
                    # set_ does not take sparse tensors; this does the same
                    p.grad.zero_().add_(output)
                else:
                    p.grad.set_(output)
        finally:
            self._handles.clear()

        self._synchronized = True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """
        A context manager used to specify that optimizer.step() should
        not perform synchronization.

        It's typically used in a following pattern:

        .. code-block:: python

            optimizer.synchronize()
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without "
                    "optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training "
                    "slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code."
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() "
                "but before optimizer.step() or optimizer.synchronize(). "
                "This is prohibited as it can cause a race condition."
            )
        return super(self.__class__, self).zero_grad(*args, **kwargs)  # type: ignore[misc]


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's delta optimizer for op=Adasum: each rank applies its own
    optimizer step first, and the ranks combine the parameter *deltas* with
    an Adasum allreduce, which is added to the parameters they started from.

    Horovod runs the local step per parameter in the gradient's hook, so
    communication overlaps backward: with ``start`` = the parameter's value
    before the step, the wrapped optimizer steps on that parameter alone,
    ``p - start`` (the delta, ``-lr·f(g)``) is Adasum-reduced in place in
    ``p``, and ``step()`` waits for it and sets ``p = start + delta``.
    """

    _hvdd_distributed = True

    def __init__(self, params: Any, named_parameters: Any, compression: Any, backward_passes_per_step: int = 1) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[misc]
        self._compression = compression

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [
                ("allreduce.noname.%s" % i, v)
                for param_group in self.param_groups
                for i, v in enumerate(param_group["params"])
            ]
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step for v in self._parameter_names}
        self._handles: dict = {}
        self._grad_accs: List[Any] = []
        self._requires_update: set = set()
        self._synchronized = False
        self._should_synchronize = True
        # The value each parameter had before its local step (then, once the
        # Adasum of the deltas arrives, the value after it).
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False) for _, p in named_parameters}
        self._register_hooks()

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._handles = {}
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self) -> None:
        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple:
        name = self._parameter_names.get(p)
        start = self._starting_models[p]

        # Step the wrapped optimizer on p alone: every group keeps only p (if
        # it holds p), and gets its parameters back afterwards.
        stashed_params = []
        for group in self.param_groups:
            stashed_params.append(group["params"])
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.data.copy_(p)
            super(self.__class__, self).step()  # type: ignore[misc]
            # p now holds start - lr·f(g): the delta is p - start.
            p.data.sub_(start)
            tensor_compressed, ctx = self._compression.compress(p)
            handle = allreduce_async_(tensor_compressed.data, name=name, op=Adasum)
        finally:
            for stashed, group in zip(stashed_params, self.param_groups):
                group["params"] = stashed
        return handle, ctx

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*ignore: Any) -> None:
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than "
                        "backward_passes_per_step times before call "
                        "to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally."
                    )
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        """Nothing to do: step() waits for the deltas (as in Horovod)."""

    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")

    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            loss = closure()

        # Parameters whose hook did not fire (no gradient this step) still
        # take part, with a local step on their zero gradient.
        missing_p = self._requires_update - set(self._handles.keys())
        for p in missing_p:
            self._handles[p] = self._allreduce_grad_async(p)

        try:
            for p, (handle, ctx) in self._handles.items():
                # step() before backward_passes_per_step passes: reduce now.
                if handle is None:
                    handle, ctx = self._allreduce_grad_async(p)
                    self._handles[p] = (handle, ctx)
                delta = self._compression.decompress(synchronize(handle), ctx)
                start = self._starting_models[p]
                start.data.add_(delta.data)
                p.data.copy_(start)
                self._allreduce_delay[p] = self.backward_passes_per_step
        finally:
            self._handles.clear()
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() "
                "but before optimizer.step() or optimizer.synchronize(). "
                "This is prohibited as it can cause a race condition."
            )
        return super(self.__class__, self).zero_grad(*args, **kwargs)  # type: ignore[misc]


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """
    An optimizer that wraps another torch.optim.Optimizer, using an allreduce to
    combine gradient values before applying gradients to model weights.

    Allreduce operations are executed after each gradient is computed by
    ``loss.backward()`` in parallel with each other. The ``step()`` method
    ensures that all allreduce operations are finished before applying
    gradients to the model.

    DistributedOptimizer exposes the ``synchronize()`` method, which forces
    allreduce operations to finish before continuing the execution. It's useful
    in conjunction with gradient clipping, or other operations that modify
    gradients in place before ``step()`` is executed. Make sure to use
    ``optimizer.skip_synchronize()`` if you're calling ``synchronize()`` in
    your code.

    Arguments:
        optimizer: Optimizer to use for computing gradients and applying updates.
        named_parameters: A mapping between parameter names and values. Used for
            naming of allreduce operations. Typically just
            ``model.named_parameters()``.
        compression: Compression algorithm used during allreduce to reduce the
            amount of data sent during each parameter update step. Defaults to
            not using compression.
        backward_passes_per_step: Number of expected backward passes to perform
            before calling step()/synchronize(). This allows accumulating
            gradients over multiple mini-batches before reducing and applying
            them.
        op: The reduction operation to use when combining gradients across
            different ranks.
        gradient_predivide_factor: If op == Average, gradient_predivide_factor
            splits the averaging before and after the sum. Gradients are scaled
            by 1.0 / gradient_predivide_factor before the sum and
            gradient_predivide_factor / size after the sum.
        num_groups: Number of groups to assign gradient allreduce ops to for
            explicit grouping. Defaults to no explicit groups. (deprecated)
        groups: The parameter to group the gradient allreduce ops. Accept values
            is a non-negative integer or a list of list of tf.Variable. If
            groups is a non-negative integer, it is the number of groups to
            assign gradient allreduce ops to for explicit grouping. If groups
            is a list of list of tf.Variable. Variables in the same inner list
            will be assigned to the same group, while parameter that does not
            appear in any list will form a group itself. Defaults as None,
            which is no explicit groups.
        sparse_as_dense: If set True, convert all sparse gradients to dense and
            perform allreduce, then convert back to sparse before applying
            the update.
        process_set: Gradients will only be reduced over Horovod processes
            belonging to this process set. Defaults to the global process set.
    """
    # We dynamically create a new class that inherits from the optimizer that was passed in.
    # The goal is to override the `step()` method with an allreduce implementation.

    if gradient_predivide_factor != 1.0:
        if rocm_built():
            raise ValueError("gradient_predivide_factor not supported yet with ROCm")
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")

    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
        )
        if groups is None:
            groups = num_groups

    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")

    if op == Adasum and size() > 1:
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)

    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )
