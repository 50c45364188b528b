#!/usr/bin/env python3
"""hvdd's elastic fault campaign (issue 31, item 3): one elastic PyTorch job
after another on 4 "hosts" (network namespaces on a bridge, 2 slots each),
started by ``hvdd run -np 8 --min-np 2 --host-discovery-script ...``, with
faults drawn from a seed injected at random moments, and after every fault
the checks that Horovod's elastic rules give: the job trains again within a
bound, every rank holds the weights a replay of the committed steps gives,
every data epoch covers the data set once, every epoch's membership is one
Horovod's driver would form, and nothing is left over after the job. See
README.md beside this file.

Run as root (network namespaces): .venv/bin/python bench/chaos/chaos.py --help
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

HOSTS = 4
SLOTS = 2
MIN_NP = 2
COOLDOWN = (3, 6)  # --blacklist-cooldown-range: every cooldown is min(6, 3*2^n + 3u) = 6 s
PEER_TIMEOUT = 3.0  # the daemons' failure detection
REPORT_WAIT = 10.0  # hvdd run's wait for the daemons' reports
ELASTIC_TIMEOUT = 30
# Outages below the detection bound, and past it: silent for the peer
# timeout, then hvdd run's report wait, with 5 s to spare.
SHORT, LONG = 1.0, PEER_TIMEOUT + REPORT_WAIT + 5.0
DETECT = PEER_TIMEOUT + REPORT_WAIT + 2.0  # by then a long outage's host is out and the job trains

# Every kind of fault; the schedule draws each of them in turn (shuffled).
KINDS = [
    "rank_kill",  # a rank SIGKILLs itself in a step / an allreduce / a commit, or is killed from outside
    "rank_raise",  # an exception out of the training function
    "rank_exit0",  # an early os._exit(0): a success, the job's last fault
    "daemon_kill",  # a host's daemon SIGKILLed
    "daemon_stop_short",  # SIGSTOP for less than the peer timeout, then SIGCONT
    "daemon_stop_long",  # SIGSTOP past the report wait, then SIGCONT
    "link_down_short",  # ip link set veth0 down, less than the peer timeout
    "link_down_long",  # ... past the report wait, then up
    "link_drop_long",  # tc: the link drops (almost) everything past the report wait
    "discovery_remove",  # the discovery script stops listing a host (then lists it again)
    "cooldown_return",  # a rank killed; its host must come back after the cooldown
    "coordinator_lost",  # the daemon of rank 0's host killed
    "two_hosts_lost",  # two hosts' daemons killed at once, the coordinator's among them
    "second_fault",  # a rank killed, then another host's rank while the job re-forms
]
# Faults after which a host is expected out of the job (Horovod: a failed
# worker's host is blacklisted with all its slots).
FAILING = {
    "rank_kill",
    "rank_raise",
    "daemon_kill",
    "daemon_stop_long",
    "link_down_long",
    "link_drop_long",
    "cooldown_return",
    "coordinator_lost",
    "two_hosts_lost",
    "second_fault",
}
PHASES = ["step", "allreduce", "commit", "outside"]
BREAKS = ["restore", "leak", "hang", "membership"]


def now() -> float:
    return time.time()


# ---------------------------------------------------------------- schedule


def draw_schedule(seed: int, n: int, per_job: int, kinds: List[str] = KINDS) -> List[List[dict]]:
    """n faults from seed, every kind in turn (each round of kinds shuffled),
    split into jobs of at most per_job faults; an early success
    (rank_exit0) ends its job (nothing is added to a job after it)."""
    rng = random.Random(seed)
    faults = []
    while len(faults) < n:
        drawn = kinds[:]
        rng.shuffle(drawn)
        faults += drawn
    faults = faults[:n]
    jobs: List[List[dict]] = [[]]
    for kind in faults:
        f = {
            "kind": kind,
            "delay": round(rng.uniform(0.3, 2.5), 2),  # after the job has settled
            "victim": rng.randrange(1000),  # which rank / host, modulo what runs then
            "other": rng.randrange(1000),
            "phase": rng.choice(PHASES),
            "residue": rng.randrange(3),  # the step (mod the commit interval) a rank acts in
            "gap": round(rng.uniform(0.3, 2.0), 2),  # second_fault: the second one's delay
            # hit while hosts are still out (in their cooldown), instead of
            # waiting for the job to take them back
            "stack": rng.random() < 0.3,
        }
        if len(jobs[-1]) >= per_job:
            jobs.append([])
        jobs[-1].append(f)
        if kind == "rank_exit0":
            jobs.append([])
    return [j for j in jobs if j]


# ---------------------------------------------------------------- hosts


class Net:
    """HOSTS namespaces (10.77.0.1..) and one for hvdd run (10.77.0.254's
    place: 10.77.0.HOSTS+1) on a bridge in a namespace of its own
    (daemon/daemontest/bridge.sh): nothing in the root namespace."""

    def __init__(self, work: str) -> None:
        self.prefix = f"hvch{os.getpid()}"
        self.n = HOSTS + 1
        self.work = work
        self.up = False

    def bridge(self, verb: str) -> None:
        subprocess.run(
            ["bash", os.path.join(ROOT, "daemon/daemontest/bridge.sh"), verb, self.prefix, str(self.n)],
            check=True,
            timeout=60,
            stdout=subprocess.DEVNULL,
        )

    def create(self) -> None:
        self.bridge("up")
        self.up = True

    def destroy(self) -> None:
        if self.up:
            self.bridge("down")
            self.up = False

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @staticmethod
    def addr(i: int) -> str:
        return f"10.77.0.{i + 1}"

    def host_index(self, addr: str) -> int:
        return int(addr.rsplit(".", 1)[1]) - 1

    def driver_ns(self) -> str:
        return self.ns(HOSTS)

    def pids(self, i: int) -> List[int]:
        r = subprocess.run(["ip", "netns", "pids", self.ns(i)], capture_output=True, text=True, timeout=10)
        return [int(p) for p in r.stdout.split()]

    def ip(self, i: int, *args: str) -> None:
        subprocess.run(["ip", "-n", self.ns(i), *args], check=False, timeout=10, capture_output=True)

    def tc(self, i: int, *args: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns(i), "tc", *args], check=False, timeout=10, capture_output=True)

    def brtc(self, i: int, *args: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", f"{self.prefix}br", "tc", *args], check=False, timeout=10, capture_output=True
        )

    def write_agent(self) -> str:
        path = os.path.join(self.work, "agent")
        cases = "\n".join(f"{self.addr(i)}) ns={self.ns(i)} ;;" for i in range(HOSTS))
        with open(path, "w") as f:
            f.write(
                "#!/bin/sh\n# hvdd run's agent: host 10.77.0.K is a namespace (as ssh HOST COMMAND)\n"
                f'host=$1; shift\ncase "$host" in\n{cases}\n*) echo "agent: unknown host $host" >&2; exit 255 ;;\nesac\n'
                'exec ip netns exec "$ns" env CHAOS_HOST="$host" sh -c "$*"\n'
            )
        os.chmod(path, 0o755)
        return path


def proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_daemon(pid: int) -> bool:
    """Whether pid is an hvdd daemon itself (argv: .../hvdd serve ...), not
    the agent's shell that runs it."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and os.path.basename(argv[0]) == b"hvdd" and argv[1] == b"serve"


