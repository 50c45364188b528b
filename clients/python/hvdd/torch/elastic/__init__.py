"""``hvdd.torch.elastic``: Horovod's ``horovod.torch.elastic``.

``@hvd.elastic.run`` runs a training function ``train(state)`` in Horovod's
elastic loop (:func:`hvdd.elastic.run_fn`): ``state`` (a :class:`TorchState`
of the model, the optimizer, an :class:`ElasticSampler` and plain values such
as ``epoch=1, batch=0``) is synced from rank 0 before ``train`` starts, and
``state.commit()`` saves it; after a lost rank the last commit is restored,
the job re-formed (``shutdown()``, ``init()``) and ``train`` called again.

Re-forming needs an elastic job (``HOROVOD_ELASTIC=1``) and a daemon that
re-forms it; elsewhere a failure propagates as ``HorovodInternalError`` and
the same script runs as a plain job. See :mod:`hvdd.elastic`.
"""

from __future__ import annotations

from typing import Any, Callable

from ...basics import init, shutdown  # noqa: F401 (Horovod's module has them)
from ...elastic import ObjectState, State, reset, run_fn
from .sampler import ElasticSampler
from .state import TorchState

__all__ = ["TorchState", "ElasticSampler", "run", "State", "ObjectState"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator used to run the elastic training process.

    The purpose of this decorator is to allow for uninterrupted execution of the wrapped function
    across multiple workers in parallel, as workers come and go from the system. When a new worker is added,
    its state needs to be brought to the same point as the other workers, which is done by synchronizing
    the state object before executing `func`.

    When a worker is added or removed, other workers will raise an exception to bring them back to such a sync
    point before executing `func` again. This ensures that workers do not diverge when such reset events occur.

    It's important to note that collective operations (e.g., broadcast, allreduce) cannot be the call to
    the wrapped function. Otherwise, new workers could execute these operations during their initialization
    while other workers are attempting to sync state, resulting in deadlock.

    Args:
        func: a wrapped function taking any number of args or kwargs. The first argument
              must be a `hvdd.elastic.State` object used to synchronize state across
              workers.
    """
    return run_fn(func, reset)
