#!/usr/bin/env python3
"""Keras MNIST training with hvdd, after Horovod's
examples/tensorflow2/tensorflow2_keras_mnist.py: model.fit with
DistributedOptimizer, variables broadcast from rank 0 after the first batch,
metrics averaged over the ranks, learning-rate warmup, checkpoints on rank 0
only.

Run on 2 local processes:

    hvdd run -np 2 python examples/tensorflow2_keras_mnist.py --epochs 2

MNIST comes from the Keras cache (~/.keras/datasets/mnist.npz) or --data-dir
when present, else a synthetic stand-in of the same shape (see mnist_data.py);
the script says which. Works with Keras 3 and, with TF_USE_LEGACY_KERAS=1,
with tf_keras.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import hvdd.tensorflow.keras as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

parser = argparse.ArgumentParser(
    description="TensorFlow 2 Keras MNIST Example", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--epochs", type=int, default=24, help="number of epochs")
parser.add_argument("--steps", type=int, default=500, help="steps per epoch, divided among the ranks")
parser.add_argument("--batch-size", type=int, default=128, help="batch size per rank")
parser.add_argument("--lr", type=float, default=0.001, help="learning rate (scaled by the number of ranks)")
parser.add_argument("--warmup-epochs", type=int, default=3, help="epochs of learning-rate warmup")
parser.add_argument("--seed", type=int, default=42, help="random seed (rank 0's; the broadcast makes it everyone's)")
parser.add_argument("--data-dir", help="directory holding the MNIST idx files")
parser.add_argument("--synthetic-size", type=int, default=30000, help="examples of the synthetic stand-in")
parser.add_argument("--checkpoint-dir", default="./checkpoints", help="where rank 0 writes its checkpoints")
args = parser.parse_args()


def train() -> tf.keras.Model:
    # Horovod: initialize Horovod.
    hvd.init()

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    # Different initial weights on every rank: BroadcastGlobalVariablesCallback
    # makes them rank 0's.
    tf.keras.utils.set_random_seed(args.seed + hvd.rank())

    (mnist_images, mnist_labels), _, source = mnist_data.load(args.data_dir, args.synthetic_size)
    if hvd.rank() == 0:
        print(f"MNIST: {source}, {len(mnist_images)} training images", flush=True)

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
    )
    dataset = dataset.repeat().shuffle(10000, seed=hvd.rank()).batch(args.batch_size)

    mnist_model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
            tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
            tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = args.lr * hvd.size()
    opt = tf.keras.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

    # (Horovod's TF 2.x example also passed experimental_run_tf_function=False;
    # Keras 3 has no such argument and needs none: the optimizer reduces in
    # apply_gradients. The allreduce runs in the client, outside XLA, hence
    # jit_compile=False for machines with a GPU, where Keras would pick XLA.)
    mnist_model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        optimizer=opt,
        metrics=["accuracy"],
        jit_compile=False,
    )

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        #
        # Note: This callback must be in the list before the ReduceLROnPlateau,
        # TensorBoard or other metrics-based callbacks.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(
            tf.keras.callbacks.ModelCheckpoint(os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras"))
        )

    # Horovod: write logs on worker 0 (one line per epoch).
    verbose = 2 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    history = mnist_model.fit(
        dataset,
        steps_per_epoch=max(1, args.steps // hvd.size()),
        callbacks=callbacks,
        epochs=args.epochs,
        verbose=verbose,
    )
    if hvd.rank() == 0:
        losses = history.history["loss"]
        for epoch, loss in enumerate(losses):
            print(f"epoch {epoch + 1}: loss {loss:.4f} (averaged over {hvd.size()} ranks)")
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    return mnist_model


if __name__ == "__main__":
    train()
