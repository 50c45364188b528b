"""A rank SIGKILLed in the middle of device allreduces, on the real GPU
(issue 26, item 5; scripts/gpu-check.sh's kill-mid-allreduce step):

    python3 clients/python/tests/gpu/kill_mid_allreduce.py [--hvdd bin/hvdd] [--json FILE]

The driver (this script without --worker) starts one daemon
(hvdd serve --gpu cuda --slots 2, with --metrics-addr on loopback) and runs
two jobs on it, each two rank processes on cuda:0 that it starts itself with
hvdd's rank variables, as the Python tests' job fixture does. (Not under
hvdd run: when a rank dies, hvdd run sends SIGTERM to the others at once and
exits with the dead rank's status, 137, so the survivor would be stopped
before it could show the error it got.)

job 1 (--worker victim): both ranks allreduce --tensors tensors of --mib MiB
    (float32, in place, asynchronously: hvd.allreduce_async_) a few rounds,
    checking the sums; then rank 1 submits a round, waits for its first op
    (so that both ranks' ops are in the daemon, which works on the rest with
    rank 1's IPC mappings open), and SIGKILLs itself, noting the time. Rank 0
    must get HorovodInternalError naming rank 1 within --limit seconds (2) of
    the kill.
released: the daemon's hvdd_gpu_device_ops_total{kind="open"} and
    {kind="close"} (IPC memory handles and events opened and closed) must
    be equal once the job is gone, within 10 s; where nvidia-smi showed the
    killed rank's pid on the GPU, it must be gone from
    nvidia-smi --query-compute-apps too (its memory freed).
job 2 (--worker check): a new job on the same daemon and GPU: allreduces of
    --mib MiB, 1 MiB and 4 KiB (Sum and Average), every element checked;
    then the counters must be equal again.

Prints each check as PASS or FAIL with its figures (and, with --json, writes
them); exit status 0 if all passed, 1 if not, 3 without torch or a CUDA
device (the reason printed). --device fake runs the same on the daemon's
fake CUDA driver (gpu/fake) and tests/fake_cuda.py's memfd "device memory",
--device cpu on host tensors (no device counters): both for checking this
script on a machine without GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
NO_DEVICE = 3


def _parse(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--hvdd", help="the hvdd binary (default $HVDD_BIN, else bin/hvdd)")
    ap.add_argument("--device", choices=("cuda", "fake", "cpu"), default="cuda")
    ap.add_argument("--mib", type=float, default=256, help="MiB per tensor (default 256)")
    ap.add_argument("--tensors", type=int, default=6, help="allreduces per round")
    ap.add_argument("--rounds", type=int, default=3, help="checked rounds before the kill")
    ap.add_argument("--limit", type=float, default=2.0, help="seconds from the kill to the survivor's error")
    ap.add_argument("--job-timeout", type=float, default=90, help="seconds a job may take")
    ap.add_argument("--json", help="write the checks and figures to this file")
    ap.add_argument("--worker", choices=("victim", "check"), help=argparse.SUPPRESS)
    ap.add_argument("--stamp", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---------------------------------------------------------------------- ranks


def _rank_setup(a):
    """hvd initialised, and make(n, value): a float32 tensor of n elements on
    the device under test."""
    import torch

    import hvdd.torch as hvd

    hvd.init()
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("HVDD_TEST_CUDA_DEVICE", "0")))
        torch.cuda.set_device(dev)

        def make(n, v):
            return torch.full((n,), v, dtype=torch.float32, device=dev)

        def sync():
            torch.cuda.synchronize(dev)

    elif a.device == "fake":
        sys.path.insert(0, os.path.dirname(HERE))  # tests/: fake_cuda
        from fake_cuda import FakeDevice

        from hvdd import _cuda
        from hvdd import basics as _basics

        uuids = sorted(_basics.client().gpu_uuids())
        assert uuids, "the daemon lists no GPUs: is it running with --gpu fake?"
        fake = FakeDevice(uuids[0])
        _cuda.install_exporter(fake)

        def make(n, v):
            return fake.tensor(torch.full((n,), v, dtype=torch.float32))

        def sync():
            pass

    else:

        def make(n, v):
            return torch.full((n,), v, dtype=torch.float32)

        def sync():
            pass

    return hvd, torch, make, sync


def _elems(mib: float) -> int:
    return max(1, int(mib * (1 << 20)) // 4)


def worker_victim(a) -> int:
    hvd, torch, make, sync = _rank_setup(a)
    r, n = hvd.rank(), hvd.size()
    assert n == 2, f"2 ranks wanted, {n}"
    ts = [make(_elems(a.mib), float(r + 1)) for _ in range(a.tensors)]
    want = float(n * (n + 1) // 2)

    def submit():
        for t in ts:
            t.fill_(float(r + 1))
        return [hvd.allreduce_async_(t, op=hvd.Sum, name=f"big.{i}") for i, t in enumerate(ts)]

    for k in range(a.rounds):
        for h in submit():
            hvd.synchronize(h)
        for i, t in enumerate(ts):
            if not bool((t == want).all()):
                print(f"rank {r}: round {k} tensor {i}: {t[:4].tolist()}, want {want}", file=sys.stderr)
                return 1
    sync()
    print(f"rank {r}: {a.rounds} rounds of {a.tensors} x {a.mib:g} MiB allreduces right")
    if r == 1:
        hs = submit()
        hvd.synchronize(hs[0])
        pending = sum(1 for h in hs[1:] if not hvd.poll(h))
        print(
            f"rank 1 (pid {os.getpid()}): SIGKILL now, {pending} of the round's other {len(hs) - 1} allreduces pending"
        )
        with open(a.stamp + ".tmp", "w") as f:
            json.dump({"pending": pending, "of": len(hs) - 1, "pid": os.getpid(), "monotonic": time.monotonic()}, f)
        os.rename(a.stamp + ".tmp", a.stamp)
        os.kill(os.getpid(), signal.SIGKILL)
        return 1  # not reached
    # rank 0: go on until an op fails (the first round may complete: rank 1
    # had sent all of it).
    t0 = time.monotonic()
    err = None
    rounds = 0
    try:
        while time.monotonic() - t0 < 30:
            for h in submit():
                hvd.synchronize(h)
            rounds += 1
    except Exception as e:  # noqa: BLE001 (the type is checked below)
        err = e
    t_err = time.monotonic()
    if err is None:
        print("rank 0: no error within 30 s of the kill", file=sys.stderr)
        return 1
    stamp = None
    for _ in range(100):
        if os.path.exists(a.stamp):
            with open(a.stamp) as f:
                stamp = json.load(f)
            break
        time.sleep(0.02)
    res = {
        "error_type": f"{type(err).__module__}.{type(err).__qualname__}",
        "horovod_internal_error": isinstance(err, hvd.HorovodInternalError),
        "message": str(err),
        "rounds_completed_after_kill": rounds,
        "after_kill_s": (t_err - stamp["monotonic"]) if stamp else None,
        "pending_at_kill": stamp["pending"] if stamp else None,
        "ops_per_round": stamp["of"] + 1 if stamp else None,
    }
    print(f"rank 0: {res['error_type']} {res['after_kill_s']!r} s after the kill: {res['message']}")
    with open(a.result, "w") as f:
        json.dump(res, f)
    try:
        hvd.shutdown()
    except Exception as e:  # noqa: BLE001 (the job has failed; shutdown may say so)
        print(f"rank 0: shutdown: {e}")
    return 0


def worker_check(a) -> int:
    hvd, torch, make, sync = _rank_setup(a)
    r, n = hvd.rank(), hvd.size()
    for mib in (a.mib, 1, 4 / 1024):
        for it in range(3):
            x = make(_elems(mib), float(r + 1 + it))
            hvd.allreduce_(x, op=hvd.Sum, name=f"check.{mib}")
            want = float(sum(k + 1 + it for k in range(n)))
            if not bool((x == want).all()):
                print(f"rank {r}: {mib:g} MiB Sum {it}: {x[:4].tolist()}, want {want}", file=sys.stderr)
                return 1
        x = make(_elems(mib), float(2 * (r + 1)))
        hvd.allreduce_(x, op=hvd.Average, name=f"check.avg.{mib}")
        want = float(sum(2 * (k + 1) for k in range(n)) / n)
        if not bool((x == want).all()):
            print(f"rank {r}: {mib:g} MiB Average: {x[:4].tolist()}, want {want}", file=sys.stderr)
            return 1
    sync()
    hvd.shutdown()
    print(f"rank {r}: the new job's allreduces ({a.mib:g} MiB, 1 MiB, 4 KiB; Sum and Average) right: OK")
    return 0


# --------------------------------------------------------------------- driver


class Checks:
    def __init__(self) -> None:
        self.items: list[dict] = []

    def add(self, name: str, ok, detail: str) -> None:
        """ok: True, False, or None (not checked here, and why)."""
        st = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
        self.items.append({"check": name, "status": st, "detail": detail})
        print(f"{st} {name}: {detail}", flush=True)

    def ok(self) -> bool:
        return all(i["status"] != "FAIL" for i in self.items)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counters(url: str) -> dict | None:
    """hvdd_gpu_device_ops_total by kind; None where the daemon has none (a
    CPU-only daemon) or /metrics does not answer."""
    try:
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as e:
        print(f"metrics: {url}: {e}")
        return None
    got = {}
    for m in re.finditer(r'^hvdd_gpu_device_ops_total\{kind="(\w+)"\} (\S+)$', body, re.M):
        got[m.group(1)] = int(float(m.group(2)))
    return got or None


def _released(url: str, within: float) -> tuple[dict | None, float]:
    """Polls the counters until open == close (or within seconds pass)."""
    t0 = time.monotonic()
    c = _counters(url)
    while c is not None and c.get("open") != c.get("close") and time.monotonic() - t0 < within:
        time.sleep(0.2)
        c = _counters(url)
    return c, time.monotonic() - t0


def _smi_pids() -> set[int] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {int(x) for x in out.split() if x.strip().isdigit()}


class SmiWatch(threading.Thread):
    """nvidia-smi's compute pids, sampled every half second while a job runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            p = _smi_pids()
            if p:
                self.seen |= p
            self.stop.wait(0.5)


