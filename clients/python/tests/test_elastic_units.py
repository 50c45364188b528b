"""Elastic training without a daemon: hvdd.elastic's retry loop and host-update
check, ObjectState and TorchState semantics, ElasticSampler across a reset.
Broadcasts are replaced by the identity (one rank), rank and size by stubs."""

from __future__ import annotations

import collections
import sys

import pytest
import torch

import hvdd.elastic as elastic
import hvdd.torch as hvd
import hvdd.torch.elastic.sampler as sampler_mod
import hvdd.torch.elastic.state as state_mod
from hvdd.elastic import HostUpdateResult, ObjectState, notification_manager, run_fn
from hvdd._proto import hvdd_pb2 as pb
from hvdd.exceptions import HorovodInternalError, HostsUpdatedInterrupt


def identity(obj, *args, **kwargs):
    return obj


@pytest.fixture
def elastic_job(monkeypatch):
    """HOROVOD_ELASTIC=1: the loop may re-form the job. There is no daemon
    here: the ranks' agreement on skipping the sync is this rank's wish
    (test_ranks_agree_on_skipping_the_sync runs the real one)."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.setattr(elastic, "_all_skip_sync", lambda skip: skip)


def test_ranks_agree_on_skipping_the_sync(job):
    # Survivors of a removal would skip the sync; a worker that joined at
    # the same reset would not: they all sync (horovod#3494's deadlock).
    # One job of 3 ranks, each case in turn (one job per case cost six more
    # torch imports for the same three calls).
    code = (
        "import os, sys\n"
        "import hvdd.torch as hvd\n"
        "from hvdd.elastic import _all_skip_sync\n"
        "hvd.init()\n"
        "for case in sys.argv[1:]:\n"
        "    wishes = [bool(int(c)) for c in case]\n"
        "    print('AGREED', case, _all_skip_sync(wishes[hvd.rank()]))\n"
        "hvd.shutdown()\n"
    )
    cases = (("110", False), ("111", True), ("000", False))
    res = job.run("", np=3, cmd=[sys.executable, "-c", code, *(w for w, _ in cases)])
    for out in res.outputs:
        got = [line.split()[1:] for line in out.splitlines() if line.startswith("AGREED ")]
        assert got == [[w, str(want)] for w, want in cases], out


class Recorder(ObjectState):
    """An ObjectState that records the loop's calls on it."""

    def __init__(self, calls: list, **kwargs) -> None:
        self.calls = calls
        super().__init__(bcast_object=identity, get_rank=lambda: 0, **kwargs)

    def sync(self) -> None:
        self.calls.append("sync")
        super().sync()

    def restore(self) -> None:
        self.calls.append("restore")
        super().restore()

    def reset(self) -> None:
        self.calls.append("state.reset")


# --------------------------------------------------------------------------- run_fn


def scripted(calls: list, outcomes: list):
    """A training function that records "func" and then raises or returns
    the next of outcomes."""
    it = iter(outcomes)

    def train(state):
        calls.append("func")
        out = next(it)
        if isinstance(out, Exception):
            raise out
        return out

    return train


def test_run_fn_retries_restores_and_skips_sync(elastic_job):
    calls: list = []
    state = Recorder(calls, batch=0)
    state.register_reset_callbacks([lambda: calls.append("callback")])
    outcomes = iter([HorovodInternalError("rank 1 lost"), HostsUpdatedInterrupt(skip_sync=True), "done"])

    def train(state, factor):
        calls.append("func")
        assert state in notification_manager._listeners
        state.batch += factor  # uncommitted: lost at the restore
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    assert run_fn(train, lambda: calls.append("reset"))(state, 5) == "done"
    assert calls == [
        "sync",
        "func",
        "restore",  # HorovodInternalError: back to the commit ...
        "reset",
        "state.reset",
        "callback",
        "sync",  # ... and a full sync
        "func",
        "reset",  # HostsUpdatedInterrupt(skip_sync=True): no restore, no sync
        "state.reset",
        "callback",
        "func",
    ]
    # The restore undid the first call's change; the second's was kept.
    assert state.batch == 10
    assert state not in notification_manager._listeners


def test_run_fn_hosts_updated_without_skip_sync_syncs(elastic_job):
    calls: list = []
    state = Recorder(calls)
    train = scripted(calls, [HostsUpdatedInterrupt(skip_sync=False), "done"])
    assert run_fn(train, lambda: calls.append("reset"))(state) == "done"
    assert calls == ["sync", "func", "reset", "state.reset", "sync", "func"]


