"""``hvdd.torch.distributed``: hvdd as a ``torch.distributed`` backend, ``"hvdd"``.

A torch.distributed program changes one word::

    import hvdd.torch.distributed  # registers the backend (or let torch load it, below)
    import torch.distributed as dist

    dist.init_process_group("hvdd")  # instead of "gloo" or "nccl"
    model = torch.nn.parallel.DistributedDataParallel(model)

and runs under ``torchrun --nproc-per-node N train.py`` (or ``hvdd run -np N
python train.py``). The collectives run on the node's hvdd daemon: the one
listening on ``$HVDD_SOCKET`` or on the node's default socket, or else one
that the job's processes start for the job (the ``hvdd`` binary from
``$HVDD_BIN``, ``PATH`` or the source tree). A rank that dies makes the
other ranks' collectives fail at once, naming it, instead of after the
timeout.

Registration: importing this module registers the backend, for ``cpu`` and
``cuda`` tensors. Where the package is installed, torch also finds it
without the import, through the ``torch.distributed.backends`` entry point
``hvdd`` (torch 2.15 and later load it when ``init_process_group("hvdd")``
names a backend it does not know). ``hvdd run`` sets torch's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` for every rank, as torchrun does, so no
import is needed there either; where ``MASTER_ADDR`` is missing (an elastic
job across hosts), import the module before ``init_process_group``: it then
finds the store through the daemon. Elastic ranks get the values at start;
after a reset, hvd's (``hvd.rank()``, ...) are the current ones.

Supported: torch 2.15 and later (:data:`SUPPORTED_TORCH`), the versions
it is tested on; importing it with an older torch raises ImportError saying
so (use ``hvdd.torch``, Horovod's API, there). Every c10d collective, and
point-to-point ``send``/``recv``/``isend``/``irecv``/``batch_isend_irecv``
(on one node and across nodes; a recv from any source is refused: name
``src``); init methods ``env://``, ``tcp://``, ``file://`` and an explicit
``store``; one host per job unless ``hvdd run`` or daemons of your own
(``HVDD_SOCKET``) span the hosts.
"""

from __future__ import annotations

import re

import torch

__all__ = ["SUPPORTED_TORCH", "ProcessGroupHvdd", "register"]

#: The oldest torch (major, minor) the backend supports.
SUPPORTED_TORCH = (2, 15)


def _torch_version() -> tuple:
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


if _torch_version() < SUPPORTED_TORCH:
    raise ImportError(
        f"hvdd.torch.distributed (the torch.distributed backend 'hvdd') supports torch "
        f"{SUPPORTED_TORCH[0]}.{SUPPORTED_TORCH[1]} and later; this is torch {torch.__version__}. "
        "Upgrade torch (pip install -U torch), or use hvdd.torch, Horovod's API, which supports torch 1.13 and later."
    )

import torch.distributed as _dist  # noqa: E402

if not _dist.is_available():  # pragma: no cover - depends on the torch build
    raise ImportError("hvdd.torch.distributed: this torch is built without torch.distributed")

from . import _process_group, _startup  # noqa: E402
from ._process_group import ProcessGroupHvdd  # noqa: E402

_registered = False


def register() -> None:
    """Registers the backend ``"hvdd"`` with torch.distributed, for cpu and cuda
    tensors (done on import; the ``torch.distributed.backends`` entry point
    calls it too). Idempotent."""
    global _registered
    if _registered:
        return
    _dist.Backend.register_backend(
        "hvdd", _process_group.create_process_group, extended_api=True, devices=["cpu", "cuda"]
    )
    _process_group.register_subgroups()
    _startup.set_hvdd_run_env()
    _startup.install_env_rendezvous()
    _registered = True


register()
