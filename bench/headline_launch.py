#!/usr/bin/env python3
"""Starts the peers' ranks across the network namespaces of bench/headline.sh.

    headline_launch.py --impl horovod|ddp|alone --hosts ADDR:NS:IFACE:SLOTS,... \
        --python PY -- SCRIPT ARGS...

Each rank runs as `ip netns exec NS env VARS PY SCRIPT ARGS...` in its host's
namespace, ranks placed host-major (host 0 gets ranks 0..SLOTS-1), and every
line it writes is tagged "[rank]" on this launcher's stdout. If a rank fails,
the others are killed and the launcher exits with its status.

horovod: what horovodrun --gloo gives its ranks (horovod/runner/gloo_run.py,
create_run_env_vars and create_slot_env_vars): this launcher serves Horovod's
own rendezvous (horovod.runner.http.http_server.RendezvousServer, initialised
with get_host_assignments of the hosts, as launch_gloo does) and sets
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo,
HOROVOD_CPU_OPERATIONS=gloo, HOROVOD_GLOO_IFACE (the host's veth),
HOROVOD_HOSTNAME, HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE
and PYTHONUNBUFFERED=1, beside the rest of its environment. Run it with the
Horovod venv's python, inside host 0's namespace, so that the other hosts reach
the rendezvous at host 0's address (horovodrun would reach them over ssh).

ddp: torch.distributed's env:// rendezvous as torchrun sets it: MASTER_ADDR
(host 0's address), MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, and GLOO_SOCKET_IFNAME (the host's veth).

alone: the same ranks as ddp, each a job of its own (WORLD_SIZE=1, its own
MASTER_PORT on 127.0.0.1): the compute of the placement, without the
gradients' exchange.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading


def parse_hosts(s):
    hosts = []
    for item in s.split(","):
        addr, ns, iface, slots = item.split(":")
        hosts.append({"addr": addr, "ns": ns, "iface": iface, "slots": int(slots)})
    return hosts


def rank_envs(args, hosts):
    """One (host, env) per rank, in rank order."""
    size = sum(h["slots"] for h in hosts)
    out = []
    if args.impl == "horovod":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts as hvd_parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        plan = get_host_assignments(hvd_parse_hosts(",".join("%s:%d" % (h["addr"], h["slots"]) for h in hosts)), size)
        server = RendezvousServer(verbose=0)
        port = server.start()
        server.init(plan)
        by_addr = {h["addr"]: h for h in hosts}
        for si in plan:
            h = by_addr[si.hostname]
            out.append(
                (
                    h,
                    {
                        "HOROVOD_GLOO_RENDEZVOUS_ADDR": hosts[0]["addr"],
                        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                        "HOROVOD_CONTROLLER": "gloo",
                        "HOROVOD_CPU_OPERATIONS": "gloo",
                        "HOROVOD_GLOO_IFACE": h["iface"],
                        "NCCL_SOCKET_IFNAME": h["iface"],
                        "HOROVOD_HOSTNAME": si.hostname,
                        "HOROVOD_RANK": str(si.rank),
                        "HOROVOD_SIZE": str(si.size),
                        "HOROVOD_LOCAL_RANK": str(si.local_rank),
                        "HOROVOD_LOCAL_SIZE": str(si.local_size),
                        "HOROVOD_CROSS_RANK": str(si.cross_rank),
                        "HOROVOD_CROSS_SIZE": str(si.cross_size),
                        "PYTHONUNBUFFERED": "1",
                    },
                )
            )
        return out
    rank = 0
    for h in hosts:
        for local in range(h["slots"]):
            if args.impl == "ddp":
                env = {
                    "MASTER_ADDR": hosts[0]["addr"],
                    "MASTER_PORT": str(args.port),
                    "RANK": str(rank),
                    "WORLD_SIZE": str(size),
                    "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(h["slots"]),
                    "GLOO_SOCKET_IFNAME": h["iface"],
                }
            else:  # alone
                env = {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(args.port + rank),
                    "RANK": "0",
                    "WORLD_SIZE": "1",
                    "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1",
                }
            env["PYTHONUNBUFFERED"] = "1"
            out.append((h, env))
            rank += 1
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--impl", choices=("horovod", "ddp", "alone"), required=True)
    p.add_argument("--hosts", required=True, help="ADDR:NS:IFACE:SLOTS,...")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--port", type=int, default=29531, help="MASTER_PORT (ddp; alone: the first of one per rank)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no script given")

    procs = []
    lock = threading.Lock()

    def pump(rank, stream):
        for line in iter(stream.readline, b""):
            with lock:
                sys.stdout.write("[%d] %s" % (rank, line.decode(errors="replace")))
                sys.stdout.flush()

    threads = []
    for rank, (h, env) in enumerate(rank_envs(args, parse_hosts(args.hosts))):
        full = dict(os.environ)
        full.update(env)
        argv = ["ip", "netns", "exec", h["ns"], args.python] + cmd
        pr = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(pr)
        t = threading.Thread(target=pump, args=(rank, pr.stdout), daemon=True)
        t.start()
        threads.append(t)

    def kill_all(sig):
        for pr in procs:
            if pr.poll() is None:
                try:
                    os.killpg(pr.pid, sig)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, lambda *_: (kill_all(signal.SIGKILL), sys.exit(143)))
    status = 0
    pending = set(range(len(procs)))
    while pending:
        for i in list(pending):
            try:
                rc = procs[i].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pending.discard(i)
            if rc != 0 and status == 0:
                status = rc if rc > 0 else 128 - rc
                print("[launcher] rank %d exited with %d; killing the others" % (i, rc), flush=True)
                kill_all(signal.SIGKILL)
    for t in threads:
        t.join(timeout=5)
    sys.exit(status)


if __name__ == "__main__":
    main()