@pytest.mark.parametrize("code", [pb.CODE_ABORTED, pb.CODE_SHUT_DOWN])
def test_run_fn_not_elastic_propagates_a_lost_rank(monkeypatch, code):
    # A static job that lost a rank cannot re-form (the rank is not coming
    # back): the failure is the job's.
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    monkeypatch.setattr(elastic, "_all_skip_sync", lambda skip: skip)
    calls: list = []
    state = Recorder(calls)

    def train(state):
        calls.append("func")
        raise HorovodInternalError("rank 1 lost", code)

    with pytest.raises(HorovodInternalError, match="rank 1 lost"):
        run_fn(train, lambda: calls.append("reset"))(state)
    assert calls == ["sync", "func"]
    assert state not in notification_manager._listeners


def test_run_fn_not_elastic_resets_like_horovod(monkeypatch):
    # Horovod's run wraps any job: a HorovodInternalError with every rank
    # still there restores, re-forms the same job and goes on.
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    monkeypatch.setattr(elastic, "_all_skip_sync", lambda skip: skip)
    calls: list = []
    state = Recorder(calls)
    train = scripted(calls, [HorovodInternalError("injected"), "done"])
    assert run_fn(train, lambda: calls.append("reset"))(state) == "done"
    assert calls == ["sync", "func", "restore", "reset", "state.reset", "sync", "func"]


# A static job (hvdd serve, HOROVOD_ELASTIC unset) whose ranks all raise
# HorovodInternalError once, at batch 3, after committing at batch 2.
STATIC_RESET = """
import torch
import hvdd.torch as hvd
from hvdd.exceptions import HorovodInternalError

hvd.init()
torch.manual_seed(hvd.rank())  # different weights: the sync makes them equal
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, batch=0)
resets, steps, raised = [], [], []
state.register_reset_callbacks([lambda: resets.append((hvd.size(), state.batch))])


@hvd.elastic.run
def train(state):
    while state.batch < 6:
        opt.zero_grad()
        model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
        opt.step()
        steps.append(state.batch)
        state.batch += 1
        if state.batch % 2 == 0:
            state.commit()
        if state.batch == 3 and not raised:
            raised.append(1)
            raise HorovodInternalError("injected on every rank")
    return state.batch


print("RESULT", hvd.rank(), train(state), steps, resets, flush=True)
w = torch.cat([p.detach().flatten() for p in model.parameters()])
print("WEIGHTS", hvd.rank(), hvd.allreduce(w, op=hvd.Max).sub(w).abs().max().item(), flush=True)
hvd.shutdown()
"""


def test_static_job_run_resets_and_resumes(job):
    res = job.run("", np=2, timeout=120, cmd=[sys.executable, "-c", STATIC_RESET])
    for r, out in enumerate(res.outputs):
        # Batches 0-2 ran, the error restored the commit of batch 2, so batch 2
        # ran again; the one reset callback saw the same size and the
        # restored batch; rank 0's state reached both ranks at each sync.
        assert f"RESULT {r} 6 [0, 1, 2, 2, 3, 4, 5] [(2, 2)]" in out, out
        assert f"WEIGHTS {r} 0.0" in out, out
    assert res.daemon_log.count("job formed") == 2, res.daemon_log


def test_other_errors_propagate(elastic_job):
    calls: list = []

    def train(state):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_fn(train, lambda: calls.append("reset"))(Recorder(calls))
    assert calls == ["sync"]


def test_reset_is_shutdown_then_init(monkeypatch):
    calls: list = []
    monkeypatch.setattr(
        elastic._basics, "shutdown", lambda _elastic_reset=False: calls.append(("shutdown", _elastic_reset))
    )
    monkeypatch.setattr(elastic._basics, "init", lambda: calls.append("init"))
    elastic.reset()
    # The shutdown tells the daemon the rank re-initialises at once.
    assert calls == [("shutdown", True), "init"]


def test_framework_run_uses_hvdd_reset(elastic_job, monkeypatch):
    calls: list = []
    monkeypatch.setattr(elastic._basics, "shutdown", lambda _elastic_reset=False: calls.append("shutdown"))
    monkeypatch.setattr(elastic._basics, "init", lambda: calls.append("init"))
    outcomes = iter([HorovodInternalError("lost"), "done"])

    @hvd.elastic.run
    def train(state):
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    assert train(Recorder(calls)) == "done"
    assert calls == ["sync", "restore", "shutdown", "init", "state.reset", "sync"]


