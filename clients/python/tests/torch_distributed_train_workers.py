"""Scenarios of test_torch_distributed_train.py: training with torch.distributed's
own parallelism (FSDP2, ZeroRedundancyOptimizer, DDP's PowerSGD hook,
SyncBatchNorm, new_subgroups, DeviceMesh and DTensor) on the ``hvdd``
backend, run on every rank (``python torch_distributed_train_workers.py NAME``
under torchrun or hvdd run).

The reference is gloo, the same program on a gloo group (or a gloo
DeviceMesh) of the same ranks in the same process, from the same seeds; and
for FSDP2 a single-process model trained here on every rank's batch. A
scenario exits non-zero on the first difference and prints ``OK <scenario>
<rank>`` at the end.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdd.torch.distributed  # noqa: F401 (registers the backend)
from hvdd.torch.distributed import ProcessGroupHvdd

STEPS = 3
BATCH = 4


def say(msg: str) -> None:
    """One line in one write(2), whole even when the ranks share a pipe."""
    os.write(1, (msg + "\n").encode())


def log(*a: Any) -> None:
    say(" ".join([f"[rank {os.environ.get('RANK', '?')}]", *map(str, a)]))


def close(got: Sequence[float], want: Sequence[float], tol: float, what: str) -> None:
    """got and want agree to tol, relative to max(1, |want|)."""
    assert len(got) == len(want), f"{what}: {len(got)} values, want {len(want)}"
    for k, (a, b) in enumerate(zip(got, want)):
        if not abs(a - b) <= tol * max(1.0, abs(b)):
            raise AssertionError(f"{what}: value {k} is {a}, want {b} (tolerance {tol})\ngot  {got}\nwant {want}")


def close_t(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, got.dtype, want.shape, want.dtype)
    if not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
        d = (got.double() - want.double()).abs().max().item()
        raise AssertionError(f"{what}: differs by up to {d} (tolerance {tol})\ngot  {got}\nwant {want}")


def batches(rank: int, n: int = STEPS, din: int = 8, dout: int = 5) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Rank-specific training batches, the same for every backend."""
    g = torch.Generator().manual_seed(7000 + rank)
    return [(torch.randn(BATCH, din, generator=g), torch.randn(BATCH, dout, generator=g)) for _ in range(n)]


def mlp(din: int = 8, dout: int = 5) -> torch.nn.Sequential:
    """A tiny MLP, the same on every rank (seeded); 5 outputs, so that the
    last layer's shards are uneven (FSDP2 pads them)."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(din, 16), torch.nn.ReLU(), torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, dout)
    )


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


# ------------------------------------------------------------------ FSDP2


def fsdp_reference(
    world: int, param_dtype: Optional[torch.dtype], replicas: int = 1
) -> Tuple[List[List[float]], Dict[str, torch.Tensor]]:
    """A single-process reference of FSDP2's data parallelism over world ranks:
    each rank's loss on its batch with the model of that step (computed with
    param_dtype copies of the fp32 parameters under mixed precision), the
    gradients averaged over the ranks in fp32, one SGD step. Returns every
    rank's losses by step and the final parameters."""
    model = mlp()
    opt = sgd(model.parameters())
    data = [batches(r) for r in range(world)]
    losses: List[List[float]] = [[] for _ in range(world)]
    for step in range(STEPS):
        grads: List[List[torch.Tensor]] = []
        for r in range(world):
            m = copy.deepcopy(model)
            if param_dtype is not None:
                m = m.to(param_dtype)
            x, y = data[r][step]
            loss = loss_of(m(x.to(param_dtype or x.dtype)), y)
            loss.backward()
            losses[r].append(loss.item())
            grads.append([p.grad.float() for p in m.parameters()])
        for p, gs in zip(model.parameters(), zip(*grads)):
            p.grad = torch.stack(gs).mean(0)
        opt.step()
        opt.zero_grad()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def fsdp_train(
    mesh: DeviceMesh, reshard: bool, param_dtype: Optional[torch.dtype], me: int
) -> Tuple[List[float], Dict[str, torch.Tensor]]:
    """FSDP2 (fully_shard on every Linear and on the root) on mesh: this rank's
    losses and the full parameters after training (gathered from the shards)."""
    model = mlp()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    opt = sgd(model.parameters())
    losses = []
    for x, y in batches(me):
        loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return losses, full


