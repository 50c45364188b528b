"""Jobs started as the seeds start Horovod scripts, with no hvdd run:
``mpirun -np 4 python train.py`` (Open MPI, one host and several "hosts"
reached through an agent, as launch's tests do), ``mpiexec`` (MPICH), and
srun (a SLURM-like environment: the variables srun sets, on two loopback
"hosts"). Each rank finds its place in the launcher's environment and joins
the daemon that its host's ranks start for the job (hvdd._launcher); the
units below check the parsing and refusals without a launcher."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

import pytest
from elastic_helpers import communicate_all

from hvdd import _launcher as L

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "launcher_worker.py")
CLIENT = os.path.abspath(os.path.join(HERE, ".."))

# ---------------------------------------------------------------- units


def ompi_env(rank: int, size: int, lrank: int, lsize: int, **extra: str) -> dict[str, str]:
    e = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(lrank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(lsize),
        "OMPI_MCA_ess_base_jobid": "2050686977",
        "OMPI_MCA_orte_hnp_uri": "2050686976.0;tcp://10.1.0.1,172.17.0.1:42975;tcp6://[fd00::2]:45579",
        "OMPI_MCA_orte_local_daemon_uri": "2050686976.0;tcp://10.1.0.1,172.17.0.1:42975",
        "OMPI_MCA_orte_precondition_transports": "f725da2ba053e603-d892cdd6e899dbb0",
    }
    e.update(extra)
    return e


def slurm_env(rank: int, lrank: int, node: str, **extra: str) -> dict[str, str]:
    e = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(lrank),
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_NODELIST": "gpu[01-02],cpu7",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
        "SLURMD_NODENAME": node,
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "3",
    }
    e.update(extra)
    return e


def test_hostlist_and_tasks_per_node():
    assert L.expand_hostlist("node[01-03,7],gpu5") == ["node01", "node02", "node03", "node7", "gpu5"]
    assert L.expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert L.expand_hostlist("10.0.0.[1-2],host") == ["10.0.0.1", "10.0.0.2", "host"]
    assert L.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert L.expand_tasks_per_node("4") == [4]
    with pytest.raises(L.LauncherError, match="unbalanced"):
        L.expand_hostlist("node[1-2")
    with pytest.raises(L.LauncherError, match="tasks per node"):
        L.expand_tasks_per_node("2(y3)")


def test_detect_open_mpi():
    p = L.detect(ompi_env(5, 8, 1, 4))
    assert p is not None
    assert (p.launcher, p.rank, p.size, p.local_rank, p.local_size, p.nodes, p.node_rank) == (
        "Open MPI",
        5,
        8,
        1,
        4,
        2,
        1,
    )
    # mpirun's first address, a port every host derives alike, Open MPI's per-job key.
    assert p.rendezvous == f"10.1.0.1:{L.derived_port('2050686977')}"
    assert L.PORT_BASE <= L.derived_port("2050686977") < L.PORT_BASE + L.PORT_SPAN
    assert p.secret == "f725da2ba053e603-d892cdd6e899dbb0"
    assert p.on_launcher_host
    # The variables win.
    p = L.detect(ompi_env(0, 8, 0, 4, HVDD_RENDEZVOUS="h0:29500", HVDD_SECRET="s" * 32))
    assert p is not None and (p.rendezvous, p.secret, p.node_rank) == ("h0:29500", "s" * 32, 0)
    # One host: no rendezvous needed.
    p = L.detect(ompi_env(2, 4, 2, 4))
    assert p is not None and (p.nodes, p.node_rank, p.rendezvous) == (1, 0, "")


def test_detect_refuses_layouts_hvdd_cannot_run():
    # --map-by node: rank 1 is local rank 0 on the second host.
    with pytest.raises(L.LauncherError, match="map-by slot"):
        L.detect(ompi_env(1, 4, 0, 2))
    # Uneven hosts (3 + 1).
    with pytest.raises(L.LauncherError, match="same number"):
        L.detect(ompi_env(0, 4, 0, 3))
    with pytest.raises(L.LauncherError, match="on 3 hosts"):
        L.detect(ompi_env(0, 4, 0, 2, OMPI_MCA_orte_num_nodes="3"))
    with pytest.raises(L.LauncherError, match="not an integer"):
        L.detect(ompi_env(0, 4, 0, 2, OMPI_COMM_WORLD_RANK="x"))
    # SLURM's cyclic distribution: task 1 on the second host.
    with pytest.raises(L.LauncherError, match="distribution=block"):
        L.detect(slurm_env(1, 0, "gpu02"))
    with pytest.raises(L.LauncherError, match="do not agree"):
        L.detect(slurm_env(0, 0, "gpu01", SLURM_STEP_NUM_TASKS="6"))


def test_detect_mpich_and_slurm_and_hvdd_run():
    p = L.detect({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, ppid=99)
    assert p is not None and (p.launcher, p.nodes, p.node_rank, p.rendezvous) == ("MPICH", 2, 1, "")
    assert p.node_key.endswith("-99")
    p = L.detect(slurm_env(4, 0, "cpu7"))
    assert p is not None
    assert (p.launcher, p.rank, p.size, p.local_size, p.nodes, p.node_rank) == ("SLURM", 4, 5, 1, 3, 2)
    assert p.rendezvous == f"gpu01:{L.derived_port('77.3')}"
    p = L.detect(slurm_env(2, 0, "gpu02", SLURM_STEP_RESV_PORTS="12000-12003"))
    assert p is not None and (p.node_rank, p.rendezvous) == (1, "gpu01:12000")
    # hvdd run sets its own variables: the launcher's do not count then.
    assert L.detect(dict(ompi_env(0, 2, 0, 2), HVDD_RANK="0", HVDD_SOCKET="/x")) is None
    assert L.detect({}) is None


def test_multinode_needs_rendezvous_and_secret():
    mpich = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(L.LauncherError, match="HVDD_RENDEZVOUS"):
        L.check_multinode(L.detect(mpich))  # type: ignore[arg-type]
    with pytest.raises(L.LauncherError, match="HVDD_SECRET"):
        L.check_multinode(L.detect(dict(mpich, HVDD_RENDEZVOUS="h:1")))  # type: ignore[arg-type]
    with pytest.raises(L.LauncherError, match="HVDD_SECRET"):
        L.check_multinode(L.detect(slurm_env(0, 0, "gpu01")))  # type: ignore[arg-type]
    # Open MPI: node 0 away from mpirun's host cannot serve mpirun's address.
    off = ompi_env(0, 4, 0, 2, OMPI_MCA_orte_local_daemon_uri="2050686976.1;tcp://10.1.0.2:4000")
    with pytest.raises(L.LauncherError, match="does not run on mpirun's host"):
        L.check_multinode(L.detect(off))  # type: ignore[arg-type]
    L.check_multinode(L.detect(dict(off, HVDD_RENDEZVOUS="10.1.0.2:29500")))  # type: ignore[arg-type]
    with pytest.raises(L.LauncherError, match="HOST:PORT"):
        L.detect(dict(off, HVDD_RENDEZVOUS="10.1.0.2"))


def test_daemon_args():
    p = L.detect(ompi_env(5, 8, 1, 4))
    assert p is not None
    argv = L.daemon_args(p, "/bin/hvdd", ("/r/s.sock", "/r/s.lock", "/r/s.log"), 120, "warning")
    assert argv[:8] == [
        "/bin/hvdd",
        "serve",
        "--slots",
        "4",
        "--socket",
        "/r/s.sock",
        "--exit-after-job",
        "--idle-exit",
    ]
    assert argv[argv.index("--nodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--rendezvous") + 1] == p.rendezvous
    assert argv[argv.index("--remove-on-exit") + 1] == "/r/s.lock"


def test_joins_the_node_daemon(hvdd_bin):
    """A daemon that listens on the node's socket is the one a launched job
    joins; without it the job's own is started (and that one's files live
    beside the node socket)."""
    tmp = tempfile.mkdtemp(prefix="hvdd-launch-")
    node = os.path.join(tmp, "hvdd.sock")
    d = subprocess.Popen([hvdd_bin, "serve", "--slots", "1", "--socket", node, "--log-level", "error"])
    try:
        p = L.detect(ompi_env(0, 1, 0, 1))
        assert p is not None
        deadline_s = 30.0
        got = _wait_listening(node, deadline_s)
        assert got, "the node daemon never listened"
        assert L.ensure_daemon(p, node, hvdd_bin, 30) == node
    finally:
        d.terminate()
        d.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_listening(path: str, timeout: float) -> bool:
    """Waits for a daemon's socket by connecting (each try blocks in the
    kernel until refused), up to timeout."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if L._connectable(path):
            return True
        select.select([], [], [], 0.01)
    return False


