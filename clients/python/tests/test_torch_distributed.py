"""hvdd as a torch.distributed backend (``hvdd.torch.distributed``): real
torchrun jobs (and jobs started as a user's own launcher would, for the
init methods), on a real daemon that the job's processes start for
themselves (``$HVDD_BIN``), with gloo as the reference in the same
processes (torch_distributed_workers.py runs every call on both).

Needs torch 2.15 or later; on an older torch only the test of the error it
gives runs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from typing import Optional, Sequence

import pytest
from elastic_helpers import communicate_all

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
WORKERS = os.path.join(HERE, "torch_distributed_workers.py")
EXAMPLE = os.path.join(ROOT, "examples", "pytorch_ddp_mnist.py")
PYPROJECT = os.path.join(ROOT, "clients", "python", "pyproject.toml")
SUPPORTED = (2, 15)

torch = pytest.importorskip("torch")


def _version(v: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


new_torch = pytest.mark.skipif(
    _version(torch.__version__) < SUPPORTED, reason=f"torch {torch.__version__} is older than the backend supports"
)


@pytest.fixture
def env(hvdd_bin: str, tmp_path) -> dict:
    """The environment of a job's processes: the daemon binary, and a runtime
    directory of the test's own (no daemon on its default socket: the job's
    processes start one)."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HVDD_", "HOROVOD_", "OMPI_", "PMI_", "SLURM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    e.update(HVDD_BIN=hvdd_bin, XDG_RUNTIME_DIR=str(run), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return e


def _daemon_logs(env: dict) -> str:
    # The job's daemon logs beside the default socket: $XDG_RUNTIME_DIR's, or
    # /run/hvdd's for root (hvdd._env.default_socket_path).
    d = "/run/hvdd" if os.geteuid() == 0 else env["XDG_RUNTIME_DIR"]
    out = []
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if f.endswith(".log"):
            with open(os.path.join(d, f), errors="replace") as fh:
                out.append(f"--- {f}\n{fh.read()[-3000:]}")
    return "\n".join(out)


def torchrun(
    env: dict,
    args: Sequence[str],
    nproc: int = 2,
    flags: Sequence[str] = (),
    timeout: float = 300,
    check: bool = True,
    script: str = WORKERS,
    cwd: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Runs ``torchrun --standalone --nproc-per-node nproc script args``."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [exe, "--standalone", f"--nproc-per-node={nproc}", *flags, script, *args]
    # In a session of its own: a job that overruns is killed whole (torchrun,
    # its workers and the daemon they started), not torchrun alone.
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[TIMED OUT after {timeout:g} s]"
    p = subprocess.CompletedProcess(cmd, proc.returncode, out)
    if check:
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{_daemon_logs(env)}"
    return p


def _oks(out: str, scenario: str, n: int) -> None:
    got = sorted(int(m) for m in re.findall(rf"^OK {scenario} (\d+)", out, re.M))
    assert got == list(range(n)), f"ranks that finished {scenario}: {got}\n{out}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------ registering


@new_torch
def test_import_registers_the_backend(env: dict) -> None:
    code = textwrap.dedent(
        """
        import torch.distributed as dist
        assert "hvdd" not in dist.Backend.backend_list
        import hvdd.torch.distributed as htd
        assert "hvdd" in dist.Backend.backend_list, dist.Backend.backend_list
        assert dist.Backend.HVDD == "hvdd"
        assert dist.Backend.backend_capability["hvdd"] == ["cpu", "cuda"], dist.Backend.backend_capability
        assert dist.Backend("hvdd") == "hvdd"
        htd.register()  # idempotent
        print("registered")
        """
    )
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "registered" in p.stdout, p.stdout + p.stderr


def _entry_point() -> str:
    """The ``torch.distributed.backends`` entry point of clients/python's pyproject.toml."""
    text = open(PYPROJECT).read()
    m = re.search(r'\[project\.entry-points\."torch\.distributed\.backends"\]\s*\n\s*hvdd\s*=\s*"([^"]+)"', text)
    assert m, "pyproject.toml has no torch.distributed.backends entry point named hvdd"
    return m.group(1)


@new_torch
def test_entry_point_loads_the_backend_without_an_import(env: dict, tmp_path) -> None:
    """torch finds the backend through the package's entry point: the
    program names "hvdd" and never imports hvdd (a one-rank job on a
    file:// store, which starts its own daemon)."""
    site = tmp_path / "site"
    dist_info = site / "hvdd_entry_point_check-0.0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hvdd-entry-point-check\nVersion: 0.0.0\n")
    (dist_info / "entry_points.txt").write_text(f"[torch.distributed.backends]\nhvdd = {_entry_point()}\n")
    code = textwrap.dedent(
        f"""
        import sys, torch, torch.distributed as dist
        assert not any(m.startswith("hvdd") for m in sys.modules)
        dist.init_process_group("hvdd", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        assert "hvdd.torch.distributed" in sys.modules
        assert dist.get_backend() == "hvdd"
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        dist.destroy_process_group()
        print("autoloaded")
        """
    )
    e = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")])))
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "autoloaded" in p.stdout, p.stdout + p.stderr + _daemon_logs(env)