def _job(a, hvdd_sock: str, tmp: str, name: str, worker: str, timeout: float, extra=()):
    """Runs the 2 ranks of one job (this script --worker WORKER); returns
    their return codes, outputs and pids."""
    procs, logs = [], []
    for r in range(2):
        env = dict(os.environ)
        env.update(
            HVDD_SOCKET=hvdd_sock,
            HVDD_RANK=str(r),
            HVDD_SIZE="2",
            HVDD_LOCAL_RANK=str(r),
            HVDD_LOCAL_SIZE="2",
            HVDD_START_TIMEOUT="60",
            HVDD_JOB=name,
            PYTHONUNBUFFERED="1",
            PYTHONPATH=os.pathsep.join(
                filter(None, [os.path.join(ROOT, "clients", "python"), os.environ.get("PYTHONPATH")])
            ),
        )
        path = os.path.join(tmp, f"{name}.rank{r}.log")
        logs.append(path)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            worker,
            "--device",
            a.device,
            "--mib",
            str(a.mib),
            "--tensors",
            str(a.tensors),
            "--rounds",
            str(a.rounds),
            *extra,
        ]
        with open(path, "w") as f:
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=tmp))
    deadline = time.monotonic() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    outs = []
    for r, path in enumerate(logs):
        with open(path) as f:
            o = f.read()
        outs.append(o)
        for line in o.splitlines():
            print(f"[{name} rank {r}] {line}")
    return [p.returncode for p in procs], outs, [p.pid for p in procs], timed_out