def fsdp2(gloo: Any, me: int, world: int) -> None:
    hvdd_mesh = init_device_mesh("cpu", (world,))
    assert isinstance(hvdd_mesh.get_group(), ProcessGroupHvdd), hvdd_mesh.get_group()
    gloo_mesh = DeviceMesh.from_group(gloo, "cpu")
    refs = {dt: fsdp_reference(world, dt) for dt in (None, torch.bfloat16)}
    for name, reshard, dt in (
        ("reshard_after_forward=True", True, None),
        ("reshard_after_forward=False", False, None),
        ("mixed precision bf16/fp32", True, torch.bfloat16),
        ("mixed precision bf16/fp32, reshard_after_forward=False", False, torch.bfloat16),
    ):
        ours, ours_p = fsdp_train(hvdd_mesh, reshard, dt, me)
        theirs, theirs_p = fsdp_train(gloo_mesh, reshard, dt, me)
        ref_losses, ref_p = refs[dt]
        close(ours, theirs, 1e-6, f"FSDP2 {name}: losses against gloo's")
        tol = 1e-5 if dt is None else 2e-3
        close(ours, ref_losses[me], tol, f"FSDP2 {name}: losses against the single-process reference")
        for k in ref_p:
            close_t(ours_p[k], theirs_p[k], 1e-6, f"FSDP2 {name}: {k} against gloo's")
            close_t(ours_p[k], ref_p[k], tol, f"FSDP2 {name}: {k} against the reference")
        log(f"FSDP2 {name}: losses {[round(v, 5) for v in ours]} match gloo's and the reference")


# -------------------------------------------------------------------- ZeRO


