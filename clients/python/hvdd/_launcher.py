"""Jobs started by a launcher other than ``hvdd run``: ``mpirun``/``mpiexec``
(Open MPI, MPICH) and ``srun`` (SLURM), as the seeds start Horovod scripts
(``mpirun -np 4 python train.py``).

Such a process finds its place in the job in the launcher's environment
(``detect``: rank, size, local rank and size, this host's index among the
job's hosts) and joins the node's daemon: the one listening on the default
socket, or else one that the job's processes on this host start for
themselves (``ensure_daemon``): the first of them to take a lock beside its
socket starts ``hvdd serve --exit-after-job`` for the job (exactly one per
host: the others wait on the lock and find it listening), and that daemon
exits once the job's processes on the host are gone.

Across hosts the daemons need a rendezvous (node 0 serves it) and a shared
secret. Where the launcher says enough they come without flags:

* Open MPI: when rank 0 runs on mpirun's own host, the rendezvous is on
  the first address mpirun lists for itself (``OMPI_MCA_orte_hnp_uri``), at
  a port derived from the job id; the secret is Open MPI's per-job random
  key (``OMPI_MCA_orte_precondition_transports``).
* SLURM: the rendezvous is on the step's first host, at the step's first
  reserved port (``SLURM_STEP_RESV_PORTS``) or one derived from the job and
  step ids; the secret must come in ``HVDD_SECRET`` (srun passes the
  environment on).
* MPICH (Hydra): ``HVDD_RENDEZVOUS`` and ``HVDD_SECRET`` (Hydra passes the
  environment on).

``HVDD_RENDEZVOUS=HOST:PORT`` (node 0's host) and ``HVDD_SECRET`` override
these everywhere (under Open MPI pass them with ``mpirun -x``).

hvdd's ranks are node-major (ranks fill each host's slots in turn), which is
the launchers' default placement (Open MPI's ``--map-by slot``, SLURM's
block distribution, Hydra's fill); a placement that is not (``--map-by
node``, ``--distribution=cyclic``) is refused with an error saying so.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import subprocess
import time
import zlib
from dataclasses import dataclass
from typing import Mapping, Optional

from . import _env

log = logging.getLogger(__name__)

# The rendezvous port derived from a job id falls in this range.
PORT_BASE = 20000
PORT_SPAN = 10000

# Variables of the launcher that a daemon started by a rank must not
# inherit: it is not an MPI process of the job.
_SCRUB = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCAL", "OPAL_")


class LauncherError(ValueError):
    """The launcher's environment does not describe a job hvdd can run,
    or the daemon for it could not be started; the message says why and
    what to do."""


@dataclass(frozen=True)
class Placement:
    """This process's place in a job, as its launcher tells it."""

    launcher: str  # "Open MPI", "MPICH", "SLURM" or "torch.distributed"
    rank: int
    size: int
    local_rank: int
    local_size: int
    nodes: int  # hosts in the job
    node_rank: int  # this host's index, 0 .. nodes-1 (rank 0's host is 0)
    job: str  # the job's id as the launcher names it
    node_key: str  # names this host's part of the job (the same for its ranks)
    rendezvous: str = ""  # node 0's HOST:PORT ("" when nodes == 1)
    secret: str = ""  # the daemons' shared secret ("" when nodes == 1)
    rendezvous_from: str = ""  # where the rendezvous came from, for errors
    on_launcher_host: bool = True  # Open MPI: whether mpirun itself runs here


def _int(env: Mapping[str, str], name: str) -> int:
    v = env[name]
    try:
        return int(v)
    except ValueError:
        raise LauncherError(f"hvdd: {name}={v!r} is not an integer") from None


def expand_hostlist(expr: str) -> list[str]:
    """Expands a SLURM hostlist ("node[01-03,7],gpu[1-2]-ib") into host names,
    in order."""
    hosts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            part = expr[start:i].strip()
            if part:
                hosts.extend(_expand_one(part))
            start = i + 1
    if depth != 0:
        raise LauncherError(f"hvdd: unbalanced brackets in the SLURM host list {expr!r}")
    return hosts


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", part)
    if not m:
        return [part]
    head, tail = part[: m.start()], part[m.end() :]
    out: list[str] = []
    for r in m.group(1).split(","):
        lo, _, hi = r.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise LauncherError(f"hvdd: bad range {r!r} in the SLURM host list {part!r}")
        width = len(lo)
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(_expand_one(head + str(n).zfill(width) + tail))
    return out