# --------------------------------------------------------------------------- host updates


def test_check_host_updates():
    state = ObjectState(bcast_object=identity, get_rank=lambda: 0, epoch=1)
    state.commit()  # nothing reported
    state.on_hosts_updated(5, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as e:
        state.commit()
    assert e.value.skip_sync is False
    state.commit()  # seen: no second interrupt
    state.on_hosts_updated(3, HostUpdateResult.removed)  # older than the last one
    state.commit()
    state.on_hosts_updated(7, HostUpdateResult.removed)
    with pytest.raises(HostsUpdatedInterrupt) as e:
        state.commit()
    assert e.value.skip_sync is True  # only removals: the survivors agree
    state.on_hosts_updated(8, HostUpdateResult.removed)
    state.on_hosts_updated(9, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt) as e:
        state.commit()
    assert e.value.skip_sync is False
    # on_reset drops what was not yet seen
    state.on_hosts_updated(10, HostUpdateResult.added)
    state.on_reset()
    state.commit()


def test_check_host_updates_follows_rank_0():
    # This rank saw nothing; rank 0 (the broadcast) saw an update at t=4.
    state = ObjectState(bcast_object=lambda obj: (0, 4, HostUpdateResult.added), get_rank=lambda: 1)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    # This rank saw one, rank 0 did not: nobody raises.
    state = ObjectState(bcast_object=lambda obj: (0, 0, HostUpdateResult.no_update), get_rank=lambda: 1)
    state.on_hosts_updated(4, HostUpdateResult.added)
    state.check_host_updates()


def test_notification_reaches_the_running_state(elastic_job):
    calls: list = []
    state = Recorder(calls, batch=0)
    runs = []

    def train(state):
        runs.append(state.batch)
        if len(runs) == 1:
            notification_manager.handle_hosts_updated(1, HostUpdateResult.added)
            state.batch = 3
            state.commit()  # raises: hosts were added
            raise AssertionError("commit did not interrupt")
        return "done"

    assert run_fn(train, lambda: calls.append("reset"))(state) == "done"
    assert runs == [0, 3]  # committed before the interrupt, and kept
    assert calls == ["sync", "reset", "state.reset", "sync"]


# --------------------------------------------------------------------------- ObjectState


def test_object_state_save_restore_commit():
    state = ObjectState(bcast_object=identity, get_rank=lambda: 0, epoch=1, batch=0, items=[1])
    assert (state.epoch, state.batch, state.items) == (1, 0, [1])
    state.epoch, state.batch = 2, 7
    state.restore()
    assert (state.epoch, state.batch) == (1, 0)
    state.epoch, state.batch = 2, 7
    state.commit()
    state.epoch, state.batch = 5, 9
    state.restore()
    assert (state.epoch, state.batch) == (2, 7)
    state.save()
    state.restore()
    assert (state.epoch, state.batch) == (2, 7)


def test_object_state_sync_takes_the_broadcast():
    state = ObjectState(bcast_object=lambda d: {**d, "epoch": 9}, get_rank=lambda: 1, epoch=1, batch=2)
    state.sync()
    assert (state.epoch, state.batch) == (9, 2)


def test_default_bcast_and_rank_are_hvdds():
    state = ObjectState(epoch=1)
    assert state._rank is hvd.rank
    with pytest.raises(ValueError, match="not been initialized"):
        state.sync()


# --------------------------------------------------------------------------- TorchState


@pytest.fixture
def no_broadcast(monkeypatch):
    monkeypatch.setattr(state_mod, "broadcast_object", identity)


def _weights(model):
    return [t.clone() for t in model.state_dict().values()]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(3, 4)).pow(2).sum().backward()
    optimizer.step()


def test_torch_state_restore_and_commit(no_broadcast):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
    assert state.model is model and state.optimizer is optimizer
    assert set(state._handlers) == {"model", "optimizer"}
    w0 = _weights(model)

    _step(model, optimizer)
    state.batch = 1
    assert not _same(_weights(model), w0)
    state.restore()
    assert _same(_weights(model), w0)
    assert optimizer.state_dict()["state"] == {}  # no momentum before the commit
    assert state.batch == 0

    _step(model, optimizer)
    state.batch = 1
    state.commit()
    w1 = _weights(model)
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()
    _step(model, optimizer)
    state.batch = 2
    state.restore()
    assert _same(_weights(model), w1)
    assert torch.equal(optimizer.state_dict()["state"][0]["momentum_buffer"], momentum)
    assert state.batch == 1
    # The optimizer still trains the same parameters after a restore.
    _step(model, optimizer)
    assert not _same(_weights(model), w1)


