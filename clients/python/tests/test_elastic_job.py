"""Elastic training end to end: ``hvdd run --min-np`` with real workers on a
real daemon; a worker is killed with SIGKILL mid-training and the survivors
finish from their last commit at the smaller size."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_job_worker.py")
sys.path.insert(0, HERE)

from elastic_helpers import run_acting, run_killing  # noqa: E402
from elastic_job_worker import batch  # noqa: E402


def reference(steps: int, kill_at: int, np: int) -> list:
    """The same training in one process: each step averages the gradients
    of the ranks of its epoch (np ranks before the kill, np-1 after)."""
    return reference_sizes([np if step < kill_at else np - 1 for step in range(steps)])


def reference_sizes(sizes: list) -> list:
    """The training in one process, given the job's size at each step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, ranks in enumerate(sizes):
        opt.zero_grad()
        loss = sum(((model(x) - y) ** 2).mean() for x, y in (batch(r, step) for r in range(ranks))) / ranks
        loss.backward()
        opt.step()
    return model.weight.detach().reshape(-1).tolist() + model.bias.detach().tolist()


def run_elastic(
    hvdd_bin: str, tmp: str, np: int, steps: int, kill_at: int, hosts: str = "", victim: int = -1
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60")
    if victim >= 0:
        env["HVDD_TEST_VICTIM"] = str(victim)
    where = ["-H", hosts] if hosts else ["--socket", os.path.join(tmp, "hvdd.sock")]
    return subprocess.run(
        [hvdd_bin, "run", "-np", str(np), "--min-np", str(np - 1), *where, "--",
         sys.executable, WORKER, str(steps), str(kill_at)],
        env=env, capture_output=True, text=True, timeout=180, cwd=tmp,
    )  # fmt: skip


@pytest.mark.parametrize(
    "hosts,victim",
    [("", 2), ("127.0.0.2:2,127.0.0.3:1", 2), ("127.0.0.2:1,127.0.0.3:2", 0)],
    ids=["one host", "two hosts", "host 0 lost"],
)
def test_killed_worker_survivors_finish(hvdd_bin, tmp_path, hosts, victim):
    # On two "hosts" (a daemon each, on two loopback addresses) the killed
    # rank is one host's only one: that host leaves the job and the other
    # host's ranks go on alone. When it is host 0, whose daemon coordinated
    # the job, the coordination moves to the other host's daemon.
    np, steps, kill_at = 3, 12, 5
    p = run_elastic(hvdd_bin, str(tmp_path), np, steps, kill_at, hosts, victim)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert f"rank {victim} (pid" in out and "was killed by SIGKILL; the elastic job goes on with 2 ranks" in out, out
    if victim == 0:
        assert "this node coordinates the job from now on" in out, out
    results = [json.loads(l.split("RESULT ", 1)[1]) for l in p.stdout.splitlines() if "RESULT " in l]
    assert sorted(r["rank"] for r in results) == [0, 1], out
    want = reference(steps, kill_at, np)
    for r in results:
        assert r["size"] == np - 1 and r["resets"] == [np - 1], r
        assert max(abs(a - b) for a, b in zip(r["w"], want)) < 1e-9, (r, want)


@pytest.mark.parametrize("removed", [1, 0], ids=["host 1 removed", "host 0 removed"])
def test_removed_host_loses_nothing(hvdd_bin, tmp_path, removed):
    # hvdd run's host discovery lists two hosts, 127.0.0.2 and 127.0.0.3 (3
    # ranks); once training runs, it stops listing one of them. As in
    # Horovod, the driver notifies a removal rather than stopping the host's
    # ranks: rank 0 hears of it, every rank raises HostsUpdatedInterrupt at
    # the same commit and resets without restoring or syncing state, the
    # removed host's ranks are refused in their init() ("has been removed
    # from elastic job"), and the others train on at 2 ranks. No rank is
    # lost, no step is redone: the survivors' weights are those of one
    # process replaying the steps at the sizes the job ran them.
    hosts = ["127.0.0.2", "127.0.0.3"]
    slots = [2, 1] if removed == 1 else [1, 2]
    listing = tmp_path / "hosts"
    listing.write_text("".join(f"{h}:{s}\n" for h, s in zip(hosts, slots)))
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {listing}\n")
    discover.chmod(0o755)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_TEST_UNTIL_SIZE="2")
    cmd = [
        hvdd_bin, "run", "-np", "3", "--min-np", "2", "--host-discovery-script", str(discover), "--",
        sys.executable, WORKER, "8", "-1",
    ]  # fmt: skip

    def remove(_: int) -> None:
        keep = 1 - removed
        (tmp_path / "hosts.new").write_text(f"{hosts[keep]}:{slots[keep]}\n")
        os.replace(tmp_path / "hosts.new", listing)

    rc, out, acted = run_acting(
        cmd, env, str(tmp_path), lambda lines: any("<stdout>:TRAINING" in l for l in lines), remove, 300
    )
    assert acted, out
    assert rc == 0, out
    assert f"host {hosts[removed]} " in out and "has been removed from the elastic job" in out, out
    assert f"{hosts[removed]}[" in out and "] has been removed from elastic job" in out, out
    assert not re.search(r"rank \d+ \(pid \d+[^)]*\) was lost", out) and "HorovodInternalError" not in out, out
    results = [json.loads(l.split("RESULT ", 1)[1]) for l in out.splitlines() if "RESULT " in l]
    assert sorted(r["rank"] for r in results) == [0, 1], out
    sizes = results[0]["sizes"]
    assert sizes[0] == 3 and sizes[-1] == 2 and sizes.count(2) == 8, sizes
    want = reference_sizes(sizes)
    for r in results:
        assert r["size"] == 2 and r["resets"] == [2] and r["sizes"] == sizes, r
        assert max(abs(a - b) for a, b in zip(r["w"], want)) < 1e-9, (r, want)
    if removed == 0:
        assert "this node coordinates the job from now on" in out, out


