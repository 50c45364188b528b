"""Every environment variable the client reads, one named function each: a
leaf of the client (it imports nothing of hvdd), so that the rest of the
package never touches ``os.environ`` and a reader finds the knobs in one
place.

Each function reads the environment when it is called, not at import:
launchers and tests set variables after ``import hvdd``.

Two kinds of variables:

- Horovod's (``HOROVOD_*``) and the launchers' (``OMPI_*``, ``SLURM_*``):
  part of the API, with Horovod's meaning.
- hvdd's own (``HVDD_*``): for ``hvdd run`` to pass a job's settings to its
  workers, and for debugging and tuning. They are not a stable interface
  and may change between versions.

=============================== ==============================================
variable                        function
=============================== ==============================================
HVDD_SOCKET, XDG_RUNTIME_DIR    :func:`socket_override`, :func:`default_socket_path`
HVDD_START_TIMEOUT,             :func:`default_start_timeout`
HOROVOD_ELASTIC_TIMEOUT
HOROVOD_ELASTIC                 :func:`elastic_requested`
HVDD_LOCAL_RANK, ...            :func:`requested_local_rank`
HVDD_LOCAL_SIZE                 :func:`job_local_size`
HVDD_JOB                        :func:`job`
HVDD_WORKER                     :func:`worker`
HVDD_ARENA_SIZE                 :func:`arena_size`
HVDD_SPIN_US                    :func:`spin_seconds`
HVDD_CHANNEL, HVDD_RING_BYTES   :func:`channel_enabled`, :func:`ring_bytes`
HOROVOD_TIMELINE,               :func:`timeline`, :func:`timeline_mark_cycles`
HOROVOD_TIMELINE_MARK_CYCLES
HOROVOD_AUTOTUNE*               :func:`autotune_env`
HOROVOD_DYNAMIC_PROCESS_SETS    :func:`dynamic_process_sets`
HVDD_BIN                        :func:`hvdd_bin`
PATH                            :func:`hvdd_on_path`
PYTORCH_CUDA_ALLOC_CONF,        :func:`torch_allocator_conf`
PYTORCH_ALLOC_CONF
HVDD_GRAPH_WAIT_WARN            :func:`graph_wait_warn`
the launcher's variables        :func:`environ` (``hvdd._launcher`` reads them)
=============================== ==============================================
"""

from __future__ import annotations

import logging
import os
from typing import Dict, List, Mapping

__all__ = [
    "environ",
    "socket_override",
    "default_socket_path",
    "default_start_timeout",
    "elastic_requested",
    "requested_local_rank",
    "job_local_size",
    "worker",
    "job",
    "arena_size",
    "spin_seconds",
    "channel_enabled",
    "ring_bytes",
    "timeline",
    "timeline_mark_cycles",
    "autotune_env",
    "dynamic_process_sets",
    "hvdd_bin",
    "hvdd_on_path",
    "torch_allocator_conf",
    "graph_wait_warn",
]

log = logging.getLogger(__name__)


def environ() -> Mapping[str, str]:
    """The whole environment, for :mod:`hvdd._launcher`, which reads the
    launcher's many variables from a mapping (tests pass their own)."""
    return os.environ


# ------------------------------------------------------------ the connection


def socket_override() -> str:
    """$HVDD_SOCKET: the daemon's socket ``hvdd run`` (or the user) chose;
    "" when unset."""
    return os.environ.get("HVDD_SOCKET") or ""


def default_socket_path() -> str:
    """$HVDD_SOCKET, else the daemon's default (as ``ipc.SocketPath``)."""
    s = socket_override()
    if s:
        return s
    if os.geteuid() == 0:
        return "/run/hvdd/hvdd.sock"
    d = os.environ.get("XDG_RUNTIME_DIR")
    if d:
        return os.path.join(d, "hvdd.sock")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"hvdd-{os.getuid()}", "hvdd.sock")