def test_torch_state_new_model_is_saved(no_broadcast):
    state = hvd.elastic.TorchState(torch.nn.Linear(2, 2))
    other = torch.nn.Linear(2, 2)
    w = _weights(other)
    state.model = other  # replaces the handler's model, and saves it
    with torch.no_grad():
        other.weight.add_(1.0)
    state.restore()
    assert _same(_weights(other), w)


def test_torch_state_without_model_keeps_plain_values(no_broadcast):
    state = hvd.elastic.TorchState(epoch=3)
    assert state._handlers == {}
    assert state.model is None and state.optimizer is None and state.epoch == 3


def test_torch_state_sync_calls_the_broadcasts(monkeypatch):
    calls = []
    monkeypatch.setattr(state_mod, "broadcast_object", lambda obj: (calls.append("object"), obj)[1])
    monkeypatch.setattr(state_mod, "broadcast_parameters", lambda p, root_rank: calls.append(("params", root_rank)))
    monkeypatch.setattr(state_mod, "broadcast_optimizer_state", lambda o, root_rank: calls.append(("opt", root_rank)))
    model = torch.nn.Linear(2, 2)
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1)
    state.sync()
    assert calls == [("params", 0), ("opt", 0), "object"]


# --------------------------------------------------------------------------- ElasticSampler


class World:
    """Stub rank() and size() for the sampler: the rank being simulated."""

    def __init__(self, monkeypatch, size: int) -> None:
        self.rank, self.size = 0, size
        monkeypatch.setattr(sampler_mod, "rank", lambda: self.rank)
        monkeypatch.setattr(sampler_mod, "size", lambda: self.size)

    def sampler(self, rank: int, dataset, **kwargs):
        self.rank = rank
        return hvd.elastic.ElasticSampler(dataset, **kwargs)


def _batches(indices, bs):
    return [indices[i : i + bs] for i in range(0, len(indices), bs)]


def test_sampler_partitions_without_overlap(monkeypatch):
    world = World(monkeypatch, 3)
    dataset = list(range(30))
    samplers = [world.sampler(r, dataset, shuffle=True, seed=1) for r in range(3)]
    parts = [list(s) for s in samplers]
    assert all(len(p) == len(s) == 10 for p, s in zip(parts, samplers))
    assert sorted(sum(parts, [])) == dataset


def test_sampler_shuffle_is_deterministic_by_seed_and_epoch(monkeypatch):
    world = World(monkeypatch, 1)
    dataset = list(range(50))
    a, b = world.sampler(0, dataset, seed=3), world.sampler(0, dataset, seed=3)
    assert list(a) == list(b) and list(a) != dataset and sorted(a) == dataset
    assert list(world.sampler(0, dataset, seed=4)) != list(a)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first
    a.set_epoch(0)
    assert list(a) == first
    assert list(world.sampler(0, dataset, shuffle=False)) == dataset


def test_sampler_reset_from_3_to_2_visits_every_index_once(monkeypatch):
    """Three ranks process two batches each and commit; one rank is lost; the
    two survivors (new ranks 0 and 1) finish the epoch: every index once."""
    bs = 4
    dataset = list(range(60))
    world = World(monkeypatch, 3)
    samplers = [world.sampler(r, dataset, seed=7) for r in range(3)]
    visited = []
    for r, s in enumerate(samplers):
        for batch_idx, batch in enumerate(_batches(list(s), bs)[:2]):
            visited += batch
            s.record_batch(batch_idx, bs)
        assert s.processed_num == 2 * bs * 3
    committed = samplers[0].state_dict()
    assert committed == {"epoch": 0, "processed_num": 24}

    # The new world: old ranks 0 and 2 survive as ranks 0 and 1; each loads
    # rank 0's committed state (what SamplerStateHandler.sync broadcasts).
    world.size = 2
    survivors = []
    for new_rank, s in enumerate((samplers[0], samplers[2])):
        world.rank = new_rank
        s.load_state_dict(committed)
        assert (s.num_replicas, s.rank, len(s)) == (2, new_rank, 18)
        survivors.append(s)
    for s in survivors:
        for batch_idx, batch in enumerate(_batches(list(s), bs)):
            visited += batch
            s.record_batch(batch_idx, len(batch))
    counts = collections.Counter(visited)
    assert sorted(counts) == dataset and set(counts.values()) == {1}, counts

    # set_epoch starts the next epoch over the whole dataset, reshuffled.
    s = survivors[0]
    s.set_epoch(1)
    assert s.processed_num == 0 and len(s) == 30


