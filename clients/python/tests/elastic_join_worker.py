"""A worker of an elastic job that grows (test_elastic_join.py).

Trains a tiny linear model with ``hvd.elastic.run`` and ``TorchState``, one
commit per step. The first workers train until the job has GROWN ranks and
then EXTRA steps more; rank 0 prints ``TRAINING`` at step 2, when the test
starts the joiner. The joiner waits in ``init()`` until the daemon takes it
into the next epoch, receives rank 0's state in ``state.sync()`` and trains
with the others. Every worker prints when it completed its first step in
the grown job (``GREW time``) and its final state (``RESULT {json}``).

Usage: elastic_join_worker.py GROWN EXTRA
"""

from __future__ import annotations

import json
import sys
import time

import torch

import hvdd.torch as hvd


def main() -> None:
    grown, extra = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    torch.manual_seed(hvd.rank())  # the joiner's model differs until it syncs
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, grown_at=-1)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.grown_at < 0 or state.step < state.grown_at + extra:
            if state.step > 20000:
                raise SystemExit("the job never grew")
            g = torch.Generator().manual_seed(state.step * 100 + hvd.rank())
            x = torch.randn(8, 4, generator=g, dtype=torch.float64)
            opt.zero_grad()
            ((model(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
            opt.step()
            if state.step == 2 and hvd.rank() == 0 and hvd.size() < grown:
                print("TRAINING", flush=True)
            if hvd.size() == grown and state.grown_at < 0:
                state.grown_at = state.step
                # This step's gradients were averaged over the grown job.
                print(f"GREW {time.time():.6f} rank {hvd.rank()}", flush=True)
            state.step += 1
            state.commit()

    train(state)
    w = model.weight.detach().reshape(-1).tolist() + model.bias.detach().tolist()
    print(
        "RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "resets": resets, "w": w}),
        flush=True,
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
