#!/usr/bin/env python3
"""Elastic recovery time: from a worker's SIGKILL to the first training
step the survivors complete at the new size (detection, the survivors'
restore and reset, the daemons re-forming the job, the state sync from rank
0 and one step's allreduce included).

Each run is ``hvdd run -np N --min-np N-1`` of tests/elastic_job_worker.py:
the last rank kills itself at step 3, and the survivors print when their
step 3 completed at the new size. The recovery of a run is the latest
survivor's time minus the kill's. By default the job runs on one node (a
private daemon); with ``--netns`` on two "hosts", network namespaces joined
by a veth pair (root and ip(8) needed), started through an agent that enters
the namespace: the victim is its host's only rank (N-1 ranks on the other),
since Horovod's driver blacklists a failed worker's host with all its slots
and hvdd run's decides each epoch's members the same way (the survivors wait
in init() until it has seen the exit). Each namespace also has a veth
pair to the root namespace, where hvdd run (its elastic driver serves the
job's rendezvous) runs, as a launching machine reaches its hosts. With
``--victim 0`` rank 0 kills itself instead: with ``--netns`` it is then the
first host's only rank, so that host leaves the job and the coordination of the job
moves from its daemon (node 0) to the other host's. With ``--exit raise`` the
victim leaves by an exception out of its training function instead (exit
status 1 through Python's exit path: its atexit tells the daemon that the
process exits), timed from the moment it raises.

Usage (from the repository root, after ``go build -o bin/hvdd ./cmd/hvdd``)::

    .venv/bin/python clients/python/bench/elastic_recovery.py [--runs 5] [--np 3] [--netns] [--victim 0] [--exit raise]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
WORKER = os.path.join(ROOT, "clients", "python", "tests", "elastic_job_worker.py")


NETNS = [("hvddbench0", "10.214.0.1", "hvb0"), ("hvddbench1", "10.214.0.2", "hvb1")]
# Each namespace's link to the root namespace: root side, its address, the
# namespace's side, its address.
ROOTLINKS = [("hvr0", "10.214.1.1", "hvn0", "10.214.1.2"), ("hvr1", "10.214.2.1", "hvn1", "10.214.2.2")]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def make_netns() -> None:
    """Two namespaces joined by a veth pair (removed by drop_netns)."""
    drop_netns()
    for ns, _, _ in NETNS:
        sh("ip", "netns", "add", ns)
    (ns0, _, if0), (ns1, _, if1) = NETNS
    sh("ip", "link", "add", if0, "netns", ns0, "type", "veth", "peer", "name", if1, "netns", ns1)
    for ns, addr, ifname in NETNS:
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", addr + "/24", "dev", ifname)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ifname, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    for (ns, host, _), (rif, raddr, nif, naddr) in zip(NETNS, ROOTLINKS):
        sh("ip", "link", "add", rif, "type", "veth", "peer", "name", nif, "netns", ns)
        sh("ip", "addr", "add", raddr + "/24", "dev", rif)
        sh("ip", "link", "set", rif, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", naddr + "/24", "dev", nif)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", nif, "up")
        # The root namespace reaches the host by its name (the address on
        # the hosts' link) through this pair.
        sh("ip", "route", "add", host + "/32", "dev", rif, "src", raddr)
        sh("ip", "netns", "exec", ns, "ip", "route", "add", raddr + "/32", "dev", nif)


def drop_netns() -> None:
    for ns, _, _ in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for rif, _, _, _ in ROOTLINKS:
        subprocess.run(["ip", "link", "del", rif], capture_output=True)


def where(tmp: str, np: int, netns: bool, victim: int) -> list:
    """hvdd run's placement flags: a private socket, or the two namespaces
    through an agent script that enters the named host's one."""
    if not netns:
        return ["--socket", os.path.join(tmp, "hvdd.sock")]
    agent = os.path.join(tmp, "agent")
    cases = "".join(f"{addr}) ns={ns} ;;\n" for ns, addr, _ in NETNS)
    with open(agent, "w") as f:
        f.write(f'#!/bin/sh\ncase "$1" in\n{cases}*) exit 255 ;;\nesac\nexec ip netns exec "$ns" sh -c "$2"\n')
    os.chmod(agent, 0o755)
    (_, a0, _), (_, a1, _) = NETNS
    slots = (1, np - 1) if victim == 0 else (np - 1, 1)  # the victim alone on its host
    return ["-H", f"{a0}:{slots[0]},{a1}:{slots[1]}", "--agent", agent]


def one_run(hvdd: str, np: int, netns: bool, victim: int, exit_mode: str) -> float:
    with tempfile.TemporaryDirectory(prefix="hvdd-elastic-bench-") as tmp:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_TEST_EXIT=exit_mode)
        if victim >= 0:
            env["HVDD_TEST_VICTIM"] = str(victim)
        p = subprocess.run(
            [hvdd, "run", "-np", str(np), "--min-np", str(np - 1), *where(tmp, np, netns, victim), "--",
             sys.executable, WORKER, "6", "3"],
            env=env, capture_output=True, text=True, timeout=300, cwd=tmp,
        )  # fmt: skip
        if p.returncode != 0:
            raise SystemExit(f"elastic run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        kill = [float(l.split("KILL ")[1]) for l in p.stdout.splitlines() if "KILL " in l]
        rec = [float(l.split("RECOVERED ")[1].split()[0]) for l in p.stdout.splitlines() if "RECOVERED " in l]
        if len(kill) != 1 or len(rec) != np - 1:
            raise SystemExit(f"unexpected output:\n{p.stdout}")
        return max(rec) - kill[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="elastic jobs to run")
    ap.add_argument("--np", type=int, default=3, help="ranks at the start (one is killed)")
    ap.add_argument("--hvdd", default=os.path.join(ROOT, "bin", "hvdd"), help="hvdd binary")
    ap.add_argument("--netns", action="store_true", help="two hosts: network namespaces joined by a veth pair (root)")
    ap.add_argument("--victim", type=int, default=-1, help="the rank killed (default: the last; 0: host 0's only rank)")
    ap.add_argument(
        "--exit", choices=["kill", "raise"], default="kill", help="how the victim leaves: SIGKILL or an exception"
    )
    a = ap.parse_args()
    if a.netns:
        make_netns()
    times = []
    try:
        for i in range(a.runs):
            t = one_run(a.hvdd, a.np, a.netns, a.victim, a.exit)
            times.append(t)
            print(f"run {i + 1}: recovery {t * 1000:.0f} ms", flush=True)
    finally:
        if a.netns:
            drop_netns()
    hosts = "two hosts (netns)" if a.netns else "one node"
    victim = "rank 0" if a.victim == 0 else "the last rank" if a.victim < 0 else f"rank {a.victim}"
    how = "killed" if a.exit == "kill" else "raised"
    print(
        f"median recovery {statistics.median(times) * 1000:.0f} ms over {a.runs} runs "
        f"(np {a.np} -> {a.np - 1}, {hosts}, {victim} {how})"
    )


if __name__ == "__main__":
    main()