def _old_torch_python() -> Optional[str]:
    """A Python whose torch is older than the backend supports: this one, or
    the repository's .venv (Debian's torch)."""
    if _version(torch.__version__) < SUPPORTED:
        return sys.executable
    other = os.path.join(ROOT, ".venv", "bin", "python")
    if not os.access(other, os.X_OK):
        return None
    p = subprocess.run([other, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if p.returncode != 0 or _version(p.stdout.strip()) >= SUPPORTED:
        return None
    return other


def test_older_torch_gets_an_error_naming_the_supported_versions() -> None:
    py = _old_torch_python()
    if py is None:
        pytest.skip("no Python with a torch older than 2.15 here")
    code = "import hvdd.torch.distributed"
    e = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "clients", "python"))
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert p.returncode != 0
    assert "ImportError" in p.stderr and "supports torch 2.15 and later" in p.stderr, p.stderr


# ------------------------------------------------------------ collectives


@new_torch
def test_all_reduce_every_dtype_and_op_against_gloo(env: dict) -> None:
    p = torchrun(env, ["allreduce_matrix"], nproc=3)
    _oks(p.stdout, "allreduce_matrix", 3)
    m = re.search(r"checked (\d+) dtype x op combinations against gloo", p.stdout)
    assert m and int(m.group(1)) > 20, p.stdout


@new_torch
def test_collectives_against_gloo(env: dict) -> None:
    p = torchrun(env, ["collectives"], nproc=3)
    _oks(p.stdout, "collectives", 3)


@new_torch
def test_async_works_and_futures(env: dict) -> None:
    p = torchrun(env, ["async_ops"], nproc=3)
    _oks(p.stdout, "async_ops", 3)


@new_torch
def test_new_group_runs_on_process_sets(env: dict) -> None:
    p = torchrun(env, ["subgroups"], nproc=3)
    _oks(p.stdout, "subgroups", 3)


@new_torch
def test_new_group_with_local_synchronization(env: dict) -> None:
    """new_group(use_local_synchronization=True), called by the group's
    members only, on one node: the daemon registers the set among them."""
    p = torchrun(env, ["local_groups"], nproc=4)
    _oks(p.stdout, "local_groups", 4)


@new_torch
def test_new_group_with_local_synchronization_across_nodes(env: dict) -> None:
    """The same on two "hosts" of 2 ranks: the pairs' sets are decided by the
    coordinator, one of them from the other node's requests alone, and
    [1, 2] spans the nodes."""
    ps = torchrun_nodes(env, ["local_groups"], [2, 2])
    out = "\n".join(p.stdout for p in ps)
    for p in ps:
        assert p.returncode == 0, f"{' '.join(p.args)} exited {p.returncode}:\n{out}\n{_daemon_logs(env)}"
    _oks(out, "local_groups", 4)


