"""Point-to-point transfers of the ``hvdd`` torch.distributed backend
(send, recv, isend, irecv, batch_isend_irecv): real torchrun jobs on a real
daemon that the job's processes start for themselves, with gloo as the
reference in the same processes (torch_p2p_workers.py runs every call on
both). The fixtures and helpers are test_torch_distributed.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from test_torch_distributed import _oks, env, new_torch, torchrun  # noqa: F401 (env: a fixture)

from hvdd._proto import hvdd_pb2 as pb
from hvdd._wire import encode_enqueue

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "torch_p2p_workers.py")


@new_torch
def test_send_recv_match_gloo(env: dict) -> None:  # noqa: F811
    """Every dtype in a ring of isend/irecv, empty and large tensors,
    blocking send/recv into non-contiguous tensors, works' states, a
    batch_isend_irecv ring both ways, tags and order, a recv posted before a
    collective, a subgroup, recv from any source refused: 3 ranks."""
    p = torchrun(env, ["p2p"], nproc=3, script=WORKERS)
    _oks(p.stdout, "p2p", 3)
    assert re.search(r"^bad peer: ValueError: .*invalid peer rank 6 for a group of 3", p.stdout, re.M), p.stdout


@new_torch
def test_mismatched_send_recv_raise_on_both_ranks(env: dict) -> None:  # noqa: F811
    p = torchrun(env, ["p2p_mismatch"], nproc=2, script=WORKERS)
    _oks(p.stdout, "p2p_mismatch", 2)
    for what, says in [("size", "must have the same size"), ("dtype", "must have the same dtype")]:
        raised = re.findall(rf"^RAISED {what}: (.*)$", p.stdout, re.M)
        assert len(raised) == 2, (what, p.stdout)
        for msg in raised:
            assert msg.startswith("DistBackendError") and says in msg and "rank 0 to rank 1" in msg, msg


@new_torch
def test_a_killed_peer_fails_the_transfer(env: dict) -> None:  # noqa: F811
    """Rank 2 is killed while rank 0 waits in a recv from it and rank 1 in
    a send to it: both raise within a few seconds naming rank 2 (gloo
    would wait out the 300 s timeout)."""
    p = torchrun(env, ["p2p_fault"], nproc=3, script=WORKERS, flags=["--monitor-interval=10"], check=False)
    raised = re.findall(r"^RAISED after ([\d.]+) s: (.*)$", p.stdout, re.M)
    assert len(raised) == 2, p.stdout
    for secs, msg in raised:
        assert float(secs) < 5.0, (secs, msg)
        assert msg.startswith("DistBackendError") and "rank 2 " in msg and "was lost" in msg, msg


@pytest.mark.parametrize("peer,tag", [(0, 0), (3, 0), (-1, 7), (2, -5), (1, 1 << 40)])
def test_send_recv_enqueue_matches_protobuf(peer: int, tag: int) -> None:
    """The hand-encoded Enqueue of a send or recv (peer_rank, tag after the
    device buffer) is protobuf's."""
    for op in (pb.OP_SEND, pb.OP_RECV):
        got = encode_enqueue(op, "n", pb.DTYPE_FLOAT32, [4], 5, 8, 16, 0, 1.0, 1.0, 0, None, 0, 0, 2, b"", peer, tag)
        e = pb.Enqueue(
            name="n",
            op=op,
            dtype=pb.DTYPE_FLOAT32,
            shape=[4],
            buffer=pb.Buffer(region=5, offset=8, length=16),
            process_set=2,
            peer_rank=peer,
            tag=tag,
        )
        assert got == pb.ClientMessage(enqueue=e).SerializeToString()


@new_torch
def test_send_recv_across_nodes(env: dict, hvdd_bin: str, tmp_path) -> None:  # noqa: F811
    """Under hvdd run on two "hosts" (loopback addresses, a daemon each, the
    tcp engine between them): transfers across the nodes and on each (see
    torch_p2p_workers.p2p_nodes)."""
    env = dict(env, HVDD_START_TIMEOUT="60")
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "4", "-H", "127.0.0.1:2,127.0.0.2:2", "--", sys.executable, WORKERS, "p2p_nodes"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout
    for r in range(4):
        assert f"OK p2p_nodes {r}" in p.stdout, p.stdout
    raised = re.findall(r"RAISED \d: (.*)$", p.stdout, re.M)
    assert len(raised) == 2, p.stdout
    for msg in raised:
        assert msg.startswith("DistBackendError") and "the send has 4 elements, the recv 8 elements" in msg, msg
