#!/usr/bin/env python3
"""Elastic Keras MNIST training with hvdd, after Horovod's
examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py:
``model.fit`` runs under ``@hvd.elastic.run``; a ``KerasState`` holds the
model, its optimizer, the epoch and the batch; the elastic callbacks keep the
epoch and the batch in the state and commit it after every
--batches-per-commit batches and every epoch; a reset callback rescales the
learning rate to the new number of ranks; rank 0 writes a checkpoint after
every epoch.

Run on 2 local processes:

    hvdd run -np 2 python examples/tensorflow2_keras_mnist_elastic.py --epochs 2

or as an elastic job that goes on while at least 2 of its 3 workers live:

    hvdd run -np 3 --min-np 2 python examples/tensorflow2_keras_mnist_elastic.py --epochs 2

When a worker dies, the survivors' ``model.fit`` fails with the collective's
error, and ``hvd.elastic.run`` restores the last commit, re-forms the job
(``shutdown``, ``init``), runs the reset callback and fits again for the
epochs that are left. The interrupted epoch then runs all its steps again
from the last commit: UpdateBatchStateCallback shortens it only in the
callbacks' ``params`` (as with Horovod, ``fit`` does not read them).

What differs from Horovod's script: MNIST comes from the Keras cache or
--data-dir when present, else a synthetic stand-in of the same shape (see
mnist_data.py; nothing is downloaded); flags size the run; every rank starts
from different weights (the state's sync makes them rank 0's); rank 0 logs
its running loss every --log-interval batches, and every epoch's loss and
accuracy averaged over the ranks (MetricAverageCallback); its checkpoints
are .keras files named after the state's epoch, which counts across resets
(a ModelCheckpoint's ``{epoch}`` restarts at 1 with every ``fit``); the
learning rate is assigned to
``optimizer.learning_rate`` (Keras 3 has no ``lr``). Works with Keras 3 and,
with TF_USE_LEGACY_KERAS=1, with tf_keras.
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
    description="Tensorflow 2.0 Keras MNIST Elastic Example", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument(
    "--use-mixed-precision", action="store_true", default=False, help="use mixed precision for training"
)
parser.add_argument("--epochs", type=int, default=24, help="number of epochs")
parser.add_argument("--steps", type=int, default=500, help="steps per epoch, divided among the ranks")
parser.add_argument("--batch-size", type=int, default=128, help="batch size per rank")
parser.add_argument("--lr", type=float, default=0.001, help="learning rate (scaled by the number of ranks)")
parser.add_argument(
    "--batches-per-commit", type=int, default=1, help="number of batches processed before calling `state.commit()`"
)
parser.add_argument("--log-interval", type=int, default=10, help="batches between rank 0's loss lines (0: none)")
parser.add_argument("--seed", type=int, default=42, help="random seed (rank r uses seed + r)")
parser.add_argument("--data-dir", help="directory holding the MNIST idx files")
parser.add_argument("--synthetic-size", type=int, default=30000, help="examples of the synthetic stand-in")
parser.add_argument("--checkpoint-dir", default=".", help="where rank 0 writes checkpoint-{epoch}.keras")
args = parser.parse_args()

if args.use_mixed_precision:
    tf.keras.mixed_precision.set_global_policy("mixed_float16")

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

# Different initial weights on every rank: the state's sync makes them rank 0's.
tf.keras.utils.set_random_seed(args.seed + hvd.rank())

(mnist_images, mnist_labels), _, source = mnist_data.load(args.data_dir, args.synthetic_size)
if hvd.rank() == 0:
    print(f"MNIST: {source}, {len(mnist_images)} training images", flush=True)

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000, seed=args.seed + hvd.rank()).batch(args.batch_size)

model = tf.keras.Sequential(
    [
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

# (Horovod's script also passed experimental_run_tf_function=False; Keras 3
# has no such argument and needs none: the optimizer reduces in
# apply_gradients. The allreduce runs in the client, outside XLA, hence
# jit_compile=False for machines with a GPU, where Keras would pick XLA.)
model.compile(
    loss=tf.keras.losses.SparseCategoricalCrossentropy(),
    optimizer=opt,
    metrics=["accuracy"],
    jit_compile=False,
)

# Horovod: initialize optimizer state so we can synchronize across workers
# (the optimizer's variables, and the model's, exist after its first step).
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    # (Horovod's tf.keras.backend.set_value(optimizer.lr, ...): Keras 3 has no
    # `lr`, and its legacy set_value cannot set a Keras 3 variable.)
    state.model.optimizer.learning_rate.assign(args.lr * hvd.size())
    # Re-initialize, to join with possible new ranks
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)


state.register_reset_callbacks([on_state_reset])


def steps_per_epoch():
    # Horovod: adjust number of steps based on number of GPUs.
    return max(1, args.steps // hvd.size())


class Progress(tf.keras.callbacks.Callback):
    """Rank 0's log: the loss every --log-interval batches, and the epoch's
    loss and accuracy averaged over the ranks, then its checkpoint.

    It comes after the elastic callbacks and MetricAverageCallback, so
    ``state.epoch`` counts the epochs finished across resets and the epoch's
    metrics are already averaged. The rank is asked on every call: a reset
    may change it.
    """

    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == 0 and args.log_interval and (batch + 1) % args.log_interval == 0:
            print(
                f"Train Epoch: {state.epoch + 1} [batch {batch + 1}/{steps_per_epoch()}]"
                f" loss={logs['loss']:.4f} ({hvd.size()} ranks)",
                flush=True,
            )

    def on_epoch_end(self, epoch, logs=None):
        if hvd.rank() != 0:
            return
        print(
            f"Epoch {state.epoch}: loss={logs['loss']:.4f} accuracy={logs['accuracy']:.4f} ({hvd.size()} ranks)",
            flush=True,
        )
        # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        self.model.save(os.path.join(args.checkpoint_dir, f"checkpoint-{state.epoch}.keras"))


callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=args.batches_per_commit),
    # Horovod: average metrics among workers at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    Progress(),
]


# Train the model.
@hvd.elastic.run
def train(state):
    state.model.fit(
        dataset,
        steps_per_epoch=steps_per_epoch(),
        epochs=args.epochs - state.epoch,
        callbacks=callbacks,
        verbose=0,
    )


train(state)
if hvd.rank() == 0:
    print(f"done: {state.epoch} epochs on {hvd.size()} ranks", flush=True)
