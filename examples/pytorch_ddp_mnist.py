#!/usr/bin/env python3
"""PyTorch MNIST with DistributedDataParallel on the hvdd backend: a plain
torch.distributed program in which one word differs from gloo's
(``init_process_group("hvdd")``).

Run on 2 local processes:

    torchrun --nproc-per-node 2 examples/pytorch_ddp_mnist.py --epochs 2

or under hvdd run (``hvdd run -np 2 python examples/pytorch_ddp_mnist.py``),
or with ``--backend gloo`` to compare. The ranks use the node's hvdd daemon,
or start one for the job (the hvdd binary from $HVDD_BIN or PATH).

MNIST comes from examples/mnist_data.py: the Keras cache or the idx files in
--data-dir when present, else (nothing is downloaded) a synthetic, learnable
stand-in of the same shape.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torch.nn.parallel import DistributedDataParallel as DDP

import hvdd.torch.distributed  # noqa: F401 (registers the "hvdd" backend)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

parser = argparse.ArgumentParser(description="PyTorch MNIST with DDP on hvdd")
parser.add_argument("--backend", default="hvdd", help="torch.distributed backend (default: hvdd)")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size per rank (default: 64)")
parser.add_argument("--test-batch-size", type=int, default=1000, help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=3, help="number of epochs to train (default: 3)")
parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate (default: 0.001)")
parser.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=20, help="batches between training log lines")
parser.add_argument("--data-dir", help="directory holding the MNIST idx files (a synthetic stand-in when absent)")
parser.add_argument("--synthetic-size", type=int, default=8000, help="training examples of the synthetic stand-in")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def dataset(x, y, mean, std):
    x = torch.from_numpy(x).float().div_(255).unsqueeze(1)
    return torch.utils.data.TensorDataset((x - mean) / std, torch.from_numpy(y).long())


def main():
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    (x_train, y_train), (x_test, y_test), source = mnist_data.load(args.data_dir, args.synthetic_size)
    if rank == 0:
        print(f"backend {dist.get_backend()}, {size} ranks, data: {source}", flush=True)
    mean, std = float(x_train.mean()) / 255, float(x_train.std()) / 255  # MNIST's: 0.1307, 0.3081
    train_set, test_set = dataset(x_train, y_train, mean, std), dataset(x_test, y_test, mean, std)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_set, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = DDP(Net())  # broadcasts rank 0's parameters; averages the gradients in backward
    optimizer = optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and rank == 0:
                print(
                    f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)} "
                    f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}",
                    flush=True,
                )

        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, count
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                sums[0] += F.nll_loss(output, target, reduction="sum").item()
                sums[1] += output.argmax(1).eq(target).sum().item()
                sums[2] += len(target)
        dist.all_reduce(sums)  # the whole test set's, over the ranks' shards
        if rank == 0:
            print(
                f"Test set: Average loss: {sums[0] / sums[2]:.4f}, Accuracy: {100.0 * sums[1] / sums[2]:.2f}%",
                flush=True,
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