def default_start_timeout() -> float:
    """How long ``init()`` waits for the job to form: $HVDD_START_TIMEOUT
    seconds, else 120; in an elastic job, whose workers may wait to join a
    running job until its next commit, $HOROVOD_ELASTIC_TIMEOUT (what
    ``hvdd run --elastic-timeout`` passes), else 600 (Horovod's default)."""
    if "HVDD_START_TIMEOUT" in os.environ:
        return float(os.environ["HVDD_START_TIMEOUT"])
    if elastic_requested():
        return float(os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600"))
    return 120.0


def elastic_requested() -> bool:
    """Whether this process runs in an elastic job: HOROVOD_ELASTIC=1 (what
    ``hvdd run --min-np`` sets, as horovodrun does)."""
    return os.environ.get("HOROVOD_ELASTIC", "") == "1"


def requested_local_rank() -> int:
    """The local rank the launcher gave this process (HVDD_LOCAL_RANK, Open
    MPI's, SLURM's), for Hello; -1 when none (the daemon assigns one)."""
    for k in ("HVDD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        v = os.environ.get(k)
        if v:
            try:
                return int(v)
            except ValueError:
                log.warning("ignoring non-integer %s=%r", k, v)
    return -1


def job_local_size() -> int:
    """The job's process count on this node for Hello: HVDD_LOCAL_SIZE (hvdd
    run), else 0 (the daemon's --slots)."""
    try:
        return max(0, int(os.environ.get("HVDD_LOCAL_SIZE", "0")))
    except ValueError:
        log.warning("ignoring non-integer HVDD_LOCAL_SIZE=%r", os.environ.get("HVDD_LOCAL_SIZE"))
        return 0


def worker() -> str:
    """$HVDD_WORKER: hvdd run's name for this worker process, unique in its
    job, with which the daemons report an elastic epoch's workers to the
    driver; "" when unset."""
    return os.environ.get("HVDD_WORKER", "")


def job() -> str:
    """$HVDD_JOB: the job's name (``hvdd run --job``), which the processes of
    one job give the daemon; "" when unset."""
    return os.environ.get("HVDD_JOB", "")


def arena_size() -> int:
    """$HVDD_ARENA_SIZE: the first staging region's size in bytes (256 MiB)."""
    return int(os.environ.get("HVDD_ARENA_SIZE", 256 << 20))


def spin_seconds() -> float:
    """$HVDD_SPIN_US: how long a waiting thread first polls the channel
    before it sleeps on the socket (50 µs; the reader adapts it), in seconds."""
    return float(os.environ.get("HVDD_SPIN_US", "50")) * 1e-6


def channel_enabled() -> bool:
    """Whether requests go through the shared-memory channel; HVDD_CHANNEL=0
    sends them all on the socket."""
    return os.environ.get("HVDD_CHANNEL", "1") != "0"


def ring_bytes(default: int) -> int:
    """$HVDD_RING_BYTES: the channel's ring size, else default."""
    return int(os.environ.get("HVDD_RING_BYTES", default))


# ----------------------------------------------------- Horovod's job settings


def timeline() -> str:
    """$HOROVOD_TIMELINE: the timeline's file, or DYNAMIC; "" when unset."""
    return os.environ.get("HOROVOD_TIMELINE", "")


def timeline_mark_cycles() -> bool:
    """$HOROVOD_TIMELINE_MARK_CYCLES: whether the timeline marks cycles."""
    return os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "0") not in ("", "0")


def autotune_env() -> List[str]:
    """HOROVOD_AUTOTUNE and HOROVOD_AUTOTUNE_* as NAME=VALUE, for Hello: global
    rank 0's turn the daemon's autotuning on for the job (the log file's path
    made absolute, since the daemon writes it from its own directory)."""
    out = []
    for name, value in sorted(os.environ.items()):
        if name == "HOROVOD_AUTOTUNE" or name.startswith("HOROVOD_AUTOTUNE_"):
            if name == "HOROVOD_AUTOTUNE_LOG" and value:
                value = os.path.abspath(value)
            out.append(f"{name}={value}")
    return out


def dynamic_process_sets() -> bool:
    """$HOROVOD_DYNAMIC_PROCESS_SETS: process sets may be added and removed
    while the job runs (as ``init(process_sets="dynamic")``)."""
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0")


# ------------------------------------------------------------------- the rest


def hvdd_bin() -> str:
    """$HVDD_BIN: the hvdd binary a job started by mpirun or srun runs its
    daemon with; "" when unset."""
    return os.environ.get("HVDD_BIN") or ""


def hvdd_on_path() -> str:
    """The hvdd binary that $PATH finds; "" when none."""
    import shutil

    return shutil.which("hvdd") or ""


def torch_allocator_conf() -> Dict[str, str]:
    """torch's CUDA allocator settings (PYTORCH_CUDA_ALLOC_CONF and its newer
    name PYTORCH_ALLOC_CONF), those that are set, for
    :func:`hvdd._cuda.allocator_problem`."""
    return {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in os.environ}


def graph_wait_warn() -> float:
    """$HVDD_GRAPH_WAIT_WARN: after how many seconds a waiting TensorFlow
    graph collective warns (60)."""
    return float(os.environ.get("HVDD_GRAPH_WAIT_WARN", "60"))