# ------------------------------------------------------------------- DDP


@new_torch
def test_ddp_losses_match_gloo(env: dict) -> None:
    variants = "default,bucket_view,find_unused,static_graph,no_sync,allreduce_hook,fp16_hook,bf16_hook"
    p = torchrun(env, ["ddp", variants], nproc=2)
    _oks(p.stdout, "ddp", 2)
    for v in variants.split(","):
        assert re.search(rf"DDP {v}: losses .* match gloo's", p.stdout), (v, p.stdout)


# -------------------------------------------------------------- start-up


@new_torch
def test_destroy_then_init_again(env: dict) -> None:
    p = torchrun(env, ["reinit"], nproc=2)
    _oks(p.stdout, "reinit", 2)


@new_torch
@pytest.mark.parametrize("mode", ["tcp", "file", "store"])
def test_init_methods(env: dict, tmp_path, mode: str) -> None:
    """tcp:// and file:// init methods and an explicit store, with processes
    started as a user's own launcher would (rank and world size given)."""
    where = str(tmp_path / "rdv") if mode == "file" else f"127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, WORKERS, "launched", mode, str(r), "2", where],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = communicate_all(procs, 120)
    for r, (p, o) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"OK launched {mode} {r}" in o, f"rank {r} exited {p.returncode}:\n{o}"


@new_torch
def test_under_hvdd_run(env: dict, hvdd_bin: str, tmp_path) -> None:
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "2", sys.executable, WORKERS, "hvdd_run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout
    for r in range(2):
        assert f"OK hvdd_run {r}" in p.stdout, p.stdout