def test_seed_elastic_script_survives_kill(hvdd_bin, tmp_path):
    # The seeds' elastic PyTorch MNIST program (examples/pytorch_mnist_elastic.py,
    # only its import changed) on 2 hosts x 2 slots: bare host names from a
    # discovery script with --slots-per-host 2. A worker on 127.0.0.1 is
    # killed with SIGKILL mid-epoch; its host is blacklisted, and the
    # survivors on localhost run the reset callback, which scales the
    # learning rate by the new hvd.size() (printed by seed_elastic_lr.py), and
    # finish training and test().
    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    script = os.path.join(root, "examples", "pytorch_mnist_elastic.py")
    ckpt = tmp_path / "ckpt"
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\nprintf 'localhost\\n127.0.0.1\\n'\n")
    discover.chmod(0o755)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60")
    cmd = [
        hvdd_bin, "run", "-np", "4", "--min-np", "2", "--host-discovery-script", str(discover),
        "--slots-per-host", "2", "--", sys.executable, os.path.join(HERE, "seed_elastic_lr.py"), script,
        "--epochs", "2", "--synthetic-size", "4096", "--batch-size", "32", "--lr", "0.05",
        "--log-interval", "2", "--checkpoint-dir", str(ckpt),
    ]  # fmt: skip
    # Kill rank 3 once rank 0 has logged a few steps of the first epoch.
    rc, out, killed = run_killing(
        cmd, env, str(tmp_path), lambda lines: sum("[0]<stdout>:Train Epoch: 1" in l for l in lines) == 3, 3, 180
    )
    lines = out.splitlines(keepends=True)
    assert killed, out
    assert rc == 0, out
    assert "rank 3 (pid" in out and "was killed by SIGKILL; the elastic job goes on with 2 ranks" in out, out
    assert "blacklisting host 127.0.0.1 for good" in out, out
    resets = [l.strip() for l in lines if l.startswith("[0]<stdout>:RESET ")]
    assert resets and resets[-1] == "[0]<stdout>:RESET size 2 lr 0.1", out
    epochs = [l for l in lines if l.startswith("[0]<stdout>:Epoch ")]
    assert [l[len("[0]<stdout>:") :].split(":")[0] for l in epochs] == ["Epoch 1", "Epoch 2"], out
    losses = [float(l.split("loss=")[1].split()[0]) for l in epochs]
    assert losses[1] < losses[0], out
    assert sorted(os.listdir(ckpt)) == ["checkpoint-1.pth.tar", "checkpoint-2.pth.tar"]


