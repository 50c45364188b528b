#!/usr/bin/env python3
"""PyTorch MNIST training with hvdd, after Horovod's examples/pytorch/pytorch_mnist.py.

Run on 2 local processes:

    hvdd run -np 2 python examples/pytorch_mnist.py --epochs 2

MNIST is read from --data-dir when it holds the idx files
(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-*; optionally .gz);
torchvision is not needed. Without them (nothing is downloaded) the script
trains on a synthetic, learnable stand-in of the same shape: noisy strokes of
ten fixed class templates.
"""

import argparse
import gzip
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import hvdd.torch as hvd

# Training settings
parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument(
    "--batch-size", type=int, default=64, metavar="N", help="input batch size for training (default: 64)"
)
parser.add_argument(
    "--test-batch-size", type=int, default=1000, metavar="N", help="input batch size for testing (default: 1000)"
)
parser.add_argument("--epochs", type=int, default=10, metavar="N", help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR", help="learning rate (default: 0.01)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
parser.add_argument(
    "--log-interval", type=int, default=10, metavar="N", help="how many batches to wait before logging training status"
)
parser.add_argument(
    "--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce"
)
parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm to do reduction")
parser.add_argument(
    "--gradient-predivide-factor",
    type=float,
    default=1.0,
    help="apply gradient predivide factor in optimizer (default: 1.0)",
)
parser.add_argument(
    "--data-dir", help="directory holding the MNIST idx files (a synthetic stand-in is used when absent)"
)
parser.add_argument(
    "--synthetic-size",
    type=int,
    default=30000,
    help="training examples of the synthetic stand-in (test set: a quarter of it)",
)
parser.add_argument("--checkpoint-dir", default="./checkpoints", help="where rank 0 writes checkpoint-{epoch}.pth.tar")


def read_idx(path):
    """Reads an idx file (optionally gzipped) into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        magic = struct.unpack(">I", f.read(4))[0]
        ndim = magic & 0xFF
        dims = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def find_idx(data_dir, stem):
    for d in (data_dir, os.path.join(data_dir, "MNIST", "raw")):
        for suffix in ("", ".gz"):
            p = os.path.join(d, stem + suffix)
            if os.path.exists(p):
                return p
    return None


def mnist_dataset(data_dir, train):
    """MNIST from idx files as a normalised TensorDataset, or None."""
    if not data_dir:
        return None
    prefix = "train" if train else "t10k"
    images = find_idx(data_dir, f"{prefix}-images-idx3-ubyte")
    labels = find_idx(data_dir, f"{prefix}-labels-idx1-ubyte")
    if images is None or labels is None:
        return None
    x = torch.from_numpy(read_idx(images).astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.1307) / 0.3081
    y = torch.from_numpy(read_idx(labels).astype(np.int64))
    return torch.utils.data.TensorDataset(x, y)


def synthetic_dataset(n, seed):
    """A learnable MNIST-shaped stand-in: each class is a fixed random stroke
    template, examples are shifted, noisy copies. Same data on every rank."""
    g = torch.Generator().manual_seed(1234)
    templates = (torch.rand(10, 1, 28, 28, generator=g) > 0.8).float()
    templates = F.avg_pool2d(templates, 3, stride=1, padding=1) * 2
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y]
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    x = torch.stack([torch.roll(x[i], (int(shifts[i, 0]), int(shifts[i, 1])), (1, 2)) for i in range(n)])
    x = x + 0.6 * torch.randn(x.shape, generator=g)
    return torch.utils.data.TensorDataset((x - x.mean()) / x.std(), y)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test(model, test_loader, test_sampler):
    """The test loss and accuracy, averaged over the workers."""
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            # sum up batch loss
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            # get the index of the max log-probability
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()

    # Horovod: use test_sampler to determine the number of examples in
    # this worker's partition.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)

    # Horovod: average metric values across workers.
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")
    return test_loss, test_accuracy


def main():
    args = parser.parse_args()

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset = mnist_dataset(args.data_dir, train=True)
    test_dataset = mnist_dataset(args.data_dir, train=False)
    if train_dataset is None or test_dataset is None:
        if hvd.rank() == 0:
            print(
                "MNIST idx files not found%s: training on a synthetic stand-in of %d examples"
                % (" in " + args.data_dir if args.data_dir else "", args.synthetic_size),
                flush=True,
            )
        train_dataset = synthetic_dataset(args.synthetic_size, seed=1)
        test_dataset = synthetic_dataset(max(args.synthetic_size // 4, 2 * hvd.size()), seed=2)

    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    # Horovod: use DistributedSampler to partition the test data.
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()

    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
    )

    def train(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                print(
                    "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                        epoch,
                        batch_idx * len(data),
                        len(train_sampler),
                        100.0 * batch_idx / len(train_loader),
                        loss.item(),
                    ),
                    flush=True,
                )
        # Horovod: average the epoch's training loss across workers.
        return metric_average(total / max(batches, 1), "avg_train_loss")

    for epoch in range(1, args.epochs + 1):
        train_loss = train(epoch)
        test_loss, test_accuracy = test(model, test_loader, test_sampler)
        # Horovod: print output only on first rank.
        if hvd.rank() == 0:
            print(
                "Epoch {}: loss={:.4f} test_loss={:.4f} test_accuracy={:.2f}%".format(
                    epoch, train_loss, test_loss, 100.0 * test_accuracy
                ),
                flush=True,
            )
            # Horovod: save checkpoints only on worker 0 to prevent other workers
            # from corrupting them.
            os.makedirs(args.checkpoint_dir, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                os.path.join(args.checkpoint_dir, "checkpoint-{}.pth.tar".format(epoch)),
            )

    hvd.shutdown()


if __name__ == "__main__":
    main()