@new_torch
def test_hvdd_run_without_an_import(env: dict, hvdd_bin: str, tmp_path) -> None:
    """Under hvdd run a program that never imports hvdd names the backend:
    hvdd run's RANK, WORLD_SIZE, MASTER_ADDR, ... serve torch's env://
    rendezvous, and torch loads the backend through its entry point."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(
            """
            import os, sys, torch, torch.distributed as dist
            assert not any(m.startswith("hvdd") for m in sys.modules)
            dist.init_process_group("hvdd")
            assert "hvdd.torch.distributed" in sys.modules and dist.get_backend() == "hvdd"
            rank = dist.get_rank()
            assert rank == int(os.environ["RANK"]) == int(os.environ["HVDD_RANK"]), rank
            assert dist.get_world_size() == int(os.environ["WORLD_SIZE"]) == 2
            assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["LOCAL_WORLD_SIZE"] == "2"
            assert os.environ["GROUP_RANK"] == "0"
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            assert t.tolist() == [3.0] * 4, t
            dist.destroy_process_group()
            sys.stdout.write(f"OK noimport {rank}\\n")
            """
        )
    )
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "2", "--", sys.executable, str(worker)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout + _daemon_logs(env)
    for r in range(2):
        assert f"OK noimport {r}" in p.stdout, p.stdout


@new_torch
def test_init_timeout_is_honoured(env: dict, tmp_path) -> None:
    """A job whose second rank never comes: init_process_group raises after
    its timeout (3 s), naming the rank, not after the default 30 minutes."""
    p = subprocess.run(
        [sys.executable, WORKERS, "init_timeout", str(tmp_path / "rdv"), "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"RAISED after ([\d.]+) s: (.*)", p.stdout)
    assert m, p.stdout + p.stderr
    assert 3 <= float(m.group(1)) < 30, m.group(0)
    assert "rank(s) [1] of 2 did not arrive within 3 s" in m.group(2), m.group(0)


@new_torch
def test_collective_timeout_is_honoured(env: dict) -> None:
    """A collective that a rank does not join within the process group's
    timeout (3 s) fails with an error saying so."""
    p = torchrun(env, ["op_timeout"], nproc=2)
    _oks(p.stdout, "op_timeout", 2)
    m = re.search(r"RAISED after ([\d.]+) s: (.*)", p.stdout)
    assert m, p.stdout
    assert 3 <= float(m.group(1)) < 10, m.group(0)
    assert m.group(2).startswith("DistBackendError") and "did not complete within" in m.group(2), m.group(0)


# --------------------------------------------------------------- failures


@new_torch
@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_lost_rank_is_named_at_once(env: dict, how: str) -> None:
    """Rank 1 of 3 is killed (or raises); the others' pending all_reduce
    raises within 2 s naming rank 1, and so does their next one (gloo would
    wait out the 300 s timeout)."""
    p = torchrun(env, ["fault", how], nproc=3, flags=["--monitor-interval=10"], check=False)
    raised = re.findall(r"^RAISED after ([\d.]+) s: (.*)$", p.stdout, re.M)
    assert len(raised) == 2, p.stdout
    for secs, msg in raised:
        assert float(secs) < 2.0, (secs, msg)
        assert msg.startswith("DistBackendError") and "rank 1 " in msg, msg
    nxt = re.findall(r"^NEXT RAISED: (.*)$", p.stdout, re.M)
    assert len(nxt) == 2 and all("rank 1 " in m for m in nxt), p.stdout


@new_torch
def test_mismatched_tensors_raise_on_every_rank(env: dict) -> None:
    p = torchrun(env, ["mismatch"], nproc=2)
    shapes = re.findall(r"^RAISED: (.*)$", p.stdout, re.M)
    assert len(shapes) == 2 and all("Mismatched ALLREDUCE tensor shapes" in m for m in shapes), p.stdout
    ops = re.findall(r"^RAISED OP: (.*)$", p.stdout, re.M)
    assert len(ops) == 2 and all("Mismatched operations" in m for m in ops), p.stdout


# ------------------------------------------------------- across two nodes


def torchrun_nodes(
    env: dict,
    args: Sequence[str],
    nprocs: Sequence[int],
    flags: Sequence[str] = (),
    timeout: float = 300,
    stop_after: Optional[int] = None,
) -> list:
    """Runs one ``torchrun --nnodes N --node-rank I`` agent per node (static
    rendezvous on 127.0.0.1, each agent its own --local-addr 127.0.0.I+1),
    nprocs[I] workers each, and returns their CompletedProcess objects.
    With stop_after, the other agents are killed once that node's exits."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    port = _free_port()
    procs = []
    for i, n in enumerate(nprocs):
        cmd = [exe, f"--nnodes={len(nprocs)}", f"--node-rank={i}", f"--nproc-per-node={n}"]
        cmd += ["--master-addr=127.0.0.1", f"--master-port={port}", f"--local-addr=127.0.0.{i + 1}", *flags]
        cmd += [WORKERS, *args]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        )
    if stop_after is not None:
        # torchrun's agents wait at an exit barrier (5 minutes) for an agent
        # that failed: once node stop_after's agent exits, the rest are
        # stopped (their session: the agent, its workers, their daemon).
        try:
            procs[stop_after].wait(timeout)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    outs = communicate_all(procs, timeout)
    return [subprocess.CompletedProcess(p.args, p.returncode, out) for p, out in zip(procs, outs)]


@new_torch
def test_torchrun_across_two_nodes(env: dict) -> None:
    """torchrun --nnodes 2 (one agent per "host"), no daemon running: each
    node's ranks start their node's daemon, which meet at a rendezvous on
    rank 0's host; every collective matches gloo's in the same processes,
    and the job ran as one job of 2 nodes."""
    ps = torchrun_nodes(env, ["collectives"], [2, 2])
    out = "\n".join(p.stdout for p in ps)
    for p in ps:
        assert p.returncode == 0, f"{' '.join(p.args)} exited {p.returncode}:\n{out}\n{_daemon_logs(env)}"
    _oks(out, "collectives", 4)
    places = sorted(re.findall(r"^PLACE (\d+) (.*)$", out, re.M))
    want = [(str(r), f"nodes 2 local {r % 2}/2") for r in range(4)]
    assert places == want, out


