"""Helpers of the end-to-end tests: wait for a job's processes
(``communicate_all``), run ``hvdd run`` and SIGKILL one of its workers once
the output shows training under way."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Callable, List, Sequence, Tuple


def child_with_rank(parent: int, rank: int) -> int:
    """The pid of parent's child process running with HVDD_RANK=rank."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if f"HVDD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(d)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no child of {parent} runs rank {rank}")


def run_acting(
    cmd: Sequence[str],
    env: dict,
    cwd: str,
    ready: Callable[[List[str]], bool],
    act: Callable[[int], None],
    timeout: float,
) -> Tuple[int, str, bool]:
    """Runs cmd (an ``hvdd run`` command line) and calls act(hvdd run's pid)
    once, as soon as ready(the output lines so far) holds. Returns hvdd run's
    exit status, its whole output and whether act ran. A run still going
    after timeout seconds is killed and fails the calling test (a hang)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    lines: List[str] = []
    acted = False
    hung = threading.Event()

    def kill() -> None:
        hung.set()
        p.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if not acted and ready(lines):
                act(p.pid)
                acted = True
        p.wait()
    finally:
        timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not hung.is_set(), f"hvdd run still ran after {timeout}s; its output:\n" + "".join(lines)
    return p.returncode, "".join(lines), acted


def run_killing(
    cmd: Sequence[str], env: dict, cwd: str, ready: Callable[[List[str]], bool], rank: int, timeout: float
) -> Tuple[int, str, bool]:
    """Runs cmd (an ``hvdd run`` command line) and SIGKILLs its worker of
    the given rank as soon as ready(the output lines so far) holds. Returns
    hvdd run's exit status, its whole output and whether the kill happened."""
    return run_acting(cmd, env, cwd, ready, lambda pid: os.kill(child_with_rank(pid, rank), signal.SIGKILL), timeout)


def communicate_all(procs: Sequence[subprocess.Popen], timeout: float) -> List[str]:
    """Each process's output, in order, once it exits; if one is still
    running after timeout seconds, every process is killed (so none waits on
    a peer that is gone) and its output ends with "[TIMED OUT]"."""
    outs = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, _ = p.communicate()
            o += "\n[TIMED OUT]"
        outs.append(o)
    return outs
