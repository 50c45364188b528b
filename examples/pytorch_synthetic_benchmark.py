#!/usr/bin/env python3
"""Synthetic data-parallel training throughput, after Horovod's
examples/pytorch/pytorch_synthetic_benchmark.py, on CPU with a small
ResNet-like CNN built here (torchvision is not needed).

    hvdd run -np 2 python examples/pytorch_synthetic_benchmark.py --num-iters 5

The same model under torch.distributed DistributedDataParallel (gloo), for
comparison:

    torchrun --nproc_per_node 2 examples/pytorch_synthetic_benchmark.py --ddp
    python examples/pytorch_synthetic_benchmark.py --ddp --np 2   # spawns its own ranks

With HVDD_BENCH_IMPL=horovod the same script runs through horovod.torch instead
of hvdd.torch (for bench/horovod/run.sh, under horovodrun).
"""

import argparse
import os
import timeit
from types import ModuleType

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

parser = argparse.ArgumentParser(
    description="PyTorch Synthetic Benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument(
    "--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce"
)
parser.add_argument("--batch-size", type=int, default=16, help="input batch size")
parser.add_argument("--image-size", type=int, default=64, help="input images are image-size x image-size")
parser.add_argument("--width", type=int, default=32, help="channels of the first stage")
parser.add_argument(
    "--num-warmup-batches", type=int, default=2, help="number of warm-up batches that don't count towards benchmark"
)
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
parser.add_argument(
    "--ddp",
    action="store_true",
    default=False,
    help="run under torch.distributed DistributedDataParallel (gloo) instead of hvdd",
)
parser.add_argument("--np", type=int, default=0, help="with --ddp outside torchrun: spawn this many local ranks")


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class SmallResNet(nn.Module):
    """A ResNet-18-shaped network with one block per stage."""

    def __init__(self, width=32, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            stages.append(Block(cin, width * mult, 1 if i == 0 else 2))
            cin = width * mult
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def benchmark(args, rank, size, model, optimizer, log):
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % 1000

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    log("Model: SmallResNet(width=%d)" % args.width)
    log("Batch size: %d" % args.batch_size)
    log("Number of ranks: %d" % size)

    # Warm-up
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    # Benchmark
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per rank" % (x, img_sec))
        img_secs.append(img_sec)

    # Results
    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log("Img/sec per rank: %.1f +-%.1f" % (img_sec_mean, img_sec_conf))
    log("Total img/sec on %d rank(s): %.1f +-%.1f" % (size, size * img_sec_mean, size * img_sec_conf))


def import_hvd() -> ModuleType:
    """hvdd.torch, or horovod.torch when HVDD_BENCH_IMPL=horovod."""
    impl = os.environ.get("HVDD_BENCH_IMPL", "hvdd")
    if impl == "horovod":
        import horovod.torch as hvd
    elif impl == "hvdd":
        import hvdd.torch as hvd
    else:
        raise SystemExit("HVDD_BENCH_IMPL must be hvdd or horovod, not %r" % impl)
    return hvd


def run_hvdd(args):
    hvd = import_hvd()

    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    model = SmallResNet(args.width)
    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    log("Implementation: %s" % hvd.__name__)
    benchmark(args, hvd.rank(), hvd.size(), model, optimizer, log)
    hvd.shutdown()


def run_ddp(rank, size, args):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    model = nn.parallel.DistributedDataParallel(SmallResNet(args.width))
    optimizer = optim.SGD(model.parameters(), lr=0.01 * size)

    def log(s):
        if rank == 0:
            print("[ddp] " + s, flush=True)

    benchmark(args, rank, size, model, optimizer, log)
    dist.destroy_process_group()


def _spawned(rank, size, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    run_ddp(rank, size, args)


def main():
    args = parser.parse_args()
    if not args.ddp:
        run_hvdd(args)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        run_ddp(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        import torch.multiprocessing as mp

        n = args.np or 1
        mp.spawn(_spawned, args=(n, args), nprocs=n, join=True)


if __name__ == "__main__":
    main()
