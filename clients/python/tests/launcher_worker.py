"""A rank started by mpirun, mpiexec or a fake srun (test_launchers.py), with
no hvdd run: it writes $RESULTS/rank-N.json with its place in the job, an
allreduce's result, and the pid of the daemon it reached (its socket's peer)."""

from __future__ import annotations

import json
import os
import socket
import struct


import hvdd.basics
import hvdd.torch as hvd
import torch

hvd.init()
c = hvdd.basics._client
assert c is not None and c._sock is not None
pid, _, _ = struct.unpack("3i", c._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
gathered = hvd.allgather(torch.tensor([hvd.rank()]))
info = dict(
    rank=hvd.rank(),
    size=hvd.size(),
    local_rank=hvd.local_rank(),
    local_size=hvd.local_size(),
    cross_rank=hvd.cross_rank(),
    cross_size=hvd.cross_size(),
    sum=float(total),
    gathered=gathered.tolist(),
    daemon_pid=pid,
    socket=c.socket_path,
    env_rank=int(
        os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", -1)))
    ),
)
hvd.shutdown()
# Each rank writes a file of its own: the launchers interleave the ranks' output.
with open(os.path.join(os.environ["RESULTS"], f"rank-{info['env_rank']}.json"), "w") as f:
    json.dump(info, f)
