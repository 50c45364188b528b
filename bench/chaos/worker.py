"""The training loop of the fault campaign (chaos.py): the seeds' elastic
PyTorch program on a small synthetic data set, printing what the campaign
checks as ``CHAOS {json}`` lines.

A ``TorchState`` holds a linear model, its ``DistributedOptimizer`` (SGD
with momentum: a real allreduce every step) and an ``ElasticSampler`` over
DATA samples (the same in every run: ``data()``); a reset callback scales
the learning rate by the job's size (the seeds' ``lr * hvd.size()``). Every
batch is recorded in the sampler; every COMMIT_EVERY batches, and at the
end of each data epoch, the ranks commit.

Lines (every one carries ``ev``, the launch tag ``tag`` (``$HVDD_RANK``),
the host (``$CHAOS_HOST``, set by the campaign's agent) and ``pid``):

- ``start``: the process started (before ``init``).
- ``round``: the training function was entered after a (re)start: ``rid``
  is a token rank 0 draws and broadcasts, the same on every rank of the
  epoch; ``n`` the step, ``epoch`` the data epoch, ``w`` the weights and
  ``lr`` the learning rate, after the sync.
- ``step``: step ``n`` done: the sampler indices ``idx`` this rank drew,
  the weights ``w`` after it, ``size``, ``rank``, ``lr``.
- ``save``: the state was saved at step ``n`` (a commit).
- ``reset``: a reset callback ran at ``size``.
- ``final``: training ended at step ``n`` with weights ``w``.

The campaign acts on a rank through files in ``$CHAOS_DIR/act``: a file
named after the rank's pid holding ``MODE PHASE RESIDUE``: MODE ``kill`` (SIGKILL
itself), ``raise`` (an exception out of the training function) or
``exit0`` (``os._exit(0)``, an early success), at PHASE ``step`` (after
the forward pass), ``allreduce`` (the gradients' allreduces in flight,
before ``opt.step()`` waits for them) or ``commit`` (between the save and
the host-update broadcast of ``state.commit()``), in the first step
whose number is RESIDUE modulo the commit interval. Rank 0 stops the job
(every rank leaves the loop at the same commit) once ``$CHAOS_DIR/stop``
exists.

``$CHAOS_BREAK`` breaks something on purpose, for the campaign to find:
``restore``: every rank keeps its model's weights across
``state.restore()`` (a divergence); ``hang``: rank 0's first reset callback
sleeps ``$CHAOS_HANG_S`` (a recovery past the bound); ``leak``: launch rank
0 leaves a ``/dev/shm`` file and a ``sleep`` in a session of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import torch

import hvdd.torch as hvd

DATA, BATCH, COMMIT_EVERY, FEATURES = 240, 2, 3, 4
BASE_LR, MOMENTUM, MAX_STEPS = 0.01, 0.5, 100000
PACE = float(os.environ.get("CHAOS_PACE", "0.05"))  # seconds per step


def data() -> tuple:
    """The data set: the same in every run (the campaign replays it)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DATA, FEATURES, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.1
    return x, y


def new_model() -> torch.nn.Module:
    """The model every process starts from (rank 0's is synced anyway)."""
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def weights(model: torch.nn.Module) -> list:
    return model.weight.detach().reshape(-1).tolist() + model.bias.detach().tolist()


