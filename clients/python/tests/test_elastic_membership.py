"""Elastic membership as Horovod's driver decides it (issue 31).

Each test is a real ``hvdd run`` with real workers on two "hosts",
localhost and 127.0.0.1 (this machine under two names, a daemon each, 2
slots each), and a worker that fails by an exception out of its training
function (exit status 1, through Python's exit path) or by SIGKILL. The
expectations come from Horovod's documented elastic driver
(../shared/HOROVOD.md 1.6 and 3.11): a failed worker's host is
blacklisted with all its slots before the survivors' ``init()`` returns;
no worker trains, or runs a reset callback, at an intermediate membership;
a failure costs one reset; no step runs below ``--min-np``, which the
driver waits for up to ``--elastic-timeout``, then fails; a job whose every
host was blacklisted ends non-zero with no further epoch; a blacklisted
host comes back after its cooldown.

The workers print every step they complete and every reset callback as it
happens (``HVDD_TEST_TRACE``), so each test checks every state a user can
observe, every epoch's size and every reset, not only the end state. The
jobs are short: the survivors finish a step or two after the failure, so a
membership the daemons formed before ``hvdd run`` applied the rules would
show in the steps themselves."""

from __future__ import annotations

import collections
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from elastic_helpers import run_acting  # noqa: E402
from test_elastic_job import WORKER, reference_sizes, results_by_tag  # noqa: E402

HOSTS = "localhost:2,127.0.0.1:2"
BOUND = int(os.environ.get("HVDD_TEST_ELASTIC_BOUND", "120"))  # seconds; each run takes a few


def discovery(tmp_path, listing: str) -> list:
    """A discovery script that prints listing; the hvdd run flags for it."""
    hosts = tmp_path / "hosts"
    hosts.write_text(listing)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return ["--host-discovery-script", str(script)]


def run(hvdd_bin: str, tmp_path, args: list, steps: int, **env_extra: str) -> tuple:
    """hvdd run ARGS of the traced test worker for STEPS steps; returns its
    status, output and the trace by output tag: [("STEP", step, size,
    rank) | ("RESET", size)]."""
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60", HVDD_TEST_TRACE="1", **env_extra
    )
    cmd = [hvdd_bin, "run", *args, "--", sys.executable, WORKER, str(steps), "-1"]
    rc, out, _ = run_acting(cmd, env, str(tmp_path), lambda lines: False, lambda pid: None, BOUND)
    trace = collections.defaultdict(list)
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]<stdout>:STEP (\d+) size (\d+) rank (\d+)$", line)
        if m:
            trace[int(m.group(1))].append(("STEP", int(m.group(2)), int(m.group(3)), int(m.group(4))))
        m = re.match(r"\[(\d+)\]<stdout>:RESET size (\d+)$", line)
        if m:
            trace[int(m.group(1))].append(("RESET", int(m.group(2))))
    return rc, out, trace


def sizes_seen(trace: dict) -> set:
    return {e[2] for events in trace.values() for e in events if e[0] == "STEP"}


def resets(events: list) -> list:
    return [e[1] for e in events if e[0] == "RESET"]


def steps(events: list) -> list:
    """(step, size) of every step a rank completed, in order."""
    return [(e[1], e[2]) for e in events if e[0] == "STEP"]


def failed_as(mode: str) -> str:
    return "exited with status 1" if mode == "raise" else "was killed by SIGKILL"


@pytest.mark.parametrize("hosts", ["static", "discovery"])
@pytest.mark.parametrize("victim", [0, 3], ids=["rank 0 on localhost", "rank 3 on 127.0.0.1"])
@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_failure_on_a_two_slot_host_resets_once_to_size_2(hvdd_bin, tmp_path, hosts, victim, mode):
    # 4 ranks, a worker fails at step 3 of 5. Horovod: its host is
    # blacklisted with both slots before the survivors re-form; the other
    # host's 2 ranks reset once, to size 2, and run steps 3 and 4 there. The
    # failed host's other rank never steps again, nobody runs at size 3.
    where = ["-H", HOSTS] if hosts == "static" else discovery(tmp_path, "localhost:2\n127.0.0.1:2\n")
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "2", *where],
        5,
        HVDD_TEST_VICTIMS=f"{victim}@3",
        HVDD_TEST_EXIT=mode,
    )
    assert rc == 0, out
    assert f"{failed_as(mode)}; the elastic job goes on with 2 ranks" in out, out
    failed_host, other = ("localhost", [2, 3]) if victim == 0 else ("127.0.0.1", [0, 1])
    partner = ({0, 1} if victim == 0 else {2, 3}) - {victim}
    assert f"blacklisting host {failed_host} for good" in out, out
    assert sizes_seen(trace) == {4, 2}, (dict(trace), out)
    for tag in other:
        assert resets(trace[tag]) == [2], (tag, trace[tag], out)
        assert steps(trace[tag]) == [(0, 4), (1, 4), (2, 4), (3, 2), (4, 2)], (tag, trace[tag], out)
    for tag in partner | {victim}:
        assert resets(trace[tag]) == [] and all(size == 4 for _, size in steps(trace[tag])), (tag, trace[tag], out)
    results = results_by_tag(out)
    assert sorted(results) == other, out
    want = reference_sizes([4, 4, 4, 2, 2])
    for r in results.values():
        assert (r["size"], r["local_size"], r["cross_size"], r["resets"]) == (2, 2, 1, [2]), r
        assert max(abs(a - b) for a, b in zip(r["w"], want)) < 1e-9, (r, want)


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_every_host_failed_at_once_ends_the_job(hvdd_bin, tmp_path, mode):
    # A worker on each host fails at step 3: both hosts are blacklisted, no
    # epoch forms after the failure, and hvdd run exits non-zero saying why.
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "1", "-H", HOSTS],
        8,
        HVDD_TEST_VICTIMS="0@3,2@3",
        HVDD_TEST_EXIT=mode,
    )
    assert rc != 0, out
    assert "every host of the elastic job is blacklisted (localhost:2, 127.0.0.1:2)" in out, out
    for tag, events in trace.items():
        assert resets(events) == [] and steps(events) == [(0, 4), (1, 4), (2, 4)], (tag, events, out)
    assert not results_by_tag(out), out


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_every_host_failed_in_turn_ends_the_job(hvdd_bin, tmp_path, mode):
    # Rank 0 on localhost fails at step 3: one reset to size 2 on
    # 127.0.0.1. Then launch rank 2 (rank 0 of the new epoch) fails at step
    # 6: every host has been blacklisted, so no epoch forms after it (the
    # last survivor never steps at size 1, nor resets again), and hvdd run
    # exits non-zero.
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "1", "-H", HOSTS],
        10,
        HVDD_TEST_VICTIMS="0@3,2@6",
        HVDD_TEST_EXIT=mode,
    )
    assert rc != 0, out
    assert "every host of the elastic job is blacklisted (localhost:2, 127.0.0.1:2)" in out, out
    assert resets(trace[3]) == [2], (trace[3], out)
    assert steps(trace[3]) == [(0, 4), (1, 4), (2, 4), (3, 2), (4, 2), (5, 2)], (trace[3], out)
    assert sizes_seen(trace) == {4, 2}, (dict(trace), out)
    assert not results_by_tag(out), out


