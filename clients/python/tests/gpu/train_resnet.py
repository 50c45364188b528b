"""Training throughput of ranks sharing one GPU (issue 26, item 4):
ResNet-50 (torchvision, weights=None) on synthetic data, batch 32 per rank,
SGD, three ways, each under the same launcher:

    hvdd run -np 2 -- python3 clients/python/tests/gpu/train_resnet.py --mode hvdd
    hvdd run -np 2 -- python3 clients/python/tests/gpu/train_resnet.py --mode noallreduce
    hvdd run -np 2 -- python3 clients/python/tests/gpu/train_resnet.py --mode ddp-gloo --store /tmp/ddp.store

hvdd         hvdd.torch: hvd.DistributedOptimizer(named_parameters=...) after
             hvd.broadcast_parameters and broadcast_optimizer_state: the
             gradients allreduced (Average) through the daemon and CUDA IPC
noallreduce  the same processes (hvd.init() for the rank only) with the plain
             optimizer and no allreduce: what the GPU alone allows them
ddp-gloo     torch DistributedDataParallel on gloo with CUDA tensors (the rank
             and size from hvdd run's HVDD_RANK and HVDD_SIZE, or RANK and
             WORLD_SIZE; a file:// store, --store)

Every rank runs --warmup untimed steps, then (after a barrier) --steps timed
ones between two torch.cuda.synchronize(); rank 0 prints each rank's img/s
and their total, and writes them to --json. The issue asks hvdd's total to be
>= 0.9x noallreduce's and ahead of ddp-gloo's.

Without torchvision a small built-in ResNet-like net (basic blocks,
64-512 channels) stands in, and the output says so. Without torch or a CUDA
device every rank exits 3, saying why (gpu-bench.sh's SKIP); --device cpu
runs the same code on CPU tensors (use --image-size 32 and a small batch),
to check the script on a machine without GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

NO_DEVICE = 3


def _parse(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--mode", choices=("hvdd", "noallreduce", "ddp-gloo"), required=True)
    ap.add_argument(
        "--model",
        choices=("resnet50", "small"),
        default="resnet50",
        help="resnet50 (torchvision; the small net where torchvision is missing) or small",
    )
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps (cudnn.benchmark picks its algorithms)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--store", help="ddp-gloo: the file:// store's file (absent or empty before the job)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", help="rank 0 writes the figures to this file as JSON")
    return ap.parse_args(argv)


def _small_net(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.skip(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers)


def _model(torch, name: str):
    """The model and what it is, for the output."""
    if name == "resnet50":
        try:
            import torchvision
        except ImportError as e:
            return _small_net(torch), f"small built-in ResNet-like net: torchvision is missing ({e}), so not ResNet-50"
        try:
            m = torchvision.models.resnet50(weights=None)
        except TypeError:  # torchvision < 0.13
            m = torchvision.models.resnet50(pretrained=False)
        return m, f"torchvision {torchvision.__version__} resnet50 (weights=None)"
    return _small_net(torch), "small built-in ResNet-like net (--model small)"


def _env_int(*names: str, default: int) -> int:
    for n in names:
        if os.environ.get(n):
            return int(os.environ[n])
    return default


def main(argv=None) -> int:
    a = _parse(argv)
    try:
        import torch
    except ImportError as e:
        print(f"no torch in {sys.executable}: {e}", file=sys.stderr)
        return NO_DEVICE
    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            f"no CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available() is False)", file=sys.stderr
        )
        return NO_DEVICE
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("HVDD_TEST_CUDA_DEVICE", "0")))
        torch.cuda.set_device(dev)
        torch.backends.cudnn.benchmark = True
    else:
        dev = torch.device("cpu")

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()

    hvd = dist = None
    if a.mode in ("hvdd", "noallreduce"):
        import hvdd.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        import torch.distributed as dist

        if not a.store:
            print("--mode ddp-gloo needs --store FILE", file=sys.stderr)
            return 2
        rank = _env_int("HVDD_RANK", "RANK", "OMPI_COMM_WORLD_RANK", default=0)
        size = _env_int("HVDD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
        dist.init_process_group(
            "gloo",
            init_method="file://" + os.path.abspath(a.store),
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=120),
        )

    torch.manual_seed(1234 + rank)
    model, what = _model(torch, a.model)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if a.mode == "hvdd":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif a.mode == "ddp-gloo":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if a.device == "cuda" else None)
    nparams = sum(p.numel() for p in model.parameters())

    g = torch.Generator(device="cpu").manual_seed(rank)
    x = torch.randn(a.batch, 3, a.image_size, a.image_size, generator=g).to(dev)
    y = torch.randint(0, 1000, (a.batch,), generator=g).to(dev)
    loss = None

    def step():
        nonlocal loss
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    def barrier() -> None:
        if hvd is not None:
            hvd.barrier()
        else:
            dist.barrier()

    model.train()
    for _ in range(a.warmup):
        step()
    sync()
    barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    el = time.perf_counter() - t0
    ips = a.steps * a.batch / el
    lv = float(loss.detach().cpu())
    mine = {"rank": rank, "img_per_s": ips, "seconds": el, "loss": lv}
    if hvd is not None:
        every = hvd.allgather_object(mine, name="train.figures")
    else:
        every = [None] * size
        dist.all_gather_object(every, mine)
    print(f"rank {rank}: {ips:.1f} img/s ({a.steps} steps of {a.batch} in {el:.2f}s, loss {lv:.3f})")
    if rank == 0:
        every = sorted(every, key=lambda e: e["rank"])
        total = sum(e["img_per_s"] for e in every)
        dname = torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu"
        print(f"model: {what}, {nparams} parameters; {dname}")
        print(
            f"mode {a.mode}, {size} ranks: total {total:.1f} img/s; per rank "
            + ", ".join(f"{e['img_per_s']:.1f}" for e in every)
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    {
                        "measure": "train",
                        "mode": a.mode,
                        "ranks": size,
                        "model": what,
                        "resnet50": what.startswith("torchvision"),
                        "parameters": nparams,
                        "batch": a.batch,
                        "image_size": a.image_size,
                        "warmup": a.warmup,
                        "steps": a.steps,
                        "device": dname,
                        "per_rank": every,
                        "total_img_per_s": total,
                        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
                        "torch": torch.__version__,
                    },
                    f,
                    sort_keys=True,
                )
                f.write("\n")
    if not all(e["loss"] == e["loss"] for e in every):  # NaN
        print("a rank's loss is NaN", file=sys.stderr)
        return 1
    if hvd is not None:
        hvd.shutdown()
    else:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