def expand_tasks_per_node(expr: str) -> list[int]:
    """Expands SLURM's tasks-per-node list ("2(x3),1") into counts per host."""
    out: list[int] = []
    for part in expr.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LauncherError(f"hvdd: cannot read SLURM's tasks per node {expr!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def derived_port(job: str) -> int:
    """The rendezvous port every host of a job derives from its id."""
    return PORT_BASE + zlib.crc32(job.encode()) % PORT_SPAN


def _host_port(hp: str, what: str) -> str:
    host, sep, port = hp.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LauncherError(f"hvdd: {what}={hp!r} must be HOST:PORT (node 0's host)")
    return hp


def _uniform_nodes(launcher: str, rank: int, size: int, lrank: int, lsize: int, hint: str) -> tuple[int, int]:
    """nodes and node_rank for a launcher that says only the local size:
    every host must run as many ranks, node-major."""
    if not 0 <= rank < size or not 0 <= lrank < lsize or lsize > size:
        raise LauncherError(
            f"hvdd: {launcher} gave rank {rank} of {size}, local rank {lrank} of {lsize}: not a valid placement"
        )
    first = rank - lrank
    if size % lsize or first % lsize:
        raise LauncherError(
            f"hvdd: under {launcher}, this host runs {lsize} of the job's {size} ranks (this one is rank {rank}, "
            f"local rank {lrank}); hvdd needs the same number of ranks on every host, placed host by host "
            f"(ranks 0..{lsize - 1} on the first){hint}, or start the job with hvdd run"
        )
    return size // lsize, first // lsize


def detect(env: Optional[Mapping[str, str]] = None, ppid: Optional[int] = None) -> Optional[Placement]:
    """Reads this process's place in the job from its launcher's environment;
    None when no launcher that hvdd knows started it, or when ``hvdd run``
    did (which sets HVDD_SOCKET and HVDD_RANK itself)."""
    env = _env.environ() if env is None else env
    if env.get("HVDD_RANK") is not None and env.get("HVDD_SOCKET"):
        return None
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
        return _open_mpi(env)
    if "PMI_RANK" in env and "PMI_SIZE" in env and "MPI_LOCALRANKID" in env and "MPI_LOCALNRANKS" in env:
        return _mpich(env, os.getppid() if ppid is None else ppid)
    if "SLURM_PROCID" in env and "SLURM_LOCALID" in env:
        return _slurm(env)
    return None


def _open_mpi(env: Mapping[str, str]) -> Placement:
    rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
    lrank, lsize = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    hnp = env.get("OMPI_MCA_orte_hnp_uri", "")
    local = env.get("OMPI_MCA_orte_local_daemon_uri", hnp)
    job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or hnp.split(";")[0] or "ompi"
    nodes, node = _uniform_nodes("Open MPI", rank, size, lrank, lsize, " (mpirun's default --map-by slot)")
    told = env.get("OMPI_MCA_orte_num_nodes", "")
    if told.isdigit() and int(told) != nodes:
        raise LauncherError(
            f"hvdd: Open MPI placed this job's {size} ranks on {told} hosts, {lsize} on this one; hvdd needs "
            f"the same number on every host (e.g. mpirun -np {size} -H host1:{lsize},host2:{lsize},...), "
            "or start the job with hvdd run"
        )
    p = Placement("Open MPI", rank, size, lrank, lsize, nodes, node, job, local.split(";")[0] or str(os.getppid()))
    if nodes == 1:
        return p
    rdv, src = env.get("HVDD_RENDEZVOUS", ""), "HVDD_RENDEZVOUS"
    if rdv:
        _host_port(rdv, "HVDD_RENDEZVOUS")
    else:
        m = re.search(r"tcp://([0-9.]+)[,:]", hnp)
        if m:
            rdv, src = f"{m.group(1)}:{derived_port(job)}", "mpirun's address (OMPI_MCA_orte_hnp_uri)"
    secret = env.get("HVDD_SECRET") or env.get("OMPI_MCA_orte_precondition_transports", "")
    return Placement(
        p.launcher,
        rank,
        size,
        lrank,
        lsize,
        nodes,
        node,
        job,
        p.node_key,
        rdv,
        secret,
        src,
        on_launcher_host=bool(hnp) and local.split(";")[0] == hnp.split(";")[0],
    )


def _mpich(env: Mapping[str, str], ppid: int) -> Placement:
    rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
    lrank, lsize = _int(env, "MPI_LOCALRANKID"), _int(env, "MPI_LOCALNRANKS")
    nodes, node = _uniform_nodes("MPICH", rank, size, lrank, lsize, " (mpiexec's default)")
    # Hydra's proxy is the parent of every rank on a host: its pid names the job here.
    key = f"{socket.gethostname()}-{ppid}"
    rdv = env.get("HVDD_RENDEZVOUS", "")
    if rdv:
        _host_port(rdv, "HVDD_RENDEZVOUS")
    return Placement(
        "MPICH", rank, size, lrank, lsize, nodes, node, key, key, rdv, env.get("HVDD_SECRET", ""), "HVDD_RENDEZVOUS"
    )


def _slurm(env: Mapping[str, str]) -> Placement:
    rank, lrank = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID")
    size = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    hosts = expand_hostlist(
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    )
    tasks = expand_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
    if not hosts or len(tasks) != len(hosts) or sum(tasks) != size:
        raise LauncherError(
            f"hvdd: SLURM's step has hosts {hosts} and tasks per node {tasks} for {size} tasks: they do not agree"
        )
    name = env.get("SLURMD_NODENAME", "")
    node = hosts.index(name) if name in hosts else _int(env, "SLURM_NODEID")
    if not 0 <= node < len(hosts):
        raise LauncherError(f"hvdd: SLURM node {node} is not among the step's {len(hosts)} hosts")
    first = sum(tasks[:node])
    if rank - lrank != first or not 0 <= lrank < tasks[node]:
        raise LauncherError(
            f"hvdd: SLURM placed task {rank} as local task {lrank} on host {hosts[node]}, whose tasks are "
            f"{first}..{first + tasks[node] - 1} in a block distribution; hvdd places ranks host by host: "
            "use srun's default --distribution=block"
        )
    job = f"{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', env.get('SLURM_STEPID', '0'))}"
    p = Placement("SLURM", rank, size, lrank, tasks[node], len(hosts), node, job, f"{job}-{node}")
    if p.nodes == 1:
        return p
    rdv, src = env.get("HVDD_RENDEZVOUS", ""), "HVDD_RENDEZVOUS"
    if rdv:
        _host_port(rdv, "HVDD_RENDEZVOUS")
    else:
        m = re.match(r"(\d+)", env.get("SLURM_STEP_RESV_PORTS", ""))
        port = int(m.group(1)) if m else derived_port(job)
        host = hosts[0]
        rdv = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        src = "the step's first host (SLURM_STEP_NODELIST)"
    return Placement(
        "SLURM",
        rank,
        size,
        lrank,
        tasks[node],
        len(hosts),
        node,
        job,
        p.node_key,
        rdv,
        env.get("HVDD_SECRET", ""),
        src,
    )


def daemon_args(
    p: Placement, hvdd_bin: str, files: tuple[str, str, str], idle_exit: float, log_level: str
) -> list[str]:
    """The command line of the daemon that p's host starts for the job, given
    its socket, lock and log files (job_files)."""
    sock, lock, logpath = files
    argv = [hvdd_bin, "serve", "--slots", str(p.local_size), "--socket", sock, "--exit-after-job"]
    argv += ["--idle-exit", f"{max(idle_exit, 1.0):g}s", "--log-level", log_level]
    argv += ["--log-file", logpath, "--remove-on-exit", lock]
    if p.nodes > 1:
        argv += ["--nodes", str(p.nodes), "--node-rank", str(p.node_rank), "--rendezvous", p.rendezvous]
    return argv


def check_multinode(p: Placement) -> None:
    """Raises LauncherError, saying what to pass, when p's job spans hosts and
    lacks a rendezvous or a secret."""
    if p.nodes == 1:
        return
    how = {
        "Open MPI": "mpirun -x HVDD_RENDEZVOUS=HOST0:PORT",
        "MPICH": "HVDD_RENDEZVOUS=HOST0:PORT HVDD_SECRET=... mpiexec (Hydra passes the environment on)",
        "SLURM": "export HVDD_SECRET before srun (srun passes the environment on)",
        "torch.distributed": "HVDD_RENDEZVOUS=HOST0:PORT and HVDD_SECRET=... for every rank",
    }[p.launcher]
    if not p.rendezvous:
        raise LauncherError(
            f"hvdd: this {p.launcher} job spans {p.nodes} hosts and its daemons need a rendezvous: set "
            f"HVDD_RENDEZVOUS to rank 0's host and a free port ({how})"
        )
    if p.launcher == "Open MPI" and p.node_rank == 0 and p.rendezvous_from != "HVDD_RENDEZVOUS":
        if not p.on_launcher_host:
            raise LauncherError(
                "hvdd: rank 0 does not run on mpirun's host, where the daemons would meet: set "
                f"HVDD_RENDEZVOUS to rank 0's host and a free port ({how})"
            )
    if not p.secret:
        raise LauncherError(
            f"hvdd: this {p.launcher} job spans {p.nodes} hosts and its daemons need a shared secret: set "
            f"HVDD_SECRET to the same random value for every rank, e.g. $(head -c 32 /dev/urandom | xxd -p -c 64) "
            f"({how})"
        )


def _connectable(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def job_files(p: Placement, runtime_dir: str) -> tuple[str, str, str]:
    """The socket, lock and log paths of p's host's daemon for the job."""
    key = hashlib.sha256(f"{p.launcher}|{p.job}|{p.node_key}".encode()).hexdigest()[:16]
    base = os.path.join(runtime_dir, f"job-{key}")
    return base + ".sock", base + ".lock", base + ".log"


def ensure_daemon(
    p: Placement,
    node_socket: str,
    hvdd_bin: Optional[str],
    timeout: float,
    env: Optional[Mapping[str, str]] = None,
) -> str:
    """Returns the socket of the daemon p's process joins: the node's own
    daemon if one listens on node_socket, else the job's daemon on this host,
    started here by whichever of the job's local processes comes first."""
    env = _env.environ() if env is None else env
    if _connectable(node_socket):
        log.debug("hvdd: joining the node's daemon at %s", node_socket)
        return node_socket
    check_multinode(p)
    runtime = os.path.dirname(node_socket)
    try:
        os.makedirs(runtime, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    except OSError as e:
        raise LauncherError(f"hvdd: cannot create {runtime} for the job's daemon: {e}") from e
    files = job_files(p, runtime)
    sock, lock, logpath = files
    mine = {"nodes": p.nodes, "node_rank": p.node_rank, "local_size": p.local_size, "rendezvous": p.rendezvous}
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the job's processes on this host, one at a time
        raw = os.read(fd, 4096)
        parent = _identity(os.getppid())
        theirs = json.loads(raw) if raw else None
        if theirs is not None and not _connectable(sock) and not _alive(theirs.get("pid", 0)):
            if theirs.get("parent") != parent:
                # Left by an earlier job whose id repeats this one's.
                theirs = None
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
        if theirs is not None:
            if {k: theirs.get(k) for k in mine} != mine:
                raise LauncherError(
                    f"hvdd: the job's processes on this host disagree on its layout: rank {p.rank} (local rank "
                    f"{p.local_rank}) expects {mine}, but the daemon was started for {theirs}"
                )
            if _connectable(sock):
                return sock
            raise LauncherError(
                f"hvdd: the job's daemon on this host has already exited (its log: {logpath}); "
                f"rank {p.rank} came too late or the daemon failed"
            )
        if not hvdd_bin:
            raise LauncherError(
                f"hvdd: no hvdd daemon is running on this host and the hvdd binary to start one for this "
                f"{p.launcher} job is not on PATH: install hvdd, set HVDD_BIN to its path, or start "
                "`hvdd serve` (or run the job with hvdd run)"
            )
        child_env = {k: v for k, v in env.items() if not k.startswith(_SCRUB)}
        child_env.pop("HVDD_SOCKET", None)
        if p.nodes > 1:
            child_env["HVDD_SECRET"] = p.secret
        level = env.get("HOROVOD_LOG_LEVEL", "warning")
        argv = daemon_args(p, hvdd_bin, files, timeout, level)
        with open(logpath, "ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=child_env,
                    start_new_session=True,  # not in the rank's process group: it outlives the rank
                    close_fds=True,
                )
            except OSError as e:
                raise LauncherError(f"hvdd: cannot start {hvdd_bin}: {e}") from e
        os.write(fd, json.dumps(dict(mine, pid=proc.pid, parent=parent)).encode())
        log.info("hvdd: started the job's daemon on this host (pid %d, %s; log %s)", proc.pid, sock, logpath)
        deadline = time.monotonic() + timeout
        delay = 0.002
        while not _connectable(sock):
            if proc.poll() is not None:
                raise LauncherError(
                    f"hvdd: the daemon started for this {p.launcher} job exited with status {proc.returncode}: "
                    + _tail(logpath)
                )
            if time.monotonic() > deadline:
                proc.kill()
                raise LauncherError(f"hvdd: the daemon started for this job did not listen within {timeout:g} s")
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        return sock
    finally:
        os.close(fd)  # releases the lock


def _identity(pid: int) -> list[int]:
    """pid with its start time: a process, even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return [pid, int(stat[stat.rindex(b")") + 2 :].split()[19])]
    except (OSError, ValueError, IndexError):
        return [pid, 0]


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (the daemon's starter has not reaped it) is not alive.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"
    except OSError:
        return False


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip() or f"(nothing in {path})"
    except OSError as e:
        return f"(cannot read its log {path}: {errno.errorcode.get(e.errno or 0, e)})"


def check_welcome(p: Placement, rank: int, size: int, sock: str) -> None:
    """Raises LauncherError when the job the daemon formed is not the
    launcher's: another size, or this process at another rank."""
    if size != p.size:
        raise LauncherError(
            f"hvdd: {p.launcher} started {p.size} processes, but the daemon at {sock} formed a job of {size}: "
            "it serves another layout (its --slots or --nodes); stop it or set HVDD_SOCKET to another socket"
        )
    if rank != p.rank:
        raise LauncherError(
            f"hvdd: {p.launcher} made this process rank {p.rank}, but the daemon at {sock} gave it rank {rank}: "
            "hvdd places ranks host by host (mpirun --map-by slot, srun --distribution=block)"
        )