def count_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def fd_kinds(pid: int) -> Dict[str, int]:
    """What a process's open fds are, by kind: socket, pipe, memfd:NAME
    (digits dropped, so one pool's regions count together), anon_inode:...,
    or the file's path, so that a leak says what leaked."""
    out: Dict[str, int] = collections.Counter()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return dict(out)
    for n in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        kind = target.split(":[", 1)[0] if target.startswith(("socket:", "pipe:")) else target
        if kind.startswith("/memfd:"):
            kind = "memfd:" + "".join(c for c in kind[len("/memfd:") :] if not c.isdigit()).replace(" (deleted)", "")
        out[kind] += 1
    return dict(out)


def count_goroutines(pid: int) -> int:
    """The daemon's goroutines, from its status (``hvdd status --json`` on
    the --socket of its command line: a Unix socket, reached from any
    namespace); -1 when it does not answer (stopped, gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        sock = argv[argv.index(b"--socket") + 1].decode()
        out = subprocess.run(
            [os.path.join(ROOT, "bin/hvdd"), "status", "--json", "--socket", sock],
            capture_output=True,
            text=True,
            timeout=3,
        )
        return int(json.loads(out.stdout).get("goroutines", -1)) if out.returncode == 0 else -1
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return -1


def count_threads(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


RETURN_S = 25.0  # after its cooldown, a host has a new daemon and new ranks training within this
STRAGGLE_S = 8.0  # a process still there this long after hvdd run exited is a leak

SHM_NAMES = re.compile(r"hvdd|chaos|torch|nccl|psm", re.I)


def shm_entries() -> set:
    try:
        return {e for e in os.listdir("/dev/shm") if SHM_NAMES.search(e)}
    except OSError:
        return set()


# ---------------------------------------------------------------- one job


class Job:
    """One hvdd run of the worker, its output parsed as it comes, and the
    faults injected into it."""

    def __init__(self, camp: "Campaign", index: int, faults: List[dict]) -> None:
        self.camp, self.net, self.index, self.faults = camp, camp.net, index, faults
        self.dir = os.path.join(camp.work, f"job{index}")
        os.makedirs(os.path.join(self.dir, "act"))
        self.events: List[dict] = []  # CHAOS lines, with "at" (arrival time)
        self.stderr: List[tuple] = []  # (arrival, line) of hvdd run's stderr and untagged output
        self.lock = threading.Lock()
        self.listed = list(range(HOSTS))  # what the discovery script prints
        self.write_hosts()
        self.blacklist: Dict[int, List[float]] = collections.defaultdict(list)  # host -> fault times
        self.removed: Dict[int, float] = {}  # host -> when discovery dropped it
        self.added: Dict[int, float] = {}  # host -> when discovery listed it again
        self.exit0: Optional[float] = None
        self.records: List[dict] = []  # one per fault, filled in by inject/measure
        self.fd_samples: Dict[int, List[tuple]] = collections.defaultdict(
            list
        )  # daemon pid -> (t, fds, threads, host, fd kinds, goroutines)
        self.stragglers = 0
        self.terminated = False  # the campaign SIGTERMed hvdd run (its status is then 143)
        self.rc: Optional[int] = None
        self.ended: Optional[float] = None

    # --- discovery
    def write_hosts(self) -> None:
        tmp = os.path.join(self.dir, "hosts.tmp")
        with open(tmp, "w") as f:
            f.write("".join(f"{Net.addr(i)}:{SLOTS}\n" for i in self.listed))
        os.replace(tmp, os.path.join(self.dir, "hosts"))

    # --- process
    def start(self) -> None:
        disc = os.path.join(self.dir, "discover")
        with open(disc, "w") as f:
            f.write(f"#!/bin/sh\ncat {os.path.join(self.dir, 'hosts')}\n")
        os.chmod(disc, 0o755)
        env = dict(
            os.environ,
            CHAOS_DIR=self.dir,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
            CHAOS_PACE=str(self.camp.args.pace),
        )
        if self.camp.args.break_kind in ("restore", "leak", "hang"):
            env["CHAOS_BREAK"] = self.camp.args.break_kind
            env["CHAOS_HANG_S"] = str(self.camp.args.bound + 15)
        # --break membership: 6 ranks on 3 hosts where the model (and Horovod, with 8) has 4
        np_ = 6 if self.camp.args.break_kind == "membership" else HOSTS * SLOTS
        max_np = ["--max-np", "6"] if self.camp.args.break_kind == "membership" else []
        cmd = [
            "ip", "netns", "exec", self.net.driver_ns(),
            os.path.join(ROOT, "bin/hvdd"), "run", "-np", str(np_), "--min-np", str(MIN_NP), *max_np,
            "--host-discovery-script", disc, "--agent", self.camp.agent,
            "--blacklist-cooldown-range", str(COOLDOWN[0]), str(COOLDOWN[1]),
            "--elastic-timeout", str(ELASTIC_TIMEOUT), "--start-timeout", "60",
            # the daemons' Info lines (each epoch's decision, layout and
            # re-formation, a few per fault) in the job's stderr, for the
            # time from hvdd run's decision to the next step
            "--log-level", "info",
            "--", os.path.join(ROOT, ".venv/bin/python"), os.path.join(HERE, "worker.py"),
        ]  # fmt: skip
        self.cmd = cmd
        self.t0 = now()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
        )
        self.readers = [
            threading.Thread(target=self.read, args=(self.proc.stdout, "out"), daemon=True),
            threading.Thread(target=self.read, args=(self.proc.stderr, "err"), daemon=True),
            threading.Thread(target=self.sample, daemon=True),
        ]
        for t in self.readers:
            t.start()

    def read(self, stream: Any, name: str) -> None:
        log = open(os.path.join(self.dir, f"std{name}"), "w")
        for line in stream:
            at = now()
            log.write(f"{at:.3f} {line}")
            m = re.match(r"\[(\d+)\]<stdout>:CHAOS (\{.*\})\s*$", line)
            with self.lock:
                if m:
                    try:
                        ev = json.loads(m.group(2))
                    except ValueError:
                        continue
                    ev["at"] = at
                    ev["tag"] = int(m.group(1))  # hvdd run's tag: $HVDD_RANK repeats for a host's new ranks
                    self.events.append(ev)
                elif name == "err" or "<stdout>" not in line:
                    self.stderr.append((at, line.rstrip("\n")))
        log.close()

    def sample(self) -> None:
        """Every 2 s: each host daemon's open fds and threads."""
        while self.proc.poll() is None:
            for i in range(HOSTS):
                for pid in self.net.pids(i):
                    if is_daemon(pid):
                        self.fd_samples[pid].append(
                            (now(), count_fds(pid), count_threads(pid), i, fd_kinds(pid), count_goroutines(pid))
                        )
            time.sleep(2)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float) -> None:
        """Asks the ranks to stop at their next commit; then terminates."""
        open(os.path.join(self.dir, "stop"), "w").close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.note_stderr("campaign: hvdd run did not end %ds after the stop; SIGTERM" % timeout)
            self.terminated = True
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.rc = self.proc.returncode
        self.ended = now()
        for t in self.readers[:2]:
            t.join(10)

    def note_stderr(self, text: str) -> None:
        with self.lock:
            self.stderr.append((now(), text))

    # --- what runs now
    def snapshot(self) -> List[dict]:
        with self.lock:
            return list(self.events)

    def rounds(self, evs: Optional[List[dict]] = None) -> Dict[str, dict]:
        """rid -> {start, members {tag: round event}, size}."""
        out: Dict[str, dict] = {}
        for e in evs if evs is not None else self.snapshot():
            if e["ev"] == "round":
                r = out.setdefault(e["rid"], {"rid": e["rid"], "start": e["at"], "members": {}, "size": e["size"]})
                r["members"][e["tag"]] = e
                r["start"] = min(r["start"], e["at"])
        return out

    def current_round(self) -> Optional[dict]:
        rs = sorted(self.rounds().values(), key=lambda r: r["start"])
        return rs[-1] if rs else None

    def last_step_at(self) -> float:
        with self.lock:
            for e in reversed(self.events):
                if e["ev"] == "step":
                    return e["at"]
        return 0.0

    def round_hosts(self, r: dict) -> Dict[int, int]:
        c: Dict[int, int] = collections.Counter()
        for e in r["members"].values():
            c[self.net.host_index(e["host"])] += 1
        return dict(c)

    def expected_hosts(self, t: float) -> set:
        """Hosts Horovod's driver would have in the job at t, once settled:
        listed, not in a cooldown, not cut off."""
        out = set()
        for i in self.listed:
            if any(t - b < COOLDOWN[1] + 0.5 for b in self.blacklist.get(i, [])):
                continue
            if i in self.camp.cut:
                continue
            out.add(i)
        return out

    def wait_settled(self, bound: float, full: bool = False) -> bool:
        """Until the current round holds every host expected and steps; with
        full, first until every cooldown has ended (the hosts back)."""
        if full:
            last = max([b for times in self.blacklist.values() for b in times] + [0])
            time.sleep(max(0.0, min(last + COOLDOWN[1] + 1 - now(), COOLDOWN[1] + 1)))
        deadline = now() + bound
        while now() < deadline and self.alive():
            r = self.current_round()
            want = self.expected_hosts(now())
            if self.exit0 is not None:
                return self.last_step_at() > now() - 2
            if r and set(self.round_hosts(r)) >= want and self.last_step_at() > now() - 2:
                return True
            time.sleep(0.3)
        return False

    # --- faults
    def ranks_now(self) -> List[dict]:
        r = self.current_round()
        if not r:
            return []
        return sorted(r["members"].values(), key=lambda e: e["rank"])

    def daemon_pid(self, host: int) -> Optional[int]:
        for pid in self.net.pids(host):
            if is_daemon(pid):
                return pid
        return None

    def act(self, rank_ev: dict, mode: str, phase: str, residue: int) -> None:
        """A rank acts on itself at phase of a step with n % 3 == residue."""
        if phase == "outside":
            # from outside, at a random moment: SIGKILL (raise/exit0 need the rank itself)
            if mode == "kill":
                try:
                    os.kill(rank_ev["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            phase = "step"
        path = os.path.join(self.dir, "act", str(rank_ev["pid"]))
        with open(path + ".tmp", "w") as f:
            f.write(f"{mode} {phase} {residue}")
        os.replace(path + ".tmp", path)

    def wait_acted(self, pid: int, rec: dict, timeout: float = 10) -> None:
        """Until the rank took its act file; the fault's time is then when
        it acted (its act line)."""
        path = os.path.join(self.dir, "act", str(pid))
        deadline = now() + timeout
        while os.path.exists(path) and now() < deadline:
            time.sleep(0.05)
        if os.path.exists(path):
            os.unlink(path)
            rec["note"] += " (never acted: the rank did not reach the phase)"
            return
        for e in reversed(self.snapshot()):
            if e["ev"] == "act" and e["pid"] == pid:
                rec["t"] = e["t"]
                return

    def inject(self, f: dict) -> dict:
        """Injects fault f now; returns its record."""
        kind = f["kind"]
        ranks = self.ranks_now()
        rec = {
            "kind": kind,
            "fault": f,
            "t": now(),
            "hosts_before": sorted(self.round_hosts(self.current_round() or {"members": {}})),
            "failed": [],
            "note": "",
        }
        rid_before = (self.current_round() or {}).get("rid")
        rec["rid_before"] = rid_before
        if not ranks:
            rec["note"] = "no ranks running"
            return rec
        victim = ranks[f["victim"] % len(ranks)]
        if self.camp.args.break_kind:
            victim = ranks[-1]  # not rank 0: the broken rank 0 must live on
        vhost = self.net.host_index(victim["host"])
        coord = self.net.host_index(ranks[0]["host"])
        phase, residue = f["phase"], f["residue"]
        if self.camp.args.break_kind == "restore":
            phase, residue = "allreduce", 2  # two uncommitted steps to lose
        if kind in ("rank_kill", "cooldown_return"):
            self.act(victim, "kill", phase, residue)
            rec["failed"] = [vhost]
            rec["note"] = f"rank {victim['rank']} (tag {victim['tag']}) on host {vhost}, {phase}"
            self.wait_acted(victim["pid"], rec)
        elif kind in ("rank_raise", "rank_exit0"):
            mode = "raise" if kind == "rank_raise" else "exit0"
            self.act(victim, mode, phase, residue)
            rec[
                "note"
            ] = f"rank {victim['rank']} (tag {victim['tag']}) on host {vhost}, {phase if phase != 'outside' else 'step'}"
            self.wait_acted(victim["pid"], rec)
            if mode == "raise":
                rec["failed"] = [vhost]
            else:
                self.exit0 = now()
                rec["exit0_host"] = vhost
        elif kind in ("daemon_kill", "coordinator_lost", "two_hosts_lost"):
            hosts = [vhost] if kind == "daemon_kill" else [coord]
            if kind == "two_hosts_lost":
                others = sorted({self.net.host_index(e["host"]) for e in ranks} - {coord})
                if others:
                    hosts.append(others[f["other"] % len(others)])
            for h in hosts:
                pid = self.daemon_pid(h)
                if pid:
                    os.kill(pid, signal.SIGKILL)
            rec["failed"] = hosts
            rec["note"] = f"daemons of hosts {hosts} (coordinator {coord})"
        elif kind.startswith("daemon_stop"):
            pid = self.daemon_pid(vhost)
            dur = SHORT if kind.endswith("short") else LONG
            if pid:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(dur)
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:  # hvdd run stopped it meanwhile (its host blacklisted)
                    rec["note"] += "; gone before SIGCONT (stopped by hvdd run)"
            rec["failed"] = [vhost] if dur > SHORT else []
            rec["note"] = f"daemon of host {vhost} stopped {dur:g} s"
            rec["t_end"] = now()
        elif kind.startswith("link_"):
            dur = SHORT if kind.endswith("short") else LONG
            self.camp.cut.add(vhost)
            if kind.startswith("link_down"):
                self.net.ip(vhost, "link", "set", "veth0", "down")
            else:
                tbf = ["root", "tbf", "rate", "8kbit", "burst", "1600", "limit", "1"]
                self.net.tc(vhost, "qdisc", "replace", "dev", "veth0", *tbf)
                self.net.brtc(vhost, "qdisc", "replace", "dev", f"port{vhost}", *tbf)
            time.sleep(dur)
            if kind.startswith("link_down"):
                self.net.ip(vhost, "link", "set", "veth0", "up")
            else:
                self.net.tc(vhost, "qdisc", "del", "dev", "veth0", "root")
                self.net.brtc(vhost, "qdisc", "del", "dev", f"port{vhost}", "root")
            self.camp.cut.discard(vhost)
            # The job's only host loses contact with nobody (its agent is
            # no network connection here): no failure, the job trains on.
            alone = rec["hosts_before"] == [vhost]
            rec["alone"] = alone
            rec["failed"] = [vhost] if dur > SHORT and not alone else []
            rec["note"] = f"host {vhost}'s link {'down' if 'down' in kind else 'dropping'} {dur:g} s"
            if alone:
                rec["note"] += " (the job's only host: no failure)"
            rec["t_end"] = now()
        elif kind == "discovery_remove":
            self.listed = [i for i in self.listed if i != vhost]
            self.write_hosts()
            self.removed[vhost] = now()
            rec["removed"] = vhost
            rec["note"] = f"host {vhost} no longer listed"
        elif kind == "second_fault":
            self.act(victim, "kill", "outside", 0)
            others = [e for e in ranks if self.net.host_index(e["host"]) != vhost]
            time.sleep(f["gap"])
            rec["failed"] = [vhost]
            if others:
                second = others[f["other"] % len(others)]
                try:
                    os.kill(second["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rec["failed"].append(self.net.host_index(second["host"]))
            rec["note"] = f"rank on host {vhost} killed, then one on host {rec['failed'][1:]} {f['gap']} s later"
        for h in rec["failed"]:
            self.blacklist[h].append(rec["t"])
        self.records.append(rec)
        return rec

    def measure(self, rec: dict, bound: float) -> None:
        """Waits for the job to train again after rec's fault: the first
        step of an epoch started after the fault (a fault that needs no
        re-formation: the first step after it ended)."""
        t = rec["t"]
        t_end = rec.get("t_end", t)
        if rec["failed"] and not set(rec["hosts_before"]) - set(rec["failed"]):
            # no running rank is left: Horovod's driver ends the job (new
            # ranks would have no state to start from), hvdd run must exit
            # non-zero within seconds
            rec["expect_end"] = True
            try:
                self.proc.wait(REPORT_WAIT + 10)
                rec["ended"] = True
                rec["exit_after"] = now() - t
            except subprocess.TimeoutExpired:
                rec["hang"] = True
                rec["note"] += f"; no rank left, but hvdd run neither exits nor trains {REPORT_WAIT + 10:g}s later"
            return
        disruptive = bool(rec["failed"]) or rec["kind"] in ("rank_exit0", "discovery_remove")
        deadline = t_end + bound
        while now() < deadline:
            evs = self.snapshot()
            rounds = self.rounds(evs)
            for e in evs:
                # a failure: the job may (must, for a long outage) go on
                # without the host before the outage ends
                if e["ev"] != "step" or e["at"] < (t if disruptive else t_end):
                    continue
                r = rounds.get(e["rid"])
                if disruptive and (r is None or e["rid"] == rec["rid_before"] or r["start"] < t):
                    continue
                rec["recovery"] = e["at"] - t
                rec["rid_after"] = e["rid"]
                if r:
                    rec["hosts_after"] = self.round_hosts(r)
                    rec["size_after"] = r["size"]
                if rec["kind"] == "cooldown_return":
                    self.measure_return(rec, bound)
                return
            if not self.alive():
                rec["ended"] = True
                return
            time.sleep(0.2)
        rec["hang"] = True

    def measure_return(self, rec: dict, bound: float) -> None:
        """cooldown_return: the time from the fault to the first step of an
        epoch that has the failed host back (its cooldown, a new daemon and
        new ranks)."""
        h = rec["failed"][0]
        deadline = rec["t"] + COOLDOWN[1] + bound
        while now() < deadline and self.alive():
            evs = self.snapshot()
            rounds = self.rounds(evs)
            for e in evs:
                if e["ev"] != "step":
                    continue
                r = rounds.get(e["rid"])
                if r and r["start"] > rec["t"] + COOLDOWN[0] and h in self.round_hosts(r):
                    rec["recovery"] = e["at"] - rec["t"]
                    rec["note"] += f"; back after {rec['recovery']:.1f}s"
                    return
            time.sleep(0.3)
        if self.alive():
            rec["hang"] = True
            rec["note"] += f"; not back within the cooldown + {bound:g}s"

    def after_fault(self, rec: dict) -> None:
        """What follows a fault before the next: a host dropped from
        discovery is listed again; a host in its cooldown is waited for."""
        if rec["kind"] == "discovery_remove" and "removed" in rec:
            time.sleep(2)
            h = rec["removed"]
            self.listed = sorted(self.listed + [h])
            self.write_hosts()
            self.added[h] = now()
            rec["readded"] = now()


# ---------------------------------------------------------------- checks


def replay_history(job: Job, problems: List[str]) -> dict:
    """The divergence and sampler checks over a finished job's events."""
    import worker

    x, y = worker.data()
    X, Y = x.tolist(), [v[0] for v in y.tolist()]
    m0 = worker.new_model()
    w_init = worker.weights(m0)
    evs = job.snapshot()
    rounds = sorted(job.rounds(evs).values(), key=lambda r: r["start"])
    steps: Dict[str, Dict[int, Dict[int, dict]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    batches: Dict[str, Dict[int, Dict[int, dict]]] = collections.defaultdict(lambda: collections.defaultdict(dict))
    saves: Dict[int, List[dict]] = collections.defaultdict(list)  # tag -> save events
    finals = []
    for e in evs:
        if e["ev"] == "step":
            steps[e["rid"]][e["n"]][e["tag"]] = e
        elif e["ev"] == "batch":
            batches[e["rid"]][e["n"]][e["tag"]] = e
        elif e["ev"] == "save":
            saves[e["tag"]].append(e)
        elif e["ev"] == "final":
            finals.append(e)

    # replay state per step: states[n] = (w, momentum buffer) before step n
    history: Dict[int, dict] = {}  # n -> {"size", "idx": [per rank], "epoch", "rid"}
    states: Dict[int, tuple] = {0: (w_init, None)}

    def state_at(n: int) -> Optional[tuple]:
        if n in states:
            return states[n]
        k = max(i for i in states if i <= n)
        w, buf = states[k]
        for s in range(k, n):
            h = history.get(s)
            if h is None:
                return None
            w, buf = apply(w, buf, h)
            states[s + 1] = (w, buf)
        return w, buf

    def apply(w: list, buf: Optional[list], h: dict) -> tuple:
        size = h["size"]
        g = [0.0] * len(w)
        for idx in h["idx"]:
            gr = [0.0] * len(w)
            for i in idx:
                pred = sum(a * b for a, b in zip(X[i], w[:-1])) + w[-1]
                d = 2.0 * (pred - Y[i]) / len(idx)
                for j in range(len(w) - 1):
                    gr[j] += d * X[i][j]
                gr[-1] += d
            for j in range(len(w)):
                g[j] += gr[j] / size
        lr = worker.BASE_LR * size
        buf = g[:] if buf is None else [worker.MOMENTUM * b + gj for b, gj in zip(buf, g)]
        return [wj - lr * bj for wj, bj in zip(w, buf)], buf

    def close(a: list, b: list) -> bool:
        return all(abs(p - q) <= 1e-8 * (1 + abs(q)) for p, q in zip(a, b))

    divergences = 0
    epoch_rounds: Dict[int, List[int]] = collections.defaultdict(list)
    prev_tags: set = set()
    for r in rounds:
        rid, members = r["rid"], r["members"]
        rank0 = min(members.values(), key=lambda e: e["rank"])
        n0 = rank0["n"]
        ws = {tuple(e["w"]) for e in members.values()}
        if len(ws) > 1 or len({e["n"] for e in members.values()}) > 1:
            divergences += 1
            problems.append(f"divergence: epoch {rid}: the ranks start from different states after the sync")
        if prev_tags and not set(members) & prev_tags:
            divergences += 1
            last = max((sv["n"] for sv_list in saves.values() for sv in sv_list if sv["t"] <= rank0["t"]), default=0)
            problems.append(
                f"divergence: epoch {rid} holds new ranks only (tags {sorted(members)}): it starts at step {n0}"
                f" from nothing, the job had committed step {last} (Horovod: at least one previous worker survives)"
            )
        # the commit it must start from: rank 0's last save before the epoch
        if rank0["tag"] in prev_tags:
            before = [s for s in saves[rank0["tag"]] if s["t"] <= rank0["t"]]
            if before and before[-1]["n"] != n0:
                divergences += 1
                problems.append(
                    f"divergence: epoch {rid} starts at step {n0}, but its rank 0 (tag {rank0['tag']}) last committed step {before[-1]['n']}"
                )
        for k in [k for k in history if k >= n0]:
            del history[k]
        for k in [k for k in states if k > n0]:
            del states[k]
        st = state_at(n0)
        if st is None:
            problems.append(f"replay: epoch {rid} starts at step {n0} but steps before it were never seen complete")
        elif not close(rank0["w"], st[0]):
            divergences += 1
            problems.append(
                f"divergence: epoch {rid} starts at step {n0} with weights {rank0['w']}, the replay of the committed steps gives {st[0]}"
            )
            states[n0] = (list(rank0["w"]), st[1])  # follow what ran: one fault counts once
        if abs(rank0["lr"] - worker.BASE_LR * r["size"]) > 1e-12:
            problems.append(
                f"lr: epoch {rid} trains at lr {rank0['lr']} at size {r['size']} (want {worker.BASE_LR * r['size']})"
            )
        order = sorted(members.values(), key=lambda e: e["rank"])
        for n in sorted(steps[rid]):
            done = steps[rid][n]
            wset = {tuple(e["w"]) for e in done.values()}
            if len(wset) > 1:
                divergences += 1
                problems.append(f"divergence: epoch {rid} step {n}: the ranks hold different weights")
            bs = batches[rid][n]
            if len(bs) < len(order):
                # a rank died before drawing its batch: the step cannot have completed
                continue
            idx = [bs[e["tag"]]["idx"] for e in order]
            if len({len(i) for i in idx}) > 1:
                problems.append(f"sampler: epoch {rid} step {n}: batches of different sizes {idx}")
            ep = bs[order[0]["tag"]]["epoch"]
            history[n] = {"size": r["size"], "idx": idx, "epoch": ep, "rid": rid}
            if rid not in epoch_rounds[ep]:
                epoch_rounds[ep].append(rid)
            st = state_at(n + 1)
            if st is not None and not close(next(iter(done.values()))["w"], st[0]):
                divergences += 1
                problems.append(f"divergence: epoch {rid} step {n}: weights differ from the replay")
                # follow what ran from here on, so that one fault counts once
                states[n + 1] = (list(next(iter(done.values()))["w"]), st[1])
        prev_tags |= set(members)
    if finals:
        fset = {(tuple(e["w"]), e["n"]) for e in finals}
        if len(fset) > 1:
            divergences += 1
            problems.append("divergence: the ranks end with different weights")
        f = finals[0]
        st = state_at(f["n"])
        if st is not None and not close(f["w"], st[0]):
            divergences += 1
            problems.append(f"divergence: final weights {f['w']} != replay {st[0]}")
    # sampler: each data epoch of the effective history covers the data once
    coverage = collections.defaultdict(collections.Counter)
    for n, h in history.items():
        for idx in h["idx"]:
            coverage[h["epoch"]].update(idx)
    last_epoch = max(coverage) if coverage else -1
    sampler_bad = 0
    for ep, c in sorted(coverage.items()):
        allowed_extra = sum(next((r["size"] for r in rounds if r["rid"] == rid), 1) - 1 for rid in epoch_rounds[ep])
        extra = sum(c.values()) - len(c)
        missing = worker.DATA - len(c)
        if (ep < last_epoch and missing) or extra > allowed_extra:
            sampler_bad += 1
            problems.append(
                f"sampler: data epoch {ep}: {missing} samples never drawn, {extra} drawn twice (padding allows {allowed_extra})"
            )
    return {"divergences": divergences, "sampler": sampler_bad, "epochs": len(coverage), "steps": len(history)}


def check_membership(job: Job, problems: List[str]) -> int:
    """Every epoch's membership against Horovod's rules."""
    bad = 0
    rounds = sorted(job.rounds().values(), key=lambda r: r["start"])
    for r in rounds:
        hosts = job.round_hosts(r)
        why = []
        if r["size"] < MIN_NP:
            why.append(f"size {r['size']} below --min-np {MIN_NP}")
        if r["size"] != len(r["members"]):
            why.append(f"size {r['size']} but {len(r['members'])} ranks reported")
        for h, n in hosts.items():
            exit0_here = job.exit0 is not None and any(rec.get("exit0_host") == h for rec in job.records)
            if n != SLOTS and not (exit0_here and n == SLOTS - 1):
                why.append(f"host {h} holds {n} of its {SLOTS} slots")
            for b in job.blacklist.get(h, []):
                # after its failure (1 s for what was in flight) and before its cooldown ended
                if b + 1.0 < r["start"] < b + min(COOLDOWN[1], 2 * COOLDOWN[0]):
                    why.append(f"host {h} is in its cooldown (failed at +{b - job.t0:.1f}s)")
            if h in job.removed and job.removed[h] + 2.5 < r["start"] < job.added.get(h, 1e18):
                why.append(f"host {h} is not listed by discovery")
        # nothing above what discovery lists and the flags allow
        if r["size"] > HOSTS * SLOTS:
            why.append("more ranks than slots")
        # a healthy host stays: every host of the previous epoch not faulted since is kept
        prev = [q for q in rounds if q["start"] < r["start"]]
        if prev:
            p = prev[-1]
            lost = set(job.round_hosts(p)) - set(hosts) - job.may_leave(p["start"] - 1, r["start"])
            if lost:
                why.append(f"healthy hosts {sorted(lost)} of the previous epoch left out")
        # the first epoch has every host (4 x 2 slots)
        if r is rounds[0] and set(hosts) != set(range(HOSTS)):
            why.append(f"the first epoch holds hosts {sorted(hosts)}, want all {HOSTS}")
        if why:
            bad += 1
            problems.append(
                f"membership: epoch {r['rid']} at +{r['start'] - job.t0:.1f}s, hosts {hosts}: " + "; ".join(why)
            )
    # a host blacklisted with no fault injected there: a healthy host's rank failed
    for at, line in list(job.stderr):
        m = re.match(r"hvdd run: blacklisting host ([0-9.]+) ", line)
        if not m:
            continue
        h = job.net.host_index(m.group(1))
        if any(abs(at - b) < LONG + REPORT_WAIT for b in job.blacklist.get(h, [])):
            continue
        why = [l for a, l in job.stderr if at - 1 <= a <= at and "exited with status" in l and m.group(1) in l]
        bad += 1
        problems.append(
            f"membership: hvdd run blacklisted healthy host {h} at +{at - job.t0:.1f}s, no fault there: "
            + (why[-1] if why else line)[:200]
        )
    # a host that failed comes back after its cooldown (if the job ran on long enough)
    end = job.ended or now()
    for h, times in job.blacklist.items():
        b = times[-1]
        if job.exit0 is not None:
            continue  # nothing is added after a success
        if end < b + COOLDOWN[1] + RETURN_S or job.last_step_at() < b + COOLDOWN[1] + RETURN_S:
            continue  # the job did not train on long enough for the host to be back
        if h not in job.listed:
            continue
        back = [r for r in rounds if r["start"] > b + COOLDOWN[0] and h in job.round_hosts(r)]
        # A host joins through the job's hosts: while the job's only host is
        # cut off, none can join; its return is due that much later.
        free = b + COOLDOWN[1]
        for rec in job.records:
            if rec.get("alone") and rec["t"] < free + RETURN_S and rec.get("t_end", rec["t"]) > b:
                free = max(free, rec.get("t_end", rec["t"]))
        if back and back[0]["start"] > free + RETURN_S:
            bad += 1
            problems.append(
                f"membership: host {h} failed at +{b - job.t0:.1f}s, back only {back[0]['start'] - b:.1f}s later"
                f" (cooldown {COOLDOWN[1]}s + {RETURN_S:g}s to start)"
            )
        if not back:
            bad += 1
            problems.append(f"membership: host {h} failed at +{b - job.t0:.1f}s and never came back after its cooldown")
    return bad


def check_leaks(job: Job, shm_before: set, problems: List[str]) -> int:
    """After the job: processes left in the namespaces, /dev/shm entries,
    and daemon fds/threads that grew across recoveries."""
    leaks = 0
    time.sleep(0.5)
    first = {i: {p: proc_cmdline(p) for p in job.net.pids(i)} for i in range(HOSTS + 1)}
    time.sleep(STRAGGLE_S)
    for i in range(HOSTS + 1):
        left = [p for p in job.net.pids(i)]
        gone = sorted(set(first[i]) - set(left))
        if gone:
            job.stragglers += len(gone)
            problems.append(
                f"straggler: processes still on host {i} after hvdd run exited, gone within {STRAGGLE_S:g}s: "
                + ", ".join(f"{p} ({first[i][p][:60]})" for p in gone)
            )
        if left:
            leaks += 1
            problems.append(
                f"leak: processes left on host {i}: " + ", ".join(f"{p} ({proc_cmdline(p)[:80]})" for p in left)
            )
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    new_shm = shm_entries() - shm_before
    if new_shm:
        leaks += 1
        problems.append(f"leak: /dev/shm entries left: {sorted(new_shm)}")
        for e in new_shm:
            try:
                os.unlink(os.path.join("/dev/shm", e))
            except OSError:
                pass
    # daemons: fds and threads at the same membership, first and last sample
    rounds = sorted(job.rounds().values(), key=lambda r: r["start"])

    step_times = [(e["at"], e["rid"]) for e in job.snapshot() if e["ev"] == "step"]
    by_rid = {r["rid"]: r for r in rounds}

    def epoch_at(t: float) -> Optional[dict]:
        """The epoch training at t, settled (3 s in)."""
        import bisect

        i = bisect.bisect_right(step_times, (t, "~")) - 1
        if i < 0 or t - step_times[i][0] > 1.0:
            return None
        r = by_rid[step_times[i][1]]
        return r if t - r["start"] >= 3 else None

    # per daemon and membership: the fewest fds in each epoch (joining
    # nodes' connections come and go within one); the last such epoch may
    # not hold more than the first
    for pid, samples in job.fd_samples.items():
        by_m: Dict[tuple, Dict[str, tuple]] = collections.defaultdict(dict)
        by_g: Dict[tuple, Dict[str, int]] = collections.defaultdict(dict)
        for t, fds, thr, host, kinds, gor in samples:
            r = epoch_at(t)
            if r is None or fds < 0:
                continue
            hosts = job.round_hosts(r)
            if host not in hosts or not kinds.get("memfd:hvdd-client-"):
                # A daemon outside the epoch (waiting to join, or cut off),
                # or one that serves no rank (a host's new daemon while its
                # old one still serves the epoch): its descriptors are not
                # the epoch's (run 6 and a replay compared such a daemon's
                # 10-13, with no client connected, with its 40-49 as the
                # epoch's daemon later: +2 clients and the engine's sockets).
                continue
            m = tuple(sorted(hosts.items()))
            if r["rid"] not in by_m[m] or fds < by_m[m][r["rid"]][0]:
                by_m[m][r["rid"]] = (fds, kinds)
            if gor > 0:
                by_g[m][r["rid"]] = min(gor, by_g[m].get(r["rid"], gor))
        for m, per_epoch in by_g.items():
            gmins = list(per_epoch.values())
            if len(gmins) >= 2 and gmins[-1] - gmins[0] > 20:
                leaks += 1
                problems.append(
                    f"leak: daemon {pid} runs {gmins[0]} goroutines in an epoch at membership {m}, {gmins[-1]} in a later one at the same membership"
                )
                break
        for m, per_epoch in by_m.items():
            mins = list(per_epoch.values())  # in epoch order (dicts keep insertion order)
            if len(mins) >= 2 and mins[-1][0] - mins[0][0] > 12:
                leaks += 1
                first, last = mins[0][1], mins[-1][1]
                grew = ", ".join(
                    f"{k} {first.get(k, 0)}->{last.get(k, 0)}"
                    for k in sorted(set(first) | set(last))
                    if last.get(k, 0) != first.get(k, 0)
                )
                problems.append(
                    f"leak: daemon {pid} holds {mins[0][0]} fds in an epoch at membership {m}, {mins[-1][0]} in a later one at the same membership ({grew})"
                )
                break
    return leaks


def _may_leave(self: Job, t0: float, t1: float) -> set:
    """Hosts a rule lets leave the job between t0 and t1: one that failed
    (or was cut off, or stopped past the detection bound), or that
    discovery dropped, in that time."""
    out = {h for h, times in self.blacklist.items() if any(t0 <= b <= t1 for b in times)}
    out |= {h for h, t in self.removed.items() if t0 <= t <= t1 + 2}
    return out


Job.may_leave = _may_leave


# ---------------------------------------------------------------- campaign


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = tempfile.mkdtemp(prefix="hvdd-chaos-")
        self.net = Net(self.work)
        self.cut: set = set()
        self.results: List[dict] = []
        self.problems: List[str] = []
        self.errors = 0  # the campaign's own failures (tracebacks)
        self.current: Optional[Job] = None

    def run(self, jobs: List[List[dict]]) -> int:
        self.net.create()
        self.agent = self.net.write_agent()
        deadline = now() + self.args.time_limit
        for j, faults in enumerate(jobs):
            if now() > deadline:
                print(f"chaos: time limit reached before job {j}", flush=True)
                break
            try:
                self.run_job(j, faults)
            except Exception:  # a campaign bug: say so, stop the job, go on
                import traceback

                traceback.print_exc()
                self.errors += 1
                job = self.current
                if job is not None and job.alive():
                    os.killpg(job.proc.pid, signal.SIGKILL)
                    job.proc.wait(10)
        return self.report(jobs)

    def run_job(self, j: int, faults: List[dict]) -> None:
        shm_before = shm_entries()
        job = Job(self, j, faults)
        self.current = job
        print(f"chaos: job {j}: {len(faults)} faults: {', '.join(f['kind'] for f in faults)}", flush=True)
        job.start()
        problems: List[str] = []
        outcome = "stopped"
        if not job.wait_settled(20 if self.args.break_kind == "membership" else self.args.bound + 60):
            problems.append("hang: the job never started training on all hosts")
        for f in faults:
            if not job.alive():
                break
            if not job.wait_settled(self.args.bound, full=not f.get("stack")) and job.alive():
                problems.append(f"hang: the job did not settle before {f['kind']}")
            time.sleep(f["delay"])
            rec = job.inject(f)
            job.measure(rec, self.args.bound)
            tag = (
                "HANG"
                if rec.get("hang")
                else ("ended" if rec.get("ended") else f"trains again after {rec.get('recovery', float('nan')):.1f}s")
            )
            print(f"chaos: job {j} +{rec['t'] - job.t0:6.1f}s {f['kind']:<18} {rec['note']}: {tag}", flush=True)
            if rec.get("hang"):
                problems.append(f"hang: no step within {self.args.bound}s after {f['kind']} ({rec['note']})")
                break
            # (the job's only host cut off: nothing to go on without; it
            # trains on during the fault or after it, as a short fault)
            if rec["kind"].endswith("_long") and not rec.get("alone") and rec.get("recovery", 0) > DETECT:
                rec["late"] = True
                problems.append(
                    f"hang: {f['kind']} ({rec['note']}): the job trained again only {rec['recovery']:.1f}s after the"
                    f" fault, not within the detection bound ({PEER_TIMEOUT:g}s peer timeout + {REPORT_WAIT:g}s report wait)"
                    f" without the host; epoch after: {rec.get('hosts_after')}"
                )
            if rec.get("ended"):
                break
            job.after_fault(rec)
        hung = any(p.startswith("hang") for p in problems)
        # let cooldowns end and the job take its hosts back before stopping it
        if job.alive() and job.exit0 is None and not hung:
            job.wait_settled(self.args.bound, full=True)
            time.sleep(1)
        alive_at_stop = job.alive()
        job.stop(timeout=10 if hung else self.args.bound)
        if job.terminated and not hung:
            problems.append(
                f"hang: the ranks did not stop at the stop file within {self.args.bound:g}s (hvdd run SIGTERMed)"
            )
        if self.args.break_kind == "leak":
            pass  # the worker left them (worker.py: CHAOS_BREAK=leak)
        tail = [l for _, l in job.stderr[-8:]]
        if not alive_at_stop:
            outcome = "exited"
            ok = job.rc != 0 and self.cannot_go_on(job)
            if job.rc == 0 and job.exit0 is not None:
                outcome = "ended-success"
            elif ok:
                outcome = "documented-exit"
            else:
                problems.append(
                    f"exit: hvdd run ended with {job.rc} while the job could go on: " + " | ".join(tail[-3:])
                )
        elif job.rc != 0 and not job.terminated:
            problems.append(f"exit: hvdd run returned {job.rc} after the stop: " + " | ".join(tail[-3:]))
        rep = replay_history(job, problems)
        rep["membership"] = check_membership(job, problems)
        rep["leaks"] = check_leaks(job, shm_before, problems)
        rep["stragglers"] = job.stragglers
        rep["hangs"] = sum(1 for p in problems if p.startswith("hang"))
        rep["exits"] = sum(1 for p in problems if p.startswith("exit"))
        rep.update(job=j, outcome=outcome, rc=job.rc, records=job.records, problems=problems, dir=job.dir)
        self.results.append(rep)
        with open(os.path.join(job.dir, "result.json"), "w") as fh:
            json.dump(rep, fh, indent=1, default=str)
        for p in problems:
            print(f"chaos: job {j}: FOUND {p}", flush=True)
        print(
            f"chaos: job {j}: rc {job.rc} ({outcome}); {rep['steps']} committed steps, {rep['epochs']} data epochs;"
            f" divergences {rep['divergences']}, sampler {rep['sampler']}, membership {rep['membership']}, leaks {rep['leaks']}",
            flush=True,
        )

    def cannot_go_on(self, job: Job) -> bool:
        """Whether Horovod's rules end the job: fewer than --min-np slots left."""
        t = job.ended or now()
        usable = [h for h in job.listed if not any(t - 1 - b < COOLDOWN[1] for b in job.blacklist.get(h, []))]
        no_survivor = any(rec.get("expect_end") for rec in job.records)
        return len(usable) * SLOTS < MIN_NP or job.exit0 is not None or no_survivor

    def report(self, jobs: List[List[dict]]) -> int:
        by_kind: Dict[str, dict] = collections.OrderedDict(
            (k, {"n": 0, "ok": 0, "rec": [], "hang": 0, "ended": 0, "late": 0}) for k in KINDS
        )
        for res in self.results:
            for rec in res["records"]:
                k = by_kind[rec["kind"]]
                k["n"] += 1
                if rec.get("hang"):
                    k["hang"] += 1
                elif rec.get("ended"):
                    k["ended"] += 1
                elif "recovery" in rec:
                    k["ok"] += 1
                    k["rec"].append(rec["recovery"])
                    k["late"] += bool(rec.get("late"))

        def pct(xs: List[float], q: float) -> str:
            if not xs:
                return "-"
            xs = sorted(xs)
            return f"{xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]:.1f}"

        print()
        print(
            f"{'fault':<18} {'n':>3} {'survived':>8} {'late':>4} {'ended':>5} {'hang':>4} {'median_s':>8} {'p99_s':>6} {'max_s':>6}"
        )
        for kind, k in by_kind.items():
            if not k["n"]:
                continue
            med = f"{statistics.median(k['rec']):.1f}" if k["rec"] else "-"
            mx = f"{max(k['rec']):.1f}" if k["rec"] else "-"
            print(
                f"{kind:<18} {k['n']:>3} {k['ok']:>8} {k['late']:>4} {k['ended']:>5} {k['hang']:>4} {med:>8} {pct(k['rec'], 0.99):>6} {mx:>6}"
            )
        tot = {
            key: sum(r[key] for r in self.results)
            for key in ("hangs", "divergences", "sampler", "membership", "leaks", "exits", "stragglers")
        }
        print(
            f"\njobs {len(self.results)}; hangs {tot['hangs']}; divergences {tot['divergences']}; sampler {tot['sampler']};"
            f" wrong memberships {tot['membership']}; leaks {tot['leaks']}; unexpected exits {tot['exits']};"
            f" stragglers {tot['stragglers']} (processes that outlived hvdd run by less than {STRAGGLE_S:g}s)"
        )
        outcomes = collections.Counter(r["outcome"] for r in self.results)
        print("job outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
        sched = os.path.join(self.work, "schedule.json")
        with open(sched, "w") as fh:
            json.dump({"seed": self.args.seed, "jobs": jobs, "args": vars(self.args)}, fh, indent=1)
        if self.args.results:
            with open(self.args.results, "w") as fh:
                json.dump({"results": self.results, "errors": self.errors, "schedule": sched}, fh, default=str)
        found = sum(tot.values()) + self.errors
        if self.errors:
            print(f"campaign errors (tracebacks above): {self.errors}")
        print(f"work dir (logs, results, schedule): {self.work}")
        if found:
            print(f"\nFAILED: seed {self.args.seed}; schedule {sched}")
            print(f"replay: .venv/bin/python bench/chaos/chaos.py --replay {sched}")
            print(
                f"   or: .venv/bin/python bench/chaos/chaos.py --seed {self.args.seed} --faults {self.args.faults} --per-job {self.args.per_job}"
                + (f" --break {self.args.break_kind}" if self.args.break_kind else "")
            )
            return 1
        return 0


def run_instances(args: argparse.Namespace, jobs: List[List[dict]]) -> int:
    """Deal the schedule's jobs in turn to args.instances campaigns run at
    once (each a child chaos.py replaying its part, on 4 hosts of its own),
    stream their lines, and print one table over them all."""

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    camp = Campaign(args)
    children = []
    for i in range(args.instances):
        part = os.path.join(camp.work, f"part{i}.json")
        with open(part, "w") as fh:
            json.dump({"seed": args.seed, "jobs": jobs[i :: args.instances], "args": vars(args)}, fh, indent=1)
        results = os.path.join(camp.work, f"part{i}.results.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--replay", part, "--results", results]
        cmd += ["--bound", str(args.bound), "--pace", str(args.pace), "--time-limit", str(args.time_limit)]
        cmd += ["--keep"] if args.keep else []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        children.append((i, proc, results))

    def relay(i: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"[{i}] {line}", end="", flush=True)

    relays = [threading.Thread(target=relay, args=(i, proc), daemon=True) for i, proc, _ in children]
    for t in relays:
        t.start()
    rcs = []
    try:
        for i, proc, _ in children:
            rcs.append(proc.wait())
    except KeyboardInterrupt:
        for _, proc, _ in children:
            proc.terminate()
        for _, proc, _ in children:
            proc.wait(120)
        raise
    for t in relays:
        t.join(10)
    for (i, _, results), rc in zip(children, rcs):
        try:
            with open(results) as fh:
                got = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"chaos: instance {i} exited {rc} without its results ({e})", flush=True)
            camp.errors += 1
            continue
        camp.results += got["results"]
        camp.errors += got["errors"]
        if rc not in (0, 1):
            camp.errors += 1
    print(f"\nchaos: {args.instances} instances at once, seed {args.seed}: one table over all their jobs")
    rc = camp.report(jobs)
    if rc:
        print(f"each instance's schedule: {camp.work}/partN.json (replay one with --replay)")
    elif not args.keep:
        shutil.rmtree(camp.work, ignore_errors=True)
    return rc


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Checks, fault kinds and outputs: bench/chaos/README.md. Needs root (network namespaces) and bin/hvdd.",
    )
    p.add_argument("--seed", type=int, default=None, help="the faults' seed (default: drawn, printed)")
    p.add_argument("--faults", type=int, default=30, help="how many faults (default 30: a few minutes)")
    p.add_argument("--per-job", type=int, default=5, help="faults per hvdd run job (default 5)")
    p.add_argument("--quick", action="store_true", help="for CI: one round of every kind (14 faults), short bound")
    p.add_argument("--replay", metavar="FILE", help="replay the schedule.json a run wrote")
    p.add_argument(
        "--bound", type=float, default=60.0, help="seconds a recovery may take before it counts as a hang (60)"
    )
    p.add_argument("--pace", type=float, default=0.05, help="seconds per training step (0.05)")
    p.add_argument("--time-limit", type=float, default=1800, help="start no job after this many seconds (1800)")
    p.add_argument(
        "--break",
        dest="break_kind",
        choices=BREAKS,
        help="break something on purpose to show its check fails: restore (a rank keeps its weights"
        " across restore()), leak (a /dev/shm segment and a process left behind), hang (a reset held"
        " past --bound), membership (hvdd run -np 6 --max-np 6: epochs of 3 hosts where the model, hvdd run -np 8, has 4)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--kinds", help="only these fault kinds, comma-separated (default: all): " + ", ".join(KINDS))
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="run the schedule's jobs in N campaigns at once, each on 4 hosts of its own, the jobs dealt to them"
        " in turn; one table at the end (default 1). A long campaign in less time, on a machine loaded by the others",
    )
    p.add_argument("--results", metavar="FILE", help=argparse.SUPPRESS)  # an instance's results, for --instances
    args = p.parse_args()
    if os.geteuid() != 0:
        p.error("needs root: network namespaces")
    if args.replay:
        with open(args.replay) as fh:
            saved = json.load(fh)
        jobs = saved["jobs"]
        args.seed = saved["seed"]
        args.faults = sum(len(j) for j in jobs)
        if args.break_kind is None:
            args.break_kind = saved["args"].get("break_kind")
    else:
        if args.seed is None:
            args.seed = random.randrange(1 << 30)
        if args.quick:
            args.faults = min(args.faults, len(KINDS))
            args.bound = min(args.bound, 60)
        if args.break_kind:
            args.faults = min(args.faults, 2)
        kinds = args.kinds.split(",") if args.kinds else KINDS
        for k in kinds:
            if k not in KINDS:
                p.error(f"--kinds: unknown kind {k!r}")
        jobs = draw_schedule(args.seed, args.faults, args.per_job, kinds)
        if args.break_kind in ("restore", "hang", "leak"):
            jobs = [[dict(jobs[0][0], kind="rank_kill")]]
        if args.break_kind == "membership":
            jobs = [[dict(jobs[0][0], kind="daemon_stop_short")]]
    print(f"chaos: seed {args.seed}, {sum(len(j) for j in jobs)} faults in {len(jobs)} jobs", flush=True)
    if args.instances < 1:
        p.error("--instances must be at least 1")
    if args.instances > 1:
        if args.break_kind:
            p.error("--break takes one instance")
        return run_instances(args, jobs)
    camp = Campaign(args)

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    rc = 2
    try:
        rc = camp.run(jobs)
    except KeyboardInterrupt:
        print("chaos: interrupted; cleaning up", flush=True)
        rc = 130
    finally:
        for i in range(HOSTS + 1):
            try:
                for pid in camp.net.pids(i) if camp.net.up else []:
                    os.kill(pid, signal.SIGKILL)
            except Exception:
                pass
        camp.net.destroy()
        if not args.keep and rc == 0:
            shutil.rmtree(camp.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
