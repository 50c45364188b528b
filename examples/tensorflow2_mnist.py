#!/usr/bin/env python3
"""TensorFlow 2 MNIST training with hvdd, after Horovod's
examples/tensorflow2/tensorflow2_mnist.py: a tf.function training step with
DistributedGradientTape, variables broadcast from rank 0 after the first
step, checkpoints on rank 0 only.

Run on 2 local processes:

    hvdd run -np 2 python examples/tensorflow2_mnist.py

MNIST comes from the Keras cache or --data-dir when present, else a
synthetic stand-in of the same shape (see mnist_data.py).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import hvdd.tensorflow as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

parser = argparse.ArgumentParser(
    description="TensorFlow 2 MNIST Example", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--steps", type=int, default=10000, help="training steps, divided among the ranks")
parser.add_argument("--batch-size", type=int, default=128, help="batch size per rank")
parser.add_argument("--lr", type=float, default=0.001, help="learning rate (scaled by the number of ranks)")
parser.add_argument("--data-dir", help="directory holding the MNIST idx files")
parser.add_argument("--synthetic-size", type=int, default=30000, help="examples of the synthetic stand-in")
parser.add_argument("--checkpoint-dir", default="./checkpoints", help="where rank 0 writes its checkpoint")
parser.add_argument(
    "--seed",
    type=int,
    help="seed of the initial weights, and deterministic ops (default: unseeded, as Horovod's example)",
)
args = parser.parse_args()

# Initialize Horovod
hvd.init()

# Pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

(mnist_images, mnist_labels), _, source = mnist_data.load(args.data_dir, args.synthetic_size)
if hvd.rank() == 0:
    print(f"MNIST: {source}, {len(mnist_images)} training images", flush=True)

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000, seed=hvd.rank()).batch(args.batch_size)

if args.seed is not None:
    # Keras 3's initializers draw from Keras's own seed, which
    # tf.random.set_seed alone leaves unset (Python's, NumPy's, TF's and
    # Keras's at once); and deterministic ops: TensorFlow's CPU kernels
    # otherwise sum in a thread-dependent order. A seeded run repeats.
    tf.keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
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
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of GPUs.
opt = tf.optimizers.Adam(args.lr * hvd.size())

checkpoint_dir = args.checkpoint_dir
checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)


def optimizer_variables(optimizer):
    """Keras 3's optimizer.variables is a list; Keras 2's a method."""
    v = optimizer.variables
    return v() if callable(v) else v


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)

    return loss_value


# Horovod: adjust number of steps based on number of GPUs.
for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
    loss_value = training_step(images, labels, batch == 0)

    if batch % 10 == 0 and hvd.local_rank() == 0:
        print("Step #%d\tLoss: %.6f" % (batch, loss_value), flush=True)

# Horovod: save checkpoints only on worker 0 to prevent other workers from
# corrupting it.
if hvd.rank() == 0:
    checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