@new_torch
def test_torchrun_across_two_nodes_names_a_lost_rank(env: dict) -> None:
    """Rank 1 of 3 (node 0 runs rank 0, node 1 ranks 1 and 2) is SIGKILLed:
    rank 0 on the other node and rank 2 beside it raise within 2 s, naming
    rank 1 (gloo would wait out the 300 s timeout)."""
    ps = torchrun_nodes(env, ["fault", "kill"], [1, 2], flags=["--monitor-interval=10"], stop_after=1)
    out = "\n".join(p.stdout for p in ps)
    raised = re.findall(r"^RAISED after ([\d.]+) s: (.*)$", out, re.M)
    assert len(raised) == 2, out + _daemon_logs(env)
    for secs, msg in raised:
        assert float(secs) < 2.0, (secs, msg)
        assert msg.startswith("DistBackendError") and "rank 1 " in msg, msg


# ------------------------------------------------------------ restarts


def _attempts(out: str) -> dict:
    """{attempt: {rank: (job, socket)}} from the restart scenario's lines."""
    got: dict = {}
    for a, r, job, sock in re.findall(r"^ATTEMPT (\d+) rank (\d+) job (\S+) socket (\S+)$", out, re.M):
        got.setdefault(int(a), {})[int(r)] = (job, sock)
    return got


@new_torch
def test_torchrun_max_restarts_forms_again(env: dict) -> None:
    """torchrun --max-restarts 1: rank 1 raises in the first attempt; torchrun
    restarts the workers, whose new group forms (a new job, on daemons the
    ranks start again) and computes; the first attempt's other ranks saw
    their next collective raise."""
    p = torchrun(env, ["restart"], nproc=3, flags=["--max-restarts=1", "--monitor-interval=1"])
    got = _attempts(p.stdout)
    assert sorted(got) == [0, 1] and all(sorted(v) == [0, 1, 2] for v in got.values()), p.stdout
    assert len({j for j, _ in got[0].values()}) == 1 and len({j for j, _ in got[1].values()}) == 1, got
    assert got[0][0][0] != got[1][0][0], got  # a new job
    assert len(re.findall(r"^ATTEMPT 0 rank \d raised: DistBackendError", p.stdout, re.M)) == 2, p.stdout
    _oks(p.stdout, "restart", 3)


@new_torch
def test_torchrun_max_restarts_on_the_node_daemon(env: dict, hvdd_bin: str, tmp_path) -> None:
    """The same restart with a daemon serving the node (as systemd runs it):
    both attempts' groups form on that daemon, which stays up, serving, after
    the job."""
    sock = str(tmp_path / "node.sock")
    dlog = open(tmp_path / "node-daemon.log", "w")
    d = subprocess.Popen([hvdd_bin, "serve", "--slots", "3", "--socket", sock], env=env, stdout=dlog, stderr=dlog)
    try:
        # the ranks wait for the socket (their start timeout)
        p = torchrun(
            {**env, "HVDD_SOCKET": sock}, ["restart"], nproc=3, flags=["--max-restarts=1", "--monitor-interval=1"]
        )
        got = _attempts(p.stdout)
        assert sorted(got) == [0, 1], p.stdout
        assert {s for a in got.values() for _, s in a.values()} == {sock}, got
        _oks(p.stdout, "restart", 3)
        assert d.poll() is None, "the node's daemon exited"
        st = subprocess.run([hvdd_bin, "status", "--socket", sock], env=env, capture_output=True, text=True)
        assert st.returncode == 0, st
    finally:
        d.terminate()
        d.wait(30)
        dlog.close()


# --------------------------------------------------------------- example


@new_torch
def test_ddp_mnist_example_under_torchrun(env: dict, tmp_path) -> None:
    p = torchrun(env, ["--epochs", "1", "--synthetic-size", "4000"], nproc=2, script=EXAMPLE, cwd=str(tmp_path))
    acc = re.findall(r"Test set: Average loss: ([\d.]+), Accuracy: ([\d.]+)%", p.stdout)
    assert acc, p.stdout
    assert float(acc[-1][1]) > 30.0, p.stdout  # chance: 10%