# ---------------------------------------------------------------- real launchers


def _env(hvdd_bin: str, **extra: str) -> dict[str, str]:
    """The environment of a launcher and its ranks; $RESULTS must be added."""
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("HVDD_", "OMPI_COMM", "PMI_", "SLURM_", "HOROVOD_")):
            del e[k]
    e.update(
        HVDD_BIN=hvdd_bin,
        PYTHONPATH=CLIENT + os.pathsep + e.get("PYTHONPATH", ""),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rtc="^hwloc",
        HVDD_START_TIMEOUT="60",
        OMP_NUM_THREADS="1",
    )
    e.update(extra)
    return e


def _results(out: str) -> list[dict]:
    rs = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            rs.append(json.load(f))
    return sorted(rs, key=lambda r: r["rank"])


def _wait_exit(pid: int, timeout: float) -> bool:
    """Waits for a process that is not our child to exit (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        r, _, _ = select.select([fd], [], [], timeout)
        return bool(r)
    finally:
        os.close(fd)


def _check_job(out: str, np: int, hosts: int) -> list[dict]:
    """Checks the results the ranks wrote in the directory out."""
    rs = _results(out)
    assert [r["rank"] for r in rs] == list(range(np)), rs
    per = np // hosts
    for r in rs:
        assert r["rank"] == r["env_rank"], r  # the launcher's rank
        assert (r["size"], r["local_size"], r["cross_size"]) == (np, per, hosts), r
        assert (r["local_rank"], r["cross_rank"]) == (r["rank"] % per, r["rank"] // per), r
        assert r["sum"] == np * (np + 1) / 2, r
        assert r["gathered"] == list(range(np)), r
    # Exactly one daemon per host, shared by its ranks, gone after the job
    # with its socket and lock.
    for h in range(hosts):
        pids = {r["daemon_pid"] for r in rs[h * per : (h + 1) * per]}
        assert len(pids) == 1, f"host {h}'s ranks reached daemons {pids}"
    assert len({r["daemon_pid"] for r in rs}) == hosts
    for r in rs:
        assert _wait_exit(r["daemon_pid"], 30), f"daemon {r['daemon_pid']} still runs after the job"
        assert not os.path.exists(r["socket"]), r["socket"]
        assert not os.path.exists(r["socket"][: -len(".sock")] + ".lock")
    return rs


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} missing: scripts/setup.sh installs it (openmpi-bin, mpich)")
    return path


def test_mpirun_one_host(hvdd_bin, tmp_path):
    """The seeds' `mpirun -np 4 python train.py`: nothing else."""
    mpirun = _need("mpirun")
    r = _run([mpirun, "-np", "4", "--oversubscribe", sys.executable, WORKER], _env(hvdd_bin, RESULTS=str(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    _check_job(str(tmp_path), 4, 1)


def test_mpich_one_host(hvdd_bin, tmp_path):
    mpiexec = _need("mpiexec.mpich")
    r = _run([mpiexec, "-n", "3", sys.executable, WORKER], _env(hvdd_bin, RESULTS=str(tmp_path)))
    assert r.returncode == 0, r.stdout + r.stderr
    _check_job(str(tmp_path), 3, 1)


def _agent(tmp: str) -> str:
    """mpirun's ssh stand-in: every "host" is this machine, each orted with a
    session directory of its own (as cmd/hvdd's MPI tests do)."""
    path = os.path.join(tmp, "agent")
    with open(path, "w") as f:
        f.write(
            "#!/bin/sh\n"
            f"OMPI_MCA_orte_tmpdir_base={tmp}/ompi-$1; export OMPI_MCA_orte_tmpdir_base\n"
            'mkdir -p "$OMPI_MCA_orte_tmpdir_base"; shift\n'
            'exec sh -c "$*"\n'
        )
    os.chmod(path, 0o755)
    return path


FORWARD = ["-x", "PYTHONPATH", "-x", "HVDD_BIN", "-x", "HVDD_START_TIMEOUT", "-x", "RESULTS"]


def test_mpirun_two_hosts(hvdd_bin, tmp_path):
    """`mpirun -np 4 -H localhost:2,127.0.0.3:2`: rank 0 on mpirun's host, so
    the daemons meet at mpirun's address with Open MPI's per-job key as the
    secret: no variable to pass."""
    mpirun = _need("mpirun")
    out = tmp_path / "out"
    out.mkdir()
    cmd = [mpirun, "-np", "4", "-H", "localhost:2,127.0.0.3:2", "--mca", "plm_rsh_agent", _agent(str(tmp_path))]
    r = _run(cmd + FORWARD + [sys.executable, WORKER], _env(hvdd_bin, RESULTS=str(out)))
    assert r.returncode == 0, r.stdout + r.stderr
    _check_job(str(out), 4, 2)


def test_mpirun_rank0_away_from_mpirun(hvdd_bin, tmp_path):
    """Rank 0 on a host other than mpirun's: init says to pass
    HVDD_RENDEZVOUS, and with it (`-x`) the job runs."""
    mpirun = _need("mpirun")
    out = tmp_path / "out"
    out.mkdir()
    base = [mpirun, "-np", "4", "-H", "127.0.0.2:2,127.0.0.3:2", "--mca", "plm_rsh_agent", _agent(str(tmp_path))]
    base += FORWARD
    r = _run(base + [sys.executable, WORKER], _env(hvdd_bin, HVDD_START_TIMEOUT="20", RESULTS=str(out)))
    assert r.returncode != 0
    assert "rank 0 does not run on mpirun's host" in r.stdout + r.stderr, r.stdout + r.stderr
    port = L.derived_port(f"test-{os.getpid()}")
    env = _env(hvdd_bin, HVDD_RENDEZVOUS=f"127.0.0.2:{port}", RESULTS=str(out))
    r = _run(base + ["-x", "HVDD_RENDEZVOUS", sys.executable, WORKER], env)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_job(str(out), 4, 2)


def test_mpich_two_hosts(hvdd_bin, tmp_path):
    """MPICH across two "hosts" (Hydra's proxies through an agent), with the
    rendezvous and secret in the environment that Hydra passes on."""
    mpiexec = _need("mpiexec.mpich")
    agent = tmp_path / "agent"
    # Hydra calls: AGENT -x HOST COMMAND...
    agent.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nshift\nexec sh -c "$*"\n')
    agent.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    port = L.derived_port(f"mpich-{os.getpid()}")
    env = _env(hvdd_bin, RESULTS=str(out), HVDD_RENDEZVOUS=f"127.0.0.2:{port}", HVDD_SECRET=os.urandom(32).hex())
    cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(agent), "-hosts", "127.0.0.2:2,127.0.0.3:2", "-n", "4"]
    r = _run(cmd + [sys.executable, WORKER], env)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_job(str(out), 4, 2)


def _srun(hvdd_bin: str, out: str, hosts: list[str], per: int, extra: Optional[dict[str, str]] = None) -> None:
    """Starts per ranks on each host as srun would (its variables, block
    distribution), each writing its result into out."""
    np = per * len(hosts)
    procs = []
    for rank in range(np):
        node = rank // per
        env = _env(
            hvdd_bin,
            RESULTS=out,
            SLURM_JOB_ID=str(os.getpid()),
            SLURM_STEP_ID="0",
            SLURM_STEP_NODELIST=",".join(hosts),
            SLURM_STEP_TASKS_PER_NODE=f"{per}(x{len(hosts)})",
            SLURM_STEP_NUM_TASKS=str(np),
            SLURM_NTASKS=str(np),
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank % per),
            SLURM_NODEID=str(node),
            SLURMD_NODENAME=hosts[node],
            **(extra or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outs = communicate_all(procs, 120)
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)


def test_srun_two_hosts(hvdd_bin, tmp_path):
    """srun's variables on two "hosts" (loopback addresses): the daemons meet
    on the step's first host with the secret the job exported."""
    _srun(hvdd_bin, str(tmp_path), ["127.0.0.2", "127.0.0.3"], 2, {"HVDD_SECRET": os.urandom(32).hex()})
    _check_job(str(tmp_path), 4, 2)


def test_srun_without_secret_says_so(hvdd_bin, tmp_path):
    env = _env(
        hvdd_bin,
        RESULTS=str(tmp_path),
        SLURM_JOB_ID="1",
        SLURM_STEP_ID="0",
        SLURM_STEP_NODELIST="127.0.0.[2-3]",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        SLURMD_NODENAME="127.0.0.2",
    )
    r = _run([sys.executable, WORKER], env, timeout=60)
    assert r.returncode != 0
    assert "need a shared secret: set HVDD_SECRET" in r.stdout + r.stderr, r.stdout + r.stderr