def test_no_step_below_min_np_and_the_elastic_timeout_is_waited(hvdd_bin, tmp_path):
    # --min-np 4 and a failure with no spare host: Horovod runs no step
    # below --min-np, waits up to --elastic-timeout (3 s) for hosts, then
    # fails with its message and a non-zero status.
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "4", "-H", HOSTS, "--elastic-timeout", "3"],
        8,
        HVDD_TEST_VICTIMS="0@3",
        HVDD_TEST_EXIT="raise",
    )
    assert rc != 0, out
    assert "2 ranks left, fewer than --min-np 4: waiting up to 3s (--elastic-timeout) for slots" in out, out
    assert "Timed out waiting for minimum number of slots to become available." in out, out
    assert sizes_seen(trace) == {4}, (dict(trace), out)
    for tag, events in trace.items():
        assert resets(events) == [], (tag, events, out)


@pytest.mark.parametrize("hosts", ["static", "discovery"])
def test_blacklisted_host_comes_back_after_its_cooldown(hvdd_bin, tmp_path, hosts):
    # --blacklist-cooldown-range 2 3: localhost, blacklisted for its failed
    # worker, comes back 2-3 s later (discovery still lists it) with two new
    # workers. Every epoch is at a size Horovod gives: 4, then 2, then 4
    # again; never 3. The job ends at size 4.
    where = ["-H", HOSTS] if hosts == "static" else discovery(tmp_path, "localhost:2\n127.0.0.1:2\n")
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "2", *where, "--blacklist-cooldown-range", "2", "3"],
        6,
        HVDD_TEST_VICTIMS="0@3",
        HVDD_TEST_EXIT="kill" if hosts == "static" else "raise",
        HVDD_TEST_UNTIL_SIZE="4",
    )
    assert rc == 0, out
    assert "host localhost's blacklisting is over (its cooldown ended)" in out, out
    assert sizes_seen(trace) == {4, 2}, (dict(trace), out)
    results = results_by_tag(out)
    assert sorted(results) == [2, 3, 4, 5], out
    for tag in (2, 3):
        assert resets(trace[tag]) == [2, 4], (tag, trace[tag], out)
        sizes = [size for _, size in steps(trace[tag])]
        first2, last2 = sizes.index(2), len(sizes) - 1 - sizes[::-1].index(2)
        assert set(sizes[:first2]) == {4} and set(sizes[first2 : last2 + 1]) == {2}, (tag, sizes)
        assert set(sizes[last2 + 1 :]) == {4}, (tag, sizes)
    for tag in (4, 5):
        assert resets(trace[tag]) == [] and {s for _, s in steps(trace[tag])} == {4}, (tag, trace[tag], out)
    for r in results.values():
        assert r["size"] == 4 and r["sizes"].count(4) >= 6, r


def test_a_worker_that_finishes_early_ends_the_job(hvdd_bin, tmp_path):
    # A worker exits with status 0 at step 3 while the others train on.
    # Horovod's driver: a worker that succeeded ends the elastic job; no
    # epoch forms without it (nobody resets, nobody steps again), and the
    # job's status is the finished worker's.
    rc, out, trace = run(
        hvdd_bin,
        tmp_path,
        ["-np", "4", "--min-np", "2", "-H", HOSTS],
        8,
        HVDD_TEST_VICTIMS="1@3",
        HVDD_TEST_EXIT="exit0",
    )
    assert rc == 0, out
    for tag, events in trace.items():
        assert resets(events) == [] and steps(events) == [(0, 4), (1, 4), (2, 4)], (tag, events, out)
    assert "a rank finished the job with status 0" in out, out