def test_sampler_pads_the_last_indices(monkeypatch):
    # One index left for three ranks: each gets it (as DistributedSampler pads).
    world = World(monkeypatch, 3)
    samplers = [world.sampler(r, list(range(7)), shuffle=False) for r in range(3)]
    for r, s in enumerate(samplers):
        world.rank = r
        s.load_state_dict({"epoch": 0, "processed_num": 6})
        assert list(s) == [6] and len(s) == 1


def test_sampler_in_torch_state(monkeypatch, no_broadcast):
    world = World(monkeypatch, 2)
    s = world.sampler(1, list(range(20)))
    state = hvd.elastic.TorchState(sampler=s)
    assert set(state._handlers) == {"sampler"}
    s.record_batch(0, 2)
    state.commit()
    s.record_batch(1, 2)
    assert s.processed_num == 8
    state.restore()
    assert s.processed_num == 4 and len(s) == 8
    # A reset to one rank: sync (the identity broadcast here) repartitions.
    world.size, world.rank = 1, 0
    state.sync()
    assert (s.num_replicas, s.rank, len(s)) == (1, 0, 16)


# --------------------------------------------------------------------------- ElasticSampler across the elastic loop


class Gone(Exception):
    """A rank that leaves the job: its host was removed (its init() after the
    reset is refused) or it failed."""


def _elastic_epochs(monkeypatch, event: str, at: tuple, per_commit: int = 1) -> dict:
    """The seeds' elastic loop (run_fn with a TorchState holding an
    ElasticSampler that a DataLoader draws from; record_batch after every
    batch, a commit every per_commit batches, set_epoch then a commit at the
    end of an epoch) on 4 ranks, 64 samples, batch size 2, 3 epochs; the
    job loses its second host (ranks 2 and 3) once.

    event "removed": rank 0 hears of the removal before the commit at
    ``at`` = (epoch, batches done in it; (e + 1, 0) is the commit after
    set_epoch(e + 1)), so every rank raises HostsUpdatedInterrupt(skip_sync)
    there. event "failed": the step of the batch after ``at`` fails on every
    rank (HorovodInternalError; ranks 2 and 3 are gone), so the survivors
    restore the last commit and sync.

    The ranks are in lockstep, so each runs alone here, one after another,
    with rank() and size() stubbed and the broadcasts the identity. Returns
    {epoch: [(launch rank, size, indices of a committed batch), ...]}."""
    monkeypatch.setattr(state_mod, "broadcast_object", identity)
    world = World(monkeypatch, 4)
    dataset = list(range(64))
    visits: dict = collections.defaultdict(list)
    for launch in range(4):
        world.rank, world.size = launch, 4
        sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
        state = hvd.elastic.TorchState(sampler=sampler, epoch=0, batch=0)
        fired: list = []
        pending: list = []  # batches done since the last commit

        def commit(state) -> None:
            at_event = event == "removed" and (state.epoch, state.batch) == at and not fired
            if at_event:
                fired.append(1)
                state.on_hosts_updated(1, HostUpdateResult.removed)
            try:
                state.commit()
            finally:  # saved, interrupted or not
                for epoch, visit in pending:
                    visits[epoch].append(visit)
                pending.clear()

        def train(state) -> None:
            pending.clear()  # a restore undid them
            while state.epoch < 3:
                for idx, batch in enumerate(loader):
                    if event == "failed" and (state.epoch, state.batch) == at and not fired:
                        fired.append(1)
                        if launch >= 2:
                            raise Gone()
                        raise HorovodInternalError("rank 3 was lost")
                    pending.append((state.epoch, (launch, world.size, batch.tolist())))
                    state.sampler.record_batch(idx, 2)
                    state.batch += 1
                    if state.batch % per_commit == 0:
                        commit(state)
                state.epoch += 1
                state.batch = 0
                state.sampler.set_epoch(state.epoch)
                commit(state)

        def reset(launch=launch) -> None:
            if launch >= 2:
                raise Gone()  # the removed host's ranks are refused in init()
            world.rank, world.size = launch, 2

        try:
            run_fn(train, reset)(state)
        except Gone:
            assert launch >= 2
        else:
            assert launch < 2
    return visits


