#!/usr/bin/env python3
"""Elastic PyTorch MNIST training with hvdd, after Horovod's
examples/elastic/pytorch/pytorch_mnist_elastic.py (with the ElasticSampler and
the epoch loop of its elastic ImageNet example): the training function runs
under ``@hvd.elastic.run``; a ``TorchState`` holds the model, the optimizer,
the sampler, the epoch and the batch; every batch is recorded in the sampler
and committed; a reset callback rescales the learning rate to the new number
of ranks; rank 0 writes a checkpoint after every epoch and resumes from the
newest one.

Run on 2 local processes:

    hvdd run -np 2 python examples/pytorch_mnist_elastic.py --epochs 1

It runs as a plain job like this. In an elastic job (``hvdd run -np 3
--min-np 2 python examples/pytorch_mnist_elastic.py``, one host), after a
lost rank the survivors go back to the last commit, re-form (``shutdown``,
``init``) and continue the epoch over the indices not yet processed.

MNIST comes from the Keras cache or --data-dir when present, else a
synthetic stand-in of the same shape (see mnist_data.py); nothing is
downloaded. The flags, the network and the test are pytorch_mnist.py's.
"""

import glob
import os
import re
import sys

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import hvdd.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402
import pytorch_mnist  # noqa: E402
from pytorch_mnist import Net, metric_average, test  # noqa: E402

# Training settings: pytorch_mnist.py's, and the elastic ones.
parser = pytorch_mnist.parser
parser.description = "PyTorch MNIST Elastic Example"
parser.add_argument(
    "--batches-per-commit", type=int, default=1, help="number of batches processed before calling `state.commit()`"
)
parser.add_argument(
    "--batches-per-epoch", type=int, default=0, help="stop each epoch after this many batches per rank (0: all)"
)
parser.set_defaults(checkpoint_dir="./checkpoints")  # rank 0 also resumes from there


def to_dataset(images, labels, mean, std):
    """uint8 (N, 28, 28) images and labels as a normalised TensorDataset."""
    x = torch.from_numpy(images).float().div(255.0).unsqueeze(1)
    return torch.utils.data.TensorDataset((x - mean) / std, torch.from_numpy(labels).long())


def latest_checkpoint(checkpoint_dir):
    """(epoch, path) of the newest checkpoint-{epoch}.pth.tar, or (0, None)."""
    found = []
    for path in glob.glob(os.path.join(checkpoint_dir, "checkpoint-*.pth.tar")):
        m = re.search(r"checkpoint-(\d+)\.pth\.tar$", path)
        if m:
            found.append((int(m.group(1)), path))
    return max(found) if found else (0, None)


def main():
    args = parser.parse_args()

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    (x_train, y_train), (x_test, y_test), source = mnist_data.load(args.data_dir, args.synthetic_size)
    if hvd.rank() == 0:
        print("MNIST from %s" % source, flush=True)
    # Normalised by the training images' statistics (MNIST's: 0.1307, 0.3081).
    mean, std = float(x_train.mean()) / 255.0, float(x_train.std()) / 255.0
    train_dataset = to_dataset(x_train, y_train, mean, std)
    test_dataset = to_dataset(x_test, y_test, mean, std)

    # Elastic Horovod: use ElasticSampler to partition data among workers; it
    # repartitions what is left of an epoch after a reset.
    train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    model = Net()

    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

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

    # Restore from the newest checkpoint on the first worker; the state's
    # sync at the start of training broadcasts it to the other workers.
    first_epoch = 1
    if hvd.rank() == 0:
        done, path = latest_checkpoint(args.checkpoint_dir)
        if path:
            checkpoint = torch.load(path)
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            first_epoch = done + 1
            print("resuming after %s" % path, flush=True)

    def train_epoch(state):
        """Trains on what is left of state.epoch, committing every
        --batches-per-commit batches; returns rank 0's mean loss."""
        state.model.train()
        batch_offset = state.batch
        total, batches, window = 0.0, 0, []
        for idx, (data, target) in enumerate(train_loader):
            state.batch = batch_idx = batch_offset + idx
            if args.batches_per_epoch and batch_idx >= args.batches_per_epoch:
                break
            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()

            # Elastic Horovod: record which samples were processed this batch
            # so we do not reprocess them if a reset event occurs.
            state.train_sampler.record_batch(idx, args.batch_size)

            total += loss.item()
            batches += 1
            window.append(loss.item())
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                print(
                    "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                        state.epoch,
                        (batch_idx + 1) * len(data),
                        len(train_sampler) + batch_offset * args.batch_size,
                        100.0 * (batch_idx + 1) / (len(train_loader) + batch_offset),
                        sum(window) / len(window),
                    ),
                    flush=True,
                )
                window = []
            if (batch_idx + 1) % args.batches_per_commit == 0:
                state.commit()
        return total / max(batches, 1)

    def test_now():
        # The ranks of now: a reset may have changed them.
        test_sampler = torch.utils.data.distributed.DistributedSampler(
            test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
        )
        test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)
        return test(model, test_loader, test_sampler)

    def end_epoch(state):
        state.epoch += 1
        state.batch = 0
        # Clears the processed indices; reshuffles for the next epoch.
        state.train_sampler.set_epoch(state.epoch)
        state.commit()

    @hvd.elastic.run
    def train(state):
        # post synchronization event (worker added, worker removed) init ...
        while state.epoch <= args.epochs:
            train_loss = metric_average(train_epoch(state), "avg_train_loss")
            test_loss, test_accuracy = test_now()
            # Horovod: print output only on first rank.
            if hvd.rank() == 0:
                print(
                    "Epoch {}: loss={:.4f} test_loss={:.4f} test_accuracy={:.2f}%".format(
                        state.epoch, train_loss, test_loss, 100.0 * test_accuracy
                    ),
                    flush=True,
                )
                # Horovod: save checkpoints only on worker 0 to prevent other workers
                # from corrupting them.
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": state.epoch},
                    os.path.join(args.checkpoint_dir, "checkpoint-{}.pth.tar".format(state.epoch)),
                )
            end_epoch(state)

    # adjust learning rate on reset
    def on_state_reset():
        for param_group in optimizer.param_groups:
            param_group["lr"] = args.lr * hvd.size()

    # Rank 0's epoch (and sampler) are everyone's after the first sync.
    train_sampler.set_epoch(first_epoch)
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=first_epoch, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    hvd.shutdown()


if __name__ == "__main__":
    main()
