#!/usr/bin/env python3
"""TensorFlow 1 (graph mode, ``tf.compat.v1``) MNIST training with hvdd, after
Horovod's examples/tensorflow/tensorflow_mnist.py: a
``tf.compat.v1.train.Optimizer`` wrapped in DistributedOptimizer,
``MonitoredTrainingSession`` with BroadcastGlobalVariablesHook, checkpoints on
rank 0 only.

Run on 2 local processes:

    hvdd run -np 2 python examples/tensorflow_mnist.py

MNIST comes from the Keras cache or --data-dir when present, else a
synthetic stand-in of the same shape (see mnist_data.py).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdd.tensorflow as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_data  # noqa: E402

tf.compat.v1.disable_eager_execution()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

parser = argparse.ArgumentParser(
    description="TensorFlow 1 MNIST Example", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--steps", type=int, default=20000, help="training steps, divided among the ranks")
parser.add_argument("--batch-size", type=int, default=100, help="batch size per rank")
parser.add_argument("--lr", type=float, default=0.001, help="learning rate (scaled by the number of ranks)")
parser.add_argument("--data-dir", help="directory holding the MNIST idx files")
parser.add_argument("--synthetic-size", type=int, default=30000, help="examples of the synthetic stand-in")
parser.add_argument("--checkpoint-dir", default="./checkpoints", help="where rank 0 writes its checkpoints")
parser.add_argument(
    "--seed",
    type=int,
    help="seed of the initial weights, dropout and batches (default: unseeded, as Horovod's example)",
)
args = parser.parse_args()


def _weights(name, shape):
    return tf.compat.v1.get_variable(
        name, shape, initializer=tf.compat.v1.glorot_uniform_initializer(), dtype=tf.float32
    )


def _bias(name, n):
    return tf.compat.v1.get_variable(name, [n], initializer=tf.compat.v1.zeros_initializer(), dtype=tf.float32)


def conv_model(feature, target, keep_prob):
    """2-layer convolution model (tf.compat.v1.layers needs Keras 2, so the
    layers are written with tf.nn and tf.compat.v1.get_variable)."""
    # Convert the target to a one-hot tensor of shape (batch_size, 10) and
    # with a on-value of 1 for each one-hot vector of length 10.
    target = tf.one_hot(tf.cast(target, tf.int32), 10, 1.0, 0.0)

    # Reshape feature to 4d tensor with 2nd and 3rd dimensions being
    # image width and height final dimension being the number of color channels.
    feature = tf.reshape(feature, [-1, 28, 28, 1])

    # First conv layer will compute 32 features for each 5x5 patch
    with tf.compat.v1.variable_scope("conv_layer1"):
        h = tf.nn.conv2d(feature, _weights("kernel", [5, 5, 1, 32]), 1, "SAME") + _bias("bias", 32)
        h_pool1 = tf.nn.max_pool2d(tf.nn.relu(h), ksize=2, strides=2, padding="SAME")

    # Second conv layer will compute 64 features for each 5x5 patch.
    with tf.compat.v1.variable_scope("conv_layer2"):
        h = tf.nn.conv2d(h_pool1, _weights("kernel", [5, 5, 32, 64]), 1, "SAME") + _bias("bias", 64)
        h_pool2 = tf.nn.max_pool2d(tf.nn.relu(h), ksize=2, strides=2, padding="SAME")
        # reshape tensor into a batch of vectors
        h_pool2_flat = tf.reshape(h_pool2, [-1, 7 * 7 * 64])

    # Densely connected layer with 1024 neurons.
    with tf.compat.v1.variable_scope("fc1"):
        h_fc1 = tf.nn.relu(tf.matmul(h_pool2_flat, _weights("kernel", [7 * 7 * 64, 1024])) + _bias("bias", 1024))
        h_fc1 = tf.nn.dropout(h_fc1, rate=1 - keep_prob)

    # Compute logits (1 per class) and compute loss.
    with tf.compat.v1.variable_scope("fc2"):
        logits = tf.matmul(h_fc1, _weights("kernel", [1024, 10])) + _bias("bias", 10)
    loss = tf.compat.v1.losses.softmax_cross_entropy(target, logits)

    return tf.argmax(logits, 1), loss


def train_input_generator(x_train, y_train, batch_size=64):
    assert len(x_train) == len(y_train)
    while True:
        p = np.random.permutation(len(x_train))
        x_train, y_train = x_train[p], y_train[p]
        index = 0
        while index <= len(x_train) - batch_size:
            yield x_train[index : index + batch_size], y_train[index : index + batch_size]
            index += batch_size


def main():
    # Horovod: initialize Horovod.
    hvd.init()

    (x_train, y_train), _, source = mnist_data.load(args.data_dir, args.synthetic_size)
    if hvd.rank() == 0:
        print(f"MNIST: {source}, {len(x_train)} training images", flush=True)

    # The shape of downloaded data is (-1, 28, 28), hence we need to reshape it
    # into (-1, 784) to feed into our network. Also, need to normalize the
    # features between 0 and 1.
    x_train = np.reshape(x_train, (-1, 784)) / 255.0

    if args.seed is not None:
        # The graph's ops (initial weights, dropout) and each rank's batches.
        tf.compat.v1.set_random_seed(args.seed)
        np.random.seed(args.seed + hvd.rank())

    # Build model...
    with tf.name_scope("input"):
        image = tf.compat.v1.placeholder(tf.float32, [None, 784], name="image")
        label = tf.compat.v1.placeholder(tf.float32, [None], name="label")
    predict, loss = conv_model(image, label, 0.5)

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.compat.v1.train.AdamOptimizer(args.lr * hvd.size())

    # Horovod: add Horovod Distributed Optimizer.
    opt = hvd.DistributedOptimizer(opt)

    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=global_step)

    hooks = [
        # Horovod: BroadcastGlobalVariablesHook broadcasts initial variable states
        # from rank 0 to all other processes. This is necessary to ensure consistent
        # initialization of all workers when training is started with random weights
        # or restored from a checkpoint.
        hvd.BroadcastGlobalVariablesHook(0),
        # Horovod: adjust number of steps based on number of GPUs.
        tf.compat.v1.train.StopAtStepHook(last_step=args.steps // hvd.size()),
        tf.compat.v1.train.LoggingTensorHook(tensors={"step": global_step, "loss": loss}, every_n_iter=10),
    ]

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    config = tf.compat.v1.ConfigProto()
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(hvd.local_rank())

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting them.
    checkpoint_dir = args.checkpoint_dir if hvd.rank() == 0 else None
    training_batch_generator = train_input_generator(x_train, y_train, batch_size=args.batch_size)
    # The MonitoredTrainingSession takes care of session initialization,
    # restoring from a checkpoint, saving to a checkpoint, and closing when done
    # or an error occurs.
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=checkpoint_dir, hooks=hooks, config=config
    ) as mon_sess:
        while not mon_sess.should_stop():
            # Run a training step synchronously.
            image_, label_ = next(training_batch_generator)
            mon_sess.run(train_op, feed_dict={image: image_, label: label_})


if __name__ == "__main__":
    main()
