"""A worker of test_elastic_job.py's sampler test: the seeds' elastic loop
over an ``ElasticSampler``, printing which samples each batch drew.

64 samples, batch size 2, 3 epochs. A ``TorchState`` holds a tiny model,
its ``DistributedOptimizer`` (a real allreduce every step) and the sampler,
which a ``DataLoader`` draws from; after every batch the ranks
``record_batch`` and commit; at the end of an epoch they ``set_epoch`` and
commit. Every batch prints ``BATCH {"epoch", "rank", "size", "idx"}`` before
its commit (on the host-update path nothing is restored: every batch printed
counts). A rank that finishes prints ``DONE {"rank", "size", "resets",
"syncs", "restores"}``: the sizes its reset callback saw, and how often the
elastic loop synced and restored its state.

HOLD_AT (JSON ``[epoch, batches]``, as Horovod's elastic test script waits
for its expected host discovery): rank 0 holds the commit at that point of
training (``[e, 0]``: the commit after ``set_epoch(e)``), having printed
``WAITING``, until it has heard of a host update; the other ranks wait in
that commit's broadcast, so every rank raises ``HostsUpdatedInterrupt``
there.

Usage: elastic_sampler_worker.py HOLD_AT
"""

from __future__ import annotations

import json
import sys
import time

import torch

import hvdd.torch as hvd

SAMPLES, BATCH, EPOCHS = 64, 2, 3


def main() -> None:
    hold_at = tuple(json.loads(sys.argv[1]))
    hvd.init()
    torch.manual_seed(0)
    dataset = list(range(SAMPLES))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = torch.nn.Linear(1, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
    held = []
    # What the elastic loop did: a removal resets without restoring or
    # syncing (HostsUpdatedInterrupt(skip_sync=True)).
    calls = {"sync": 0, "restore": 0}

    def counted(name: str) -> None:
        method = getattr(state, name)

        def call() -> None:
            calls[name] += 1
            method()

        setattr(state, name, call)

    counted("sync")
    counted("restore")
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    def commit(state: hvd.elastic.TorchState) -> None:
        if hvd.rank() == 0 and not held and (state.epoch, state.batch) == hold_at:
            held.append(1)
            print("WAITING", flush=True)
            deadline = time.time() + 60
            while state._host_messages.empty():
                if time.time() > deadline:
                    raise TimeoutError("no host update reached rank 0")
                time.sleep(0.05)
        state.commit()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < EPOCHS:
            for idx, batch in enumerate(loader):
                x = batch.double().unsqueeze(1) / SAMPLES
                opt.zero_grad()
                ((model(x) - x) ** 2).mean().backward()
                opt.step()
                line = {"epoch": state.epoch, "rank": hvd.rank(), "size": hvd.size(), "idx": batch.tolist()}
                print("BATCH " + json.dumps(line), flush=True)
                state.sampler.record_batch(idx, BATCH)
                state.batch += 1
                commit(state)
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            commit(state)

    train(state)
    done = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "resets": resets,
        "syncs": calls["sync"],
        "restores": calls["restore"],
    }
    print("DONE " + json.dumps(done), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