def main() -> None:
    tag = int(os.environ.get("HVDD_RANK", "-1"))
    host = os.environ.get("CHAOS_HOST", "?")
    act_dir = os.path.join(os.environ["CHAOS_DIR"], "act")
    stop_file = os.path.join(os.environ["CHAOS_DIR"], "stop")
    broken = os.environ.get("CHAOS_BREAK", "")

    def emit(ev: str, **kw: object) -> None:
        kw.update(ev=ev, tag=tag, host=host, pid=os.getpid(), t=round(time.time(), 3))
        print("CHAOS " + json.dumps(kw), flush=True)

    emit("start")
    hold: list = []
    hvd.init()
    x_all, y_all = data()
    dataset = list(range(DATA))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * hvd.size(), momentum=MOMENTUM)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, step=0, stop=False)

    def on_reset() -> None:
        for group in opt.param_groups:
            group["lr"] = BASE_LR * hvd.size()
        emit("reset", size=hvd.size(), rank=hvd.rank(), lr=opt.param_groups[0]["lr"])

    state.register_reset_callbacks([on_reset])
    if broken == "hang" and hvd.rank() == 0:
        # the first reset's callback on rank 0 holds the recovery past the campaign's bound
        held = float(os.environ.get("CHAOS_HANG_S", "75"))

        def hang() -> None:
            if not hold:
                hold.append(1)
                emit("hold", seconds=held)
                time.sleep(held)

        state.register_reset_callbacks([hang])
    if broken == "leak" and tag == 0:
        # a segment and a process (in its own session: hvdd run cannot see it) left behind
        with open(f"/dev/shm/hvdd-chaos-leak-{os.getpid()}", "wb") as f:
            f.write(b"\0" * 4096)
        subprocess.Popen(
            ["sleep", "600"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    if broken == "restore":
        state._handlers["model"].restore = lambda: None

    def acting(phase: str) -> None:
        path = os.path.join(act_dir, str(os.getpid()))
        try:
            with open(path) as f:
                mode, at, residue = f.read().split()
        except (OSError, ValueError):
            return
        if at != phase or (phase != "commit" and state.step % COMMIT_EVERY != int(residue)):
            return
        os.unlink(path)
        emit("act", mode=mode, phase=phase, n=state.step)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "exit0":
            os._exit(0)
        raise RuntimeError(f"chaos: rank {hvd.rank()} fails on purpose at step {state.step} ({phase})")

    save = state.save

    def saved() -> None:
        save()
        emit("save", n=state.step, epoch=state.epoch, rank=hvd.rank())
        acting("commit")

    state.save = saved

    def commit() -> None:
        if hvd.rank() == 0 and os.path.exists(stop_file):
            state.stop = True
        state.stop = hvd.broadcast_object(state.stop, root_rank=0, name="chaos.stop")
        state.commit()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        rid = hvd.broadcast_object(uuid.uuid4().hex[:8], root_rank=0, name="chaos.rid")
        emit(
            "round",
            rid=rid,
            n=state.step,
            epoch=state.epoch,
            size=hvd.size(),
            rank=hvd.rank(),
            lr=opt.param_groups[0]["lr"],
            w=weights(model),
        )
        while not state.stop and state.step < MAX_STEPS:
            for idx, batch in enumerate(loader):
                t0 = time.time()
                opt.zero_grad()
                emit(
                    "batch",
                    rid=rid,
                    n=state.step,
                    epoch=state.epoch,
                    size=hvd.size(),
                    rank=hvd.rank(),
                    idx=batch.tolist(),
                )
                loss = ((model(x_all[batch]) - y_all[batch]) ** 2).mean()
                acting("step")
                loss.backward()
                acting("allreduce")
                opt.step()
                state.sampler.record_batch(idx, BATCH)
                emit(
                    "step",
                    rid=rid,
                    n=state.step,
                    epoch=state.epoch,
                    size=hvd.size(),
                    rank=hvd.rank(),
                    lr=opt.param_groups[0]["lr"],
                    idx=batch.tolist(),
                    w=weights(model),
                )
                state.step += 1
                time.sleep(max(0.0, PACE - (time.time() - t0)))
                if state.step % COMMIT_EVERY == 0:
                    commit()
                    if state.stop:
                        break
            else:
                state.epoch += 1
                state.sampler.set_epoch(state.epoch)
                commit()

    train(state)
    emit("final", n=state.step, rank=hvd.rank(), size=hvd.size(), w=weights(model))
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