def test_seed_elastic_script_grows_by_a_host(hvdd_bin, tmp_path):
    # The seeds' elastic script under hvdd run's elastic driver: the host
    # discovery script first lists one host (127.0.0.2, 2 slots); once rank 0
    # trains, a second host (127.0.0.3, 1 slot) appears. hvdd run starts a
    # daemon and a worker there; the worker waits in init(), the running
    # ranks reset at their next commit, and the job goes on at 3 ranks with
    # the new worker synced from rank 0.
    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    script = os.path.join(root, "examples", "pytorch_mnist_elastic.py")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOROVOD_LOG_LEVEL="warning")
    cmd = [
        hvdd_bin, "run", "-np", "2", "--max-np", "3", "--host-discovery-script", str(discover), "--",
        sys.executable, script, "--epochs", "3", "--synthetic-size", "16384", "--batch-size", "32",
        "--lr", "0.05", "--log-interval", "8", "--checkpoint-dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip

    def add_host(_: int) -> None:
        (tmp_path / "hosts.new").write_text("127.0.0.2:2\n127.0.0.3:1\n")
        os.replace(tmp_path / "hosts.new", hosts)

    rc, out, added = run_acting(
        cmd, env, str(tmp_path), lambda lines: any("[0]<stdout>:Train Epoch: 1" in l for l in lines), add_host, 300
    )
    assert added, out
    assert rc == 0, out
    assert "elastic job re-formed" in out and "size=3" in out, out
    # A later epoch ran whole on 3 ranks: rank 0's share of the 16384
    # samples is 5462. (The new worker joins at the first commit after its
    # process is up, which on a loaded machine may fall in epoch 2: the
    # third epoch then starts at 3 ranks.)
    assert any(f"[0]<stdout>:Train Epoch: {e} [32/5462 " in out for e in (2, 3)), out
    lines = out.splitlines()
    epochs = [l for l in lines if l.startswith("[0]<stdout>:Epoch ")]
    assert [l[len("[0]<stdout>:") :].split(":")[0] for l in epochs] == ["Epoch 1", "Epoch 2", "Epoch 3"], out
    assert sorted(os.listdir(tmp_path / "ckpt")) == [f"checkpoint-{e}.pth.tar" for e in (1, 2, 3)]


# Horovod's elastic driver, scenario by scenario (HOROVOD.md 1.6, 3.11; its
# elastic integration tests): 4 ranks on two "hosts", localhost and
# 127.0.0.1 (both this machine, a daemon each), a worker that fails by an
# exception out of its training function (exit status 1, through Python's
# exit path) or by SIGKILL. Every run is bounded in time: a hang fails it.
TWO_HOSTS = ["-np", "4", "-H", "localhost:2,127.0.0.1:2"]
BOUND = int(os.environ.get("HVDD_TEST_ELASTIC_BOUND", "90"))  # seconds; each run takes a few


def run_two_hosts(hvdd_bin: str, tmp: str, args: list, steps: int, **env_extra: str) -> tuple:
    """hvdd run ARGS of the test worker for STEPS steps (no KILL_AT: the
    failures come from $HVDD_TEST_VICTIMS); returns its status and output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60", **env_extra)
    cmd = [hvdd_bin, "run", *args, "--", sys.executable, WORKER, str(steps), "-1"]
    rc, out, _ = run_acting(cmd, env, tmp, lambda lines: False, lambda pid: None, BOUND)
    return rc, out


def results_by_tag(out: str) -> dict:
    """The workers' RESULT lines, by hvdd run's output tag ([N])."""
    res = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]<stdout>:RESULT (.*)$", line)
        if m:
            res[int(m.group(1))] = json.loads(m.group(2))
    return res


def failed_as(mode: str) -> str:
    return "exited with status 1" if mode == "raise" else "was killed by SIGKILL"


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_failed_worker_blacklists_its_host(hvdd_bin, tmp_path, mode):
    # Rank 0, on localhost, fails at step 4. As with Horovod: the survivors
    # get HorovodInternalError at their next collective, restore the last
    # commit and re-form; the failed worker's host is blacklisted (not its
    # slot), its other rank stopped, and the job goes on with 127.0.0.1's
    # two ranks: size 2, local_size 2, cross_size 1, the reset callback last
    # seeing size 2, the weights those of the steps replayed at the sizes
    # the job ran them.
    # (The daemons form the next epoch over the members hvdd run decides,
    # after it has seen the exit: never at 3 ranks. test_elastic_membership
    # checks each step's size and each reset of this and other scenarios.)
    env = dict(HVDD_TEST_VICTIMS="0@4", HVDD_TEST_EXIT=mode, HVDD_TEST_UNTIL_SIZE="2")
    rc, out = run_two_hosts(hvdd_bin, str(tmp_path), [*TWO_HOSTS, "--min-np", "2"], 10, **env)
    assert rc == 0, out
    assert "rank 0 (pid" in out and failed_as(mode) + "; the elastic job goes on with 2 ranks" in out, out
    assert "blacklisting host localhost for good (no --blacklist-cooldown-range)" in out, out
    assert "Horovod has been shut down" not in out, out
    results = results_by_tag(out)
    assert sorted(results) == [2, 3], out  # 127.0.0.1's ranks, and only they
    assert sorted(r["rank"] for r in results.values()) == [0, 1], out
    sizes = results[2]["sizes"]
    assert sizes[:4] == [4] * 4 and sizes[-1] == 2 and sizes.count(2) == 10, sizes
    want = reference_sizes(sizes)
    for r in results.values():
        assert (r["size"], r["local_size"], r["cross_size"], r["resets"][-1]) == (2, 2, 1, 2), r
        assert r["sizes"] == sizes and max(abs(a - b) for a, b in zip(r["w"], want)) < 1e-9, (r, want)


@pytest.mark.parametrize(
    "victims,mode", [("0@3,2@6", "raise"), ("0@3,2@3", "kill")], ids=["one after the other", "at once"]
)
def test_job_ends_when_every_host_is_blacklisted(hvdd_bin, tmp_path, victims, mode):
    # A worker on each host fails: at the same step, or first rank 0 on
    # localhost and then, three steps into the next epoch, the worker that
    # became rank 0 on 127.0.0.1. Every host is blacklisted: hvdd run stops
    # the job and exits non-zero, saying why, instead of waiting.
    # HVDD_TEST_UNTIL_SIZE 9: the others train on until they are stopped.
    env = dict(HVDD_TEST_VICTIMS=victims, HVDD_TEST_EXIT=mode, HVDD_TEST_UNTIL_SIZE="9")
    rc, out = run_two_hosts(hvdd_bin, str(tmp_path), [*TWO_HOSTS, "--min-np", "1"], 10, **env)
    assert rc != 0, out
    assert re.search(r"blacklisting host (localhost|127\.0\.0\.1) for good", out), out
    assert "every host of the elastic job is blacklisted (localhost:2, 127.0.0.1:2)" in out, out


def test_job_ends_below_min_np_after_elastic_timeout(hvdd_bin, tmp_path):
    # Bare host names from a discovery script, --slots-per-host 2, --min-np
    # 3: once localhost is blacklisted 2 slots are left; hvdd run waits
    # --elastic-timeout for more, then stops the job with Horovod's message.
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\nprintf 'localhost\\n127.0.0.1\\n'\n")
    discover.chmod(0o755)
    args = ["-np", "4", "--min-np", "3", "--host-discovery-script", str(discover), "--slots-per-host", "2"]
    args += ["--elastic-timeout", "2"]
    # HVDD_TEST_UNTIL_SIZE 9: the survivors train on until they are stopped.
    rc, out = run_two_hosts(
        hvdd_bin, str(tmp_path), args, 10, HVDD_TEST_VICTIMS="0@3", HVDD_TEST_EXIT="raise", HVDD_TEST_UNTIL_SIZE="9"
    )
    assert rc != 0, out
    assert "2 ranks left, fewer than --min-np 3: waiting up to 2s (--elastic-timeout) for slots" in out, out
    assert (
        "Timed out waiting for minimum number of slots to become available. Please check that you have "
        "enough resources to run at least 3 Horovod processes." in out
    ), out


@pytest.mark.parametrize("limit", [0, 1], ids=["host back", "reset limit"])
def test_blacklisted_host_returns_after_cooldown(hvdd_bin, tmp_path, limit):
    # With --blacklist-cooldown-range 1 1 the failed worker's host comes
    # back a second later: a new daemon there, two new workers, and the job
    # grows back to 4 ranks. With --reset-limit 1 that is one reset too
    # many: hvdd run stops the job with Horovod's message.
    args = [*TWO_HOSTS, "--min-np", "2", "--blacklist-cooldown-range", "1", "1"]
    if limit:
        args += ["--reset-limit", str(limit)]
    rc, out = run_two_hosts(
        hvdd_bin, str(tmp_path), args, 10, HVDD_TEST_VICTIMS="0@3", HVDD_TEST_EXIT="kill", HVDD_TEST_UNTIL_SIZE="4"
    )
    assert "blacklisting host localhost for 1s (--blacklist-cooldown-range)" in out, out
    assert "host localhost's blacklisting is over (its cooldown ended)" in out, out
    if limit:
        assert rc != 0, out
        assert "Horovod was shutdown because number of resets during elastic job exceeded limit: 1" in out, out
        return
    assert rc == 0, out
    results = results_by_tag(out)
    assert sorted(results) == [2, 3, 4, 5], out
    for r in results.values():
        assert r["size"] == 4 and r["sizes"].count(4) == 10, r


SAMPLER_WORKER = os.path.join(HERE, "elastic_sampler_worker.py")


def sampler_shares(hold_at: tuple, survivors: list, removed: list) -> dict:
    """{epoch: {launch rank: samples}} of elastic_sampler_worker.py (64
    samples, batch size 2, 3 epochs) on 4 ranks that lose 2 at the commit
    hold_at = (epoch, batches done in it), by Horovod's documentation of
    the ElasticSampler: it partitions the epoch over the ranks, and after a
    reset "the sampler will automatically repartition the unprocessed
    indices among the new set of workers". Before the reset each of the 4
    ranks draws 64/4 an epoch; in the epoch of the reset, each has drawn
    its hold_at batches (2 samples each) and the 2 survivors share what is
    left; every later epoch is 64/2 each."""
    epoch_of_reset, batches = hold_at
    want = {}
    for epoch in range(3):
        if epoch < epoch_of_reset:
            want[epoch] = {r: 64 // 4 for r in survivors + removed}
        elif epoch == epoch_of_reset:
            before = 2 * batches
            want[epoch] = {r: before for r in removed if before}
            want[epoch].update({r: before + (64 - 4 * before) // 2 for r in survivors})
        else:
            want[epoch] = {r: 64 // 2 for r in survivors}
    return want


@pytest.mark.parametrize(
    "removed,hold_at",
    [("127.0.0.1", (1, 2)), ("127.0.0.1", (2, 0)), ("localhost", (1, 2))],
    ids=["mid-epoch", "at the epoch end", "host 0 mid-epoch"],
)
def test_removed_host_sampler_repartitions(hvdd_bin, tmp_path, removed, hold_at):
    # Issue 31. hvdd run's host discovery lists localhost:2 and 127.0.0.1:2
    # (4 ranks); rank 0 holds a commit (hold_at; (2, 0) is the one after
    # set_epoch(2)) until the driver notifies it of a host update, and the
    # test removes a host from the listing once rank 0 holds. A removal only:
    # every rank raises HostsUpdatedInterrupt(skip_sync=True) at that commit,
    # nothing is restored or synced, the removed host's ranks are refused
    # in init(), and the reset repartitions the ElasticSampler over the 2
    # survivors. Every epoch, checked from the BATCH lines: each rank drew
    # exactly its share at the size in force, no sample twice, all 64.
    hosts = ["localhost", "127.0.0.1"]
    listing = tmp_path / "hosts"
    listing.write_text("".join(f"{h}:2\n" for h in hosts))
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {listing}\n")
    discover.chmod(0o755)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60")
    cmd = [
        hvdd_bin, "run", "-np", "4", "--min-np", "2", "--host-discovery-script", str(discover), "--",
        sys.executable, SAMPLER_WORKER, json.dumps(list(hold_at)),
    ]  # fmt: skip
    keep = hosts[1 - hosts.index(removed)]

    def remove(_: int) -> None:
        (tmp_path / "hosts.new").write_text(f"{keep}:2\n")
        os.replace(tmp_path / "hosts.new", listing)

    rc, out, acted = run_acting(
        cmd, env, str(tmp_path), lambda lines: any("<stdout>:WAITING" in l for l in lines), remove, 180
    )
    assert acted, out
    assert rc == 0, out
    assert f"{removed}[" in out and "] has been removed from elastic job" in out, out
    assert not re.search(r"rank \d+ \(pid \d+[^)]*\) was lost", out) and "HorovodInternalError" not in out, out

    batches: dict = {}  # epoch -> [(launch rank, size, indices)]
    done = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+)\]<stdout>:(BATCH|DONE) (.*)$", line)
        if not m:
            continue
        tag, what, rec = int(m.group(1)), m.group(2), json.loads(m.group(3))
        if what == "DONE":
            done[tag] = rec
        else:
            batches.setdefault(rec["epoch"], []).append((tag, rec["size"], rec["idx"]))
    survivors = sorted(done)
    gone = sorted(set(range(4)) - set(done))
    assert len(survivors) == 2 and sorted(r["rank"] for r in done.values()) == [0, 1], out
    # The skip_sync path: one reset, to size 2, no restore, no sync but the
    # first, whichever host is removed. (A removed rank 0's reset once
    # ended the epoch on the other node before that node had run the
    # commit's broadcast, whose ranks then restored and synced: the
    # daemons now run the plans sent before a reset first.)
    for r in done.values():
        assert (r["size"], r["resets"], r["restores"], r["syncs"]) == (2, [2], 0, 1), done
    want = sampler_shares(hold_at, survivors, gone)
    assert sorted(batches) == [0, 1, 2], sorted(batches)
    for epoch in range(3):
        got: dict = {}
        for tag, _, idx in batches[epoch]:
            got[tag] = got.get(tag, 0) + len(idx)
        drawn = [i for _, _, idx in batches[epoch] for i in idx]
        twice = sorted({i for i in drawn if drawn.count(i) > 1})
        missed = sorted(set(range(64)) - set(drawn))
        assert (got, twice, missed) == (want[epoch], [], []), (
            f"epoch {epoch}: samples drawn by launch rank {got}, want {want[epoch]}; "
            f"drawn twice {twice}; never drawn {missed}"
        )
        # Each batch was drawn at the size in force: 4 ranks before the
        # reset, 2 after it.
        sizes = {(tag, size) for tag, size, _ in batches[epoch]}
        if epoch < hold_at[0]:
            assert {s for _, s in sizes} == {4}, (epoch, sizes)
        elif epoch > hold_at[0]:
            assert {s for _, s in sizes} == {2}, (epoch, sizes)