def _assert_shares(visits: dict, want: dict) -> None:
    """Every epoch covers the 64 samples once, each rank drawing its share:
    want[epoch][launch rank] samples."""
    for epoch in range(3):
        counts = collections.Counter(i for _, _, idx in visits[epoch] for i in idx)
        got = collections.Counter()
        for launch, _, idx in visits[epoch]:
            got[launch] += len(idx)
        twice = sorted(i for i, n in counts.items() if n > 1)
        missed = sorted(set(range(64)) - set(counts))
        assert (dict(got), twice, missed) == (want[epoch], [], []), (
            f"epoch {epoch}: shares by rank {dict(got)}, want {want[epoch]}; "
            f"drawn twice {twice}; never drawn {missed}"
        )


# The shares Horovod's documentation gives (the sampler "will automatically
# repartition the unprocessed indices among the new set of workers"): 64/4
# each while 4 ranks train; at a reset mid-epoch, each of the 4 ranks has
# drawn what it committed (2 batches of 2), and the 64 - 16 left go to the
# 2 survivors, 24 each; every later epoch is 64/2 each.
FULL_AT_4 = {0: 16, 1: 16, 2: 16, 3: 16}
FULL_AT_2 = {0: 32, 1: 32}
SPLIT_AT_COMMIT_2 = {0: 4 + 24, 1: 4 + 24, 2: 4, 3: 4}


def test_sampler_repartitions_after_a_removal_mid_epoch(elastic_job, monkeypatch):
    # HostsUpdatedInterrupt(skip_sync=True): no restore, no sync; the reset
    # (state.on_reset -> TorchState.reset) repartitions the epoch's rest.
    visits = _elastic_epochs(monkeypatch, "removed", (1, 2))
    _assert_shares(visits, {0: FULL_AT_4, 1: SPLIT_AT_COMMIT_2, 2: FULL_AT_2})
    assert {size for _, size, _ in visits[2]} == {2}


def test_sampler_repartitions_after_a_removal_at_the_epoch_end(elastic_job, monkeypatch):
    # The removal interrupts the commit after set_epoch(2), which had
    # partitioned epoch 2 over 4 ranks: the reset partitions it over 2.
    visits = _elastic_epochs(monkeypatch, "removed", (2, 0))
    _assert_shares(visits, {0: FULL_AT_4, 1: FULL_AT_4, 2: FULL_AT_2})


def test_sampler_repartitions_after_a_failure_from_the_last_commit(elastic_job, monkeypatch):
    # A commit every 2 batches; the step of batch 4 of epoch 1 fails. Batch 3
    # was drawn but not committed: the restore forgets it (processed_num as
    # of the commit after batch 2), and after the reset and the sync the
    # survivors draw it again, within the 48 left, 24 each.
    visits = _elastic_epochs(monkeypatch, "failed", (1, 3), per_commit=2)
    _assert_shares(visits, {0: FULL_AT_4, 1: SPLIT_AT_COMMIT_2, 2: FULL_AT_2})


def test_torch_state_reset_resets_its_handlers(monkeypatch, no_broadcast):
    # on_reset runs TorchState.reset before the callbacks: the sampler is
    # already partitioned over the new size when a callback reads len().
    world = World(monkeypatch, 4)
    s = world.sampler(1, list(range(40)), shuffle=False)
    state = hvd.elastic.TorchState(sampler=s)
    s.record_batch(0, 2)
    seen = []
    state.register_reset_callbacks([lambda: seen.append((s.num_replicas, s.rank, len(s)))])
    world.size, world.rank = 2, 0
    state.on_reset()
    assert seen == [(2, 0, 16)]
    assert list(s) == list(range(8, 40, 2))


def test_torch_state_reset_skips_handlers_without_reset(monkeypatch, no_broadcast):
    # A handler written to Horovod's interface (save, restore, sync,
    # set_value) has no reset: TorchState.reset passes it by.
    class Thing:
        pass

    class Plain:
        def __init__(self, value) -> None:
            self.value = value

        def save(self) -> None:
            pass

    monkeypatch.setattr(state_mod, "_handler_registry", [(Thing, Plain), *state_mod.get_handler_registry()])
    world = World(monkeypatch, 2)
    s = world.sampler(0, list(range(8)))
    state = hvd.elastic.TorchState(thing=Thing(), sampler=s)
    world.size = 1
    state.on_reset()
    assert len(s) == 8