def driver(a) -> int:
    if a.device == "cuda":
        try:
            import torch
        except ImportError as e:
            print(f"no torch in {sys.executable}: {e}", file=sys.stderr)
            return NO_DEVICE
        if not torch.cuda.is_available():
            print(
                f"no CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available() is False)",
                file=sys.stderr,
            )
            return NO_DEVICE
    hvdd = a.hvdd or os.environ.get("HVDD_BIN") or os.path.join(ROOT, "bin", "hvdd")
    if not os.access(hvdd, os.X_OK):
        print(f"no hvdd binary at {hvdd} (--hvdd, $HVDD_BIN)", file=sys.stderr)
        return 1
    checks = Checks()
    figures: dict = {"device": a.device, "mib": a.mib, "tensors": a.tensors}
    tmp = tempfile.mkdtemp(prefix="hvdd-kill-")
    sock = os.path.join(tmp, "hvdd.sock")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    gpu = {"cuda": "cuda", "fake": "fake", "cpu": "off"}[a.device]
    dlog_path = os.path.join(tmp, "daemon.log")
    dcmd = [
        hvdd,
        "serve",
        "--slots",
        "2",
        "--socket",
        sock,
        "--gpu",
        gpu,
        "--metrics-addr",
        f"127.0.0.1:{port}",
        "--log-level",
        "info",
    ]
    print("daemon:", " ".join(dcmd), flush=True)
    with open(dlog_path, "w") as dlog:
        daemon = subprocess.Popen(dcmd, stdout=dlog, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if os.path.exists(sock) or daemon.poll() is not None:
                break
            time.sleep(0.1)
        if not os.path.exists(sock):
            checks.add("daemon", False, f"no socket after 30 s (exit status {daemon.poll()})")
            return 1
        before = _counters(url)
        figures["counters_start"] = before

        # job 1: rank 1 killed mid-op.
        stamp = os.path.join(tmp, "kill.stamp")
        result = os.path.join(tmp, "result.json")
        watch = SmiWatch() if a.device == "cuda" else None
        if watch:
            watch.start()
        rcs, outs, pids, timed_out = _job(
            a, sock, tmp, "victim", "victim", a.job_timeout, ["--stamp", stamp, "--result", result]
        )
        if watch:
            watch.stop.set()
            watch.join()
        figures["victim_pid"] = pids[1]
        checks.add(
            "victim killed",
            rcs[1] == -signal.SIGKILL,
            f"rank 1 (pid {pids[1]}) exit status {rcs[1]} (want -9: SIGKILL)",
        )
        res = None
        if os.path.exists(result):
            with open(result) as f:
                res = json.load(f)
        figures["survivor"] = res
        if timed_out and rcs[0] is not None and rcs[0] < 0:
            checks.add("survivor's error", False, f"rank 0 hung: killed after {a.job_timeout:g} s with no error")
        elif res is None:
            checks.add("survivor's error", False, f"rank 0 exit status {rcs[0]}, no result (its output is above)")
        else:
            named = "rank 1" in res["message"]
            checks.add(
                "survivor's error",
                res["horovod_internal_error"] and named and rcs[0] == 0,
                f"{res['error_type']} (HorovodInternalError: {res['horovod_internal_error']}; names rank 1: "
                f"{named}): {res['message']!r}",
            )
            dt = res["after_kill_s"]
            checks.add(
                "error within limit",
                dt is not None and dt <= a.limit,
                f"{dt:.3f} s after the kill (limit {a.limit:g} s); at the kill {res['pending_at_kill']} of "
                f"the round's other {res['ops_per_round'] - 1} allreduces were pending"
                if dt is not None
                else "no kill time (rank 1 wrote no stamp)",
            )
            if res["pending_at_kill"] == 0:
                print("note: no op was pending at the kill: the daemon held rank 1's mappings open, but between ops")

        # released: the daemon closes what it opened for the job.
        c1, waited = _released(url, 10)
        figures["counters_after_victim"] = c1
        if c1 is None:
            checks.add(
                "mappings released (victim job)",
                None if a.device == "cpu" else False,
                "the daemon has no hvdd_gpu_device_ops_total (CPU-only daemon)"
                if a.device == "cpu"
                else f"no hvdd_gpu_device_ops_total at {url}",
            )
        else:
            opened = c1.get("open", 0) - (before or {}).get("open", 0)
            checks.add(
                "mappings released (victim job)",
                c1.get("open") == c1.get("close") and opened > 0,
                f"opens {c1.get('open')} closes {c1.get('close')} ({opened} opened by the job; "
                f"equal {waited:.1f} s after it ended)"
                if c1.get("open") == c1.get("close")
                else f"opens {c1.get('open')} closes {c1.get('close')} still, 10 s after the job ended",
            )
        if watch:
            if pids[1] not in watch.seen:
                checks.add(
                    "victim's GPU memory freed",
                    None,
                    f"nvidia-smi never listed pid {pids[1]} (it listed {sorted(watch.seen) or 'none'}: "
                    "another PID namespace?)",
                )
            else:
                t0 = time.monotonic()
                now = _smi_pids()
                while now is not None and pids[1] in now and time.monotonic() - t0 < 10:
                    time.sleep(0.5)
                    now = _smi_pids()
                checks.add(
                    "victim's GPU memory freed",
                    now is not None and pids[1] not in now,
                    f"pid {pids[1]} gone from nvidia-smi --query-compute-apps after " f"{time.monotonic() - t0:.1f} s"
                    if now is not None and pids[1] not in now
                    else f"pid {pids[1]} still listed by nvidia-smi 10 s after the job: {sorted(now or [])}",
                )

        # job 2: a new job on the same daemon and GPU.
        rcs, outs, pids, timed_out = _job(a, sock, tmp, "next", "check", a.job_timeout)
        good = rcs == [0, 0] and all("OK" in o for o in outs)
        checks.add(
            "next job",
            good,
            "both ranks right"
            if good
            else f"exit statuses {rcs}{' (timed out)' if timed_out else ''}: see its output above",
        )
        c2, waited = _released(url, 10)
        figures["counters_after_next"] = c2
        if c2 is not None:
            opened = c2.get("open", 0) - (c1 or {}).get("open", 0)
            checks.add(
                "mappings released (next job)",
                c2.get("open") == c2.get("close") and opened > 0,
                f"opens {c2.get('open')} closes {c2.get('close')} ({opened} opened by the job)",
            )
        try:
            st = subprocess.run(
                [hvdd, "status", "--json", "--socket", sock], capture_output=True, text=True, timeout=10
            )
            print("hvdd status --json:", st.stdout.strip() or st.stderr.strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            print("hvdd status:", e)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        with open(dlog_path) as f:
            lines = f.read().splitlines()
        print(f"--- daemon log ({len(lines)} lines{', the last 150' if len(lines) > 150 else ''})")
        for line in lines[-150:]:
            print(line)
        shutil.rmtree(tmp, ignore_errors=True)
        figures["checks"] = checks.items
        if a.json:
            with open(a.json, "w") as f:
                json.dump(figures, f, indent=1, sort_keys=True)
                f.write("\n")
    print(("PASS" if checks.ok() else "FAIL") + ": " + ", ".join(f"{i['check']} {i['status']}" for i in checks.items))
    return 0 if checks.ok() else 1


def main(argv=None) -> int:
    a = _parse(argv)
    if a.worker == "victim":
        return worker_victim(a)
    if a.worker == "check":
        return worker_check(a)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