def zero_train(pg: Any, me: int, bucket_view: bool) -> Tuple[List[float], List[torch.Tensor], Optional[dict]]:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = mlp()
    ddp = DDP(model, process_group=pg)
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=torch.optim.Adam,
        process_group=pg,
        parameters_as_bucket_view=bucket_view,
        lr=0.01,
    )
    losses = []
    for x, y in batches(me):
        loss = loss_of(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    # Each rank holds the optimizer state of its parameters only: the state
    # of every one is gathered on rank 0.
    n_local = sum(len(s) for s in opt.optim.state.values())
    assert 0 < n_local < 2 * len(list(model.parameters())), n_local
    opt.consolidate_state_dict(to=0)
    sd = opt.state_dict() if me == 0 else None
    return losses, [p.detach().clone() for p in model.parameters()], sd


def zero(gloo: Any, me: int) -> None:
    for bucket_view in (False, True):
        what = f"ZeroRedundancyOptimizer(Adam, parameters_as_bucket_view={bucket_view})"
        ours, ours_p, ours_sd = zero_train(dist.group.WORLD, me, bucket_view)
        theirs, theirs_p, theirs_sd = zero_train(gloo, me, bucket_view)
        close(ours, theirs, 1e-6, f"{what}: losses")
        for k, (a, b) in enumerate(zip(ours_p, theirs_p)):
            close_t(a, b, 1e-6, f"{what}: parameter {k}")
        if me == 0:
            assert ours_sd is not None and theirs_sd is not None
            assert sorted(ours_sd["state"]) == sorted(theirs_sd["state"]) == list(range(len(ours_p))), ours_sd
            for i, st in ours_sd["state"].items():
                for key in ("exp_avg", "exp_avg_sq"):
                    close_t(st[key], theirs_sd["state"][i][key], 1e-6, f"{what}: consolidated state {i} {key}")
        log(f"{what}: losses {[round(v, 5) for v in ours]} match gloo's")


# ----------------------------------------------------------------- PowerSGD


class Failed(Exception):
    """A training run that torch stopped: the step, the error, and where in
    torch it was raised (file, function)."""

    def __init__(self, step: int, error: BaseException, losses: List[float]) -> None:
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code if tb is not None else None
        self.where = (os.path.basename(code.co_filename), code.co_name) if code else ("?", "?")
        self.step, self.error, self.losses = step, error, losses
        super().__init__(f"step {step}: {type(error).__name__} in {self.where[1]} ({self.where[0]}): {error!r}")


def powersgd_train(pg: Any, me: int, batched: bool) -> Tuple[List[float], List[float], float]:
    """DDP with PowerSGD (from the third step on; error feedback, warm
    start) on pg: this rank's losses, the parameters' sums and the
    compression rate. Raises Failed when torch raises in a step."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    din = 16
    torch.manual_seed(4321)
    model = torch.nn.Sequential(torch.nn.Linear(din, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    ddp = DDP(model, process_group=pg, bucket_cap_mb=0.001)  # a bucket per layer
    state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=2, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, psgd.batched_powerSGD_hook if batched else psgd.powerSGD_hook)
    opt = sgd(ddp.parameters())
    losses: List[float] = []
    for step, (x, y) in enumerate(batches(me, n=6, din=din)):
        try:
            loss = loss_of(ddp(x), y)
            loss.backward()
        except Exception as e:
            raise Failed(step, e, losses) from e
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    rate = state.compression_stats()[0] if not batched else float(state.iter > state.start_powerSGD_iter)
    return losses, [float(p.detach().sum()) for p in model.parameters()], rate


def powersgd_compare(gloo: Any, me: int, batched: bool, what: str, theirs: Optional[tuple] = None) -> None:
    """PowerSGD on hvdd against gloo (theirs: gloo's run, if done already)."""
    ours, ours_p, rate = powersgd_train(dist.group.WORLD, me, batched)
    theirs_l, theirs_p, _ = theirs if theirs is not None else powersgd_train(gloo, me, batched)
    assert rate > 0 if batched else rate > 1, f"{what}: nothing was compressed (compression rate {rate})"
    close(ours, theirs_l, 1e-5, f"DDP {what}: losses")
    close(ours_p, theirs_p, 1e-5, f"DDP {what}: parameter sums")
    log(f"DDP {what}: losses {[round(v, 5) for v in ours]} match gloo's")


def batched_powersgd(gloo: Any, me: int) -> None:
    """batched_powerSGD_hook against gloo. torch 2.15's hook hands
    _orthogonalize a 2-D matrix, which it refuses (it takes batches of
    matrices since torch PR 75157): the hook then fails at its first
    compressed step on every backend. Where gloo fails, hvdd must fail at the
    same step in the same place with the same losses before it; and the hook
    is run again with _orthogonalize taking a 2-D matrix as a batch of one
    (what the hook means), against gloo the same."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    what = "batched_powerSGD_hook"
    try:
        theirs = powersgd_train(gloo, me, True)
    except Failed as f:
        try:
            powersgd_train(dist.group.WORLD, me, True)
        except Failed as g:
            assert (g.step, g.where, type(g.error)) == (f.step, f.where, type(f.error)), (str(g), str(f))
            close(g.losses, f.losses, 1e-5, f"DDP {what}: losses before it failed")
        else:
            raise AssertionError(f"DDP {what}: ran on hvdd, failed on gloo: {f}")
        log(f"DDP {what}: fails on hvdd as on gloo ({f}), losses before it {[round(v, 5) for v in f.losses]}")
        if f.where != ("powerSGD_hook.py", "_orthogonalize"):
            raise AssertionError(f"DDP {what}: failed on both backends, not in _orthogonalize: {f}") from f.error
        orig = psgd._orthogonalize

        def batch_of_one(matrices: torch.Tensor, epsilon: float = 0) -> None:
            orig(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)

        psgd._orthogonalize = batch_of_one
        try:
            powersgd_compare(gloo, me, True, f"{what} (its matrix a batch of one)")
        finally:
            psgd._orthogonalize = orig
        return
    powersgd_compare(gloo, me, True, what, theirs)


def powersgd(gloo: Any, me: int) -> None:
    powersgd_compare(gloo, me, False, "powerSGD_hook")
    batched_powersgd(gloo, me)


# ------------------------------------------------------------ SyncBatchNorm


def syncbn(gloo: Any, me: int) -> None:
    """SyncBatchNorm on CPU: torch refuses it, whatever the backend (DDP at
    construction, the layer itself in a training forward); in eval mode it
    is a BatchNorm. The same on hvdd and on gloo."""
    if torch.cuda.is_available():
        log("SyncBatchNorm: CUDA is available, but this scenario checks CPU only")
    for pg, backend in ((dist.group.WORLD, "hvdd"), (gloo, "gloo")):
        torch.manual_seed(5)
        net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))
        plain = copy.deepcopy(net)
        sync = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net, process_group=pg)
        assert isinstance(sync[1], torch.nn.SyncBatchNorm), sync
        try:
            DDP(sync, process_group=pg)
        except ValueError as e:
            assert "SyncBatchNorm layers only work with GPU modules" in str(e), e
        else:
            raise AssertionError(f"{backend}: DDP took a SyncBatchNorm model on CPU")
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(me))
        try:
            sync(x)
        except ValueError as e:
            assert "SyncBatchNorm expected input tensor to be on GPU" in str(e), e
        else:
            raise AssertionError(f"{backend}: SyncBatchNorm's training forward ran on CPU")
        sync.eval()
        plain.eval()
        close_t(sync(x), plain(x), 1e-6, f"{backend}: SyncBatchNorm in eval mode")
    log("SyncBatchNorm: refused on CPU by DDP and by its forward, on hvdd as on gloo")


# ------------------------------------------------------- status and metrics


def status_and_metrics(me: int, world: int) -> None:
    """While the job runs: `hvdd status --json` lists it with every rank's pid,
    and the daemon's /metrics counts its collectives."""
    pids: List[Any] = [None] * world
    dist.all_gather_object(pids, os.getpid())
    if me == 0:
        out = subprocess.run(
            [os.environ["HVDD_BIN"], "status", "--json"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        st = json.loads(out)
        # protojson leaves zeros out (rank 0's "rank").
        jobs = [j for j in st["jobs"] if sorted(r.get("pid", 0) for r in j.get("ranks", [])) == sorted(pids)]
        assert len(jobs) == 1, f"no job with the ranks' pids {pids} in hvdd status:\n{out}"
        job = jobs[0]
        assert job["name"].startswith("torch-") and job.get("size", 0) == world, job
        assert sorted(r.get("rank", 0) for r in job["ranks"]) == list(range(world)), job
        for r in job["ranks"]:
            assert r["pid"] == pids[r.get("rank", 0)], (r, pids)
        body = urllib.request.urlopen(f"http://{os.environ['HVDD_TEST_METRICS']}/metrics", timeout=30).read().decode()
        counts: Dict[str, float] = {}
        for line in body.splitlines():
            if line.startswith("hvdd_ops_total{") and f'job_name="{job["name"]}"' in line and 'code="ok"' in line:
                coll = line.split('collective="', 1)[1].split('"', 1)[0]
                counts[coll] = counts.get(coll, 0) + float(line.rsplit(" ", 1)[1])
        # FSDP2's all-gathers and reduce-scatters, DDP's and PowerSGD's allreduces.
        for coll in ("allreduce", "allgather", "reducescatter", "broadcast"):
            assert counts.get(coll, 0) > 0, f"/metrics: no {coll} ops of job {job['name']}: {counts}\n{body[:3000]}"
        log(f"hvdd status lists job {job['name']} with pids {pids}; /metrics counts its ops {counts}")
    dist.barrier()


# ---------------------------------------------------------------- the jobs


def train() -> None:
    """2 ranks under torchrun: FSDP2, ZeRO, PowerSGD, SyncBatchNorm against
    gloo, then the job in hvdd status and /metrics."""
    dist.init_process_group("hvdd")
    assert dist.get_backend() == "hvdd"
    gloo = dist.new_group(backend="gloo")
    me, world = dist.get_rank(), dist.get_world_size()
    fsdp2(gloo, me, world)
    zero(gloo, me)
    powersgd(gloo, me)
    syncbn(gloo, me)
    status_and_metrics(me, world)
    dist.destroy_process_group()
    say(f"OK train {me}")


def rank_data(rank: int, shape: Tuple[int, ...] = (4, 3)) -> torch.Tensor:
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 100.0 * rank


def group_ops(pg: Any, ref: Any, what: str) -> None:
    """all_reduce, all_gather_into_tensor, reduce_scatter_tensor and broadcast
    on pg give what they give on ref (a gloo group of the same ranks)."""
    me = dist.get_rank()
    ranks = dist.get_process_group_ranks(pg)
    assert ranks == dist.get_process_group_ranks(ref), (ranks, dist.get_process_group_ranks(ref))
    n = len(ranks)
    x = rank_data(me)
    results = []
    for g in (pg, ref):
        a = x.clone()
        dist.all_reduce(a, group=g)
        ag = torch.empty(n * 4, 3)
        dist.all_gather_into_tensor(ag, x, group=g)
        rs = torch.empty(4 // n, 3)
        dist.reduce_scatter_tensor(rs, x.clone(), group=g)
        b = x.clone()
        dist.broadcast(b, group_src=n - 1, group=g)
        results.append((a, ag, rs, b))
    for name, got, want in zip(
        ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"), *results
    ):
        close_t(got, want, 0.0, f"{what}: {name} against gloo")
    close_t(results[0][0], sum(rank_data(r) for r in ranks), 0.0, f"{what}: all_reduce (reference)")


def mesh() -> None:
    """4 ranks under hvdd run: new_subgroups, DeviceMesh (2, 2) with the
    collectives over each dim, DTensor, and HSDP (FSDP2 on the 2-D mesh),
    each against the same on gloo."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    dist.init_process_group("hvdd")
    me, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    # new_subgroups: consecutive pairs; new_subgroups_by_enumeration: any.
    sub, subs = dist.new_subgroups(group_size=2)
    gsub, _ = dist.new_subgroups(group_size=2, backend="gloo")
    assert len(subs) == 2 and dist.get_process_group_ranks(sub) == [me - me % 2, me - me % 2 + 1]
    group_ops(sub, gsub, "new_subgroups(group_size=2)")
    enum, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    genum, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]], backend="gloo")
    group_ops(enum, genum, "new_subgroups_by_enumeration([[0, 3], [1, 2]])")
    sets = {sub._ps, enum._ps}
    assert all(isinstance(g, ProcessGroupHvdd) for g in (sub, enum)) and len(sets) == 2 and 0 not in sets, sets
    # DeviceMesh: the groups of each dim are process sets; their collectives match gloo's.
    names = ("dp", "tp")
    m = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    gm = init_device_mesh("cpu", (2, 2), mesh_dim_names=names, backend_override={0: "gloo", 1: "gloo"})
    assert m.mesh.tolist() == gm.mesh.tolist() == [[0, 1], [2, 3]], m.mesh
    for d in names:
        g = m.get_group(d)
        assert isinstance(g, ProcessGroupHvdd) and g._ps != 0, (d, g)
        assert gm.get_group(d).name() == "gloo", gm.get_group(d).name()
        assert dist.get_process_group_ranks(g) == m.mesh[(slice(None), me % 2) if d == "dp" else (me // 2,)].tolist()
        group_ops(g, gm.get_group(d), f"DeviceMesh dim {d}")
    # DTensor on the mesh: sharding, gathering and reducing run on the dims' groups.
    full = torch.arange(48.0).reshape(8, 6)
    for mm, backend in ((m, "hvdd"), (gm, "gloo")):
        dt = distribute_tensor(full, mm, [Shard(0), Shard(1)])
        assert dt.to_local().shape == (4, 3), dt.to_local().shape
        close_t(dt.full_tensor(), full, 0.0, f"DTensor on {backend}: full_tensor of [Shard(0), Shard(1)]")
        close_t(
            dt.redistribute(mm, [Replicate(), Shard(0)]).to_local(),
            full.chunk(2, 0)[me % 2],
            0.0,
            f"DTensor on {backend}: redistribute to [Replicate(), Shard(0)]",
        )
        s = (dt * 2).sum()  # a Partial sum over both dims, reduced
        close_t(s.full_tensor(), full.sum() * 2, 0.0, f"DTensor on {backend}: sum")
        part = torch.distributed.tensor.DTensor.from_local(rank_data(me), mm, [Partial(), Partial()])
        close_t(
            part.redistribute(mm, [Replicate(), Replicate()]).to_local(),
            sum(rank_data(r) for r in range(world)),
            0.0,
            f"DTensor on {backend}: Partial to Replicate",
        )
    # HSDP: FSDP2 on the 2-D mesh (replicated over dp, sharded over tp).
    ref_losses, ref_p = fsdp_reference(world, None)
    ours, ours_p = fsdp_train(m, True, None, me)
    theirs, theirs_p = fsdp_train(gm, True, None, me)
    close(ours, theirs, 1e-6, "HSDP: losses against gloo's")
    close(ours, ref_losses[me], 1e-5, "HSDP: losses against the reference")
    for k in ref_p:
        close_t(ours_p[k], theirs_p[k], 1e-6, f"HSDP: {k} against gloo's")
        close_t(ours_p[k], ref_p[k], 1e-5, f"HSDP: {k} against the reference")
    log(f"HSDP on DeviceMesh (2, 2): losses {[round(v, 5) for v in ours]} match gloo's and the reference")
    dist.destroy_process_group()
    say(f"OK mesh {me}")


SCENARIOS: Dict[str, Callable[[], None]] = {"train": train, "mesh": mesh}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
