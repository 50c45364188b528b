"""A worker of an elastic job (test_elastic_job.py, bench/elastic_recovery.py).

Trains a tiny linear model with ``hvd.elastic.run`` and ``TorchState``, one
commit per step, as the seeds' elastic scripts do. The last rank of the
first epoch (or the rank $HVDD_TEST_VICTIM names) kills itself with SIGKILL
at step KILL_AT; the survivors restore their last commit, re-initialise into
the job's next epoch and finish. Each survivor prints its final weights
(``RESULT {json}``) and the times of the kill and of its first completed
step at the new size.

``$HVDD_TEST_EXIT`` says how the victim leaves: ``kill`` (SIGKILL, the
default), ``exit0`` (it finishes early, status 0) or ``raise`` (an exception out of the training function: the
process exits with status 1 through Python's own exit path, atexit
included). ``$HVDD_TEST_VICTIMS`` (``R@S,...``) replaces KILL_AT and
$HVDD_TEST_VICTIM: the process that ``hvdd run`` started as rank R fails
at step S, whatever its rank then.

With ``$HVDD_TEST_UNTIL_SIZE`` set, the ranks train on past STEPS until they
have run STEPS steps at that size (a test changes the job's hosts meanwhile).
KILL_AT -1 kills no rank. ``RESULT`` also lists the job's size at every step.
With ``$HVDD_TEST_TRACE`` set, every rank prints what a user observes as it
happens: ``STEP s size n rank r`` for each step it completes (one a restore
later takes back included) and ``RESET size n`` for each reset callback.

Usage: elastic_job_worker.py STEPS KILL_AT
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

import hvdd.torch as hvd


def batch(rank: int, step: int) -> tuple:
    """Rank's batch at step: the same in every run (the test replays it)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    y = x.sum(1, keepdim=True) * 0.5 + rank
    return x, y


def main() -> None:
    steps, kill_at = int(sys.argv[1]), int(sys.argv[2])
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
    until = int(os.environ.get("HVDD_TEST_UNTIL_SIZE", "0"))
    exit_mode = os.environ.get("HVDD_TEST_EXIT", "kill")
    victims = [tuple(int(x) for x in v.split("@")) for v in os.environ.get("HVDD_TEST_VICTIMS", "").split(",") if v]
    launch_rank = int(os.environ.get("HVDD_RANK", "-1"))
    first_victim = hvd.rank() == int(os.environ.get("HVDD_TEST_VICTIM", hvd.size() - 1))
    resets = []
    trace = bool(os.environ.get("HVDD_TEST_TRACE"))

    def on_reset() -> None:
        resets.append(hvd.size())
        if trace:
            print(f"RESET size {hvd.size()}", flush=True)

    state.register_reset_callbacks([on_reset])

    def fails_now(step: int) -> bool:
        if victims:
            return (launch_rank, step) in victims
        return first_victim and step == kill_at

    def more(state: hvd.elastic.TorchState) -> bool:
        if state.step < steps:
            return True
        return until > 0 and state.sizes.count(until) < steps

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while more(state):
            if fails_now(state.step):
                print(f"KILL {time.time():.6f}", flush=True)
                if exit_mode == "raise":
                    raise RuntimeError(f"rank {hvd.rank()} fails on purpose at step {state.step}")
                if exit_mode == "exit0":
                    sys.exit(0)
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(hvd.rank(), state.step)
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            if trace:
                print(f"STEP {state.step} size {hvd.size()} rank {hvd.rank()}", flush=True)
            if state.step == kill_at:
                print(f"RECOVERED {time.time():.6f} size {hvd.size()}", flush=True)
            if state.step == 3 and hvd.rank() == 0:
                print("TRAINING", flush=True)
            state.sizes = state.sizes + [hvd.size()]  # a new list: commit keeps the old one
            state.step += 1
            state.commit()

    train(state)
    w = model.weight.detach().reshape(-1).tolist() + model.bias.detach().tolist()
    result = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_size": hvd.cross_size(),
        "resets": resets,
        "w": w,
        "sizes": state.sizes,
    }
    print("RESULT " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
