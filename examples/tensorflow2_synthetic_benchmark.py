#!/usr/bin/env python3
"""TensorFlow 2 synthetic benchmark, after Horovod's
examples/tensorflow2/tensorflow2_synthetic_benchmark.py: images/s of a Keras
application model trained on random data.

Through hvdd (the default), on 2 local processes:

    hvdd run -np 2 python examples/tensorflow2_synthetic_benchmark.py

The same script measures the peers it is compared with:

    --impl horovod   ``import horovod.tensorflow as hvd`` (run it under horovodrun)
    --impl mwms      tf.distribute.MultiWorkerMirroredStrategy, one process per
                     worker with TF_CONFIG set (see bench/horovod/run_tf.sh)

``--fit`` trains through ``model.fit`` with the Keras DistributedOptimizer
(hvdd.tensorflow.keras / horovod.tensorflow.keras, or the strategy's scope)
instead of a ``tf.function`` step with DistributedGradientTape.
"""

import argparse
import json
import os
import sys
import timeit

import numpy as np

parser = argparse.ArgumentParser(
    description="TensorFlow Synthetic Benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--impl", choices=["hvdd", "horovod", "mwms"], default="hvdd", help="who reduces the gradients")
parser.add_argument("--fit", action="store_true", default=False, help="train with model.fit")
parser.add_argument(
    "--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce"
)
parser.add_argument("--model", type=str, default="ResNet50", help="model to benchmark (a keras.applications name)")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--image-size", type=int, default=224, help="input images are image-size x image-size x 3")
parser.add_argument("--num-classes", type=int, default=1000, help="number of classes")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--threads", type=int, default=0, help="TensorFlow intra- and inter-op threads (0: TF's default)")
parser.add_argument("--eager", action="store_true", default=False, help="enables eager execution")
args = parser.parse_args()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

strategy = None
if args.impl == "hvdd":
    import hvdd.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
elif args.impl == "horovod":
    import horovod.tensorflow as hvd  # type: ignore[no-redef]

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
else:
    hvd = None
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
    rank = int(cfg.get("task", {}).get("index", 0))
    size = strategy.num_replicas_in_sync

gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus and hvd is not None:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def log(s: str, nl: bool = True) -> None:
    if rank != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


def optimizer_variables(opt):
    """Keras 3 has a list property, Keras 2 a method."""
    v = opt.variables
    return v() if callable(v) else v


def make_model():
    return getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=args.num_classes
    )


scope = strategy.scope() if strategy is not None else None
if scope is not None:
    scope.__enter__()
model = make_model()
opt = tf.optimizers.SGD(0.01)
if scope is not None:
    scope.__exit__(None, None, None)

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=args.num_classes - 1, dtype=tf.int64)

if args.fit:
    if args.impl == "mwms":
        with strategy.scope():
            model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        callbacks = []
        if hasattr(model, "_maybe_symbolic_build"):
            # Keras 3's fit builds the model from the first distributed batch, which it
            # averages with strategy.reduce over the (x, y) tuple; MultiWorkerMirroredStrategy
            # refuses nested structures there ("Attempt to convert a value (PerReplica...)
            # to a Tensor"; keras-team/keras#20585, tensorflow/tensorflow#72388). Build
            # from the local batch instead: it has the per-replica shapes.
            def _build_from_local_batch(iterator=None, data_batch=None):
                with strategy.scope():
                    model._symbolic_build(data_batch=(data, target))

            model._maybe_symbolic_build = _build_from_local_batch
            # It then averages the step's logs across workers with
            # strategy.reduce("MEAN", v, axis=0), which fails on the scalar loss ("Invalid
            # reduction dimension 0 for input with 0 dimensions"): hand it shape-[1] logs.
            # (Keras 2 sums them across workers, so both do one small allreduce a step.)
            keras_train_step = model.train_step

            def train_step(batch):
                return {k: tf.reshape(v, [1]) for k, v in keras_train_step(batch).items()}

            model.train_step = train_step
    else:
        if args.impl == "hvdd":
            import hvdd.tensorflow.keras as hvd_keras
        else:
            import horovod.tensorflow.keras as hvd_keras  # type: ignore[no-redef]
        compression = hvd_keras.Compression.fp16 if args.fp16_allreduce else hvd_keras.Compression.none
        model.compile(
            optimizer=hvd_keras.DistributedOptimizer(opt, compression=compression),
            loss="sparse_categorical_crossentropy",
            run_eagerly=args.eager,
        )
        callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)]

    class Timer(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times = []
            self.t0 = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = timeit.default_timer()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(timeit.default_timer() - self.t0)

    ds = tf.data.Dataset.from_tensors((data, target)).repeat()
    if args.impl == "mwms":
        # model.fit under the strategy takes the global batch (every worker reads the
        # same dataset, no sharding) and splits it, batch-size images per replica.
        global_batch = (tf.concat([data] * size, 0), tf.concat([target] * size, 0))
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = tf.data.Dataset.from_tensor_slices(global_batch).repeat()
        ds = ds.batch(args.batch_size * size, drop_remainder=True).with_options(opts)
    timer = Timer()
    log(f"Model: {args.model}, batch size: {args.batch_size}, ranks: {size}, impl: {args.impl} (model.fit)")
    log("Running warmup...")
    model.fit(ds, steps_per_epoch=args.num_warmup_batches, epochs=1, verbose=0, callbacks=callbacks)
    log("Running benchmark...")
    model.fit(
        ds,
        steps_per_epoch=args.num_batches_per_iter,
        epochs=args.num_iters,
        verbose=0,
        callbacks=callbacks + [timer],
    )
    img_secs = [args.batch_size * args.num_batches_per_iter / t for t in timer.times]
    for i, v in enumerate(img_secs):
        log("Iter #%d: %.1f img/sec per rank" % (i, v))
else:
    if args.impl == "mwms":

        def replica_step():
            with tf.GradientTape() as tape:
                probs = model(data, training=True)
                loss = tf.reduce_sum(tf.losses.sparse_categorical_crossentropy(target, probs)) / (
                    args.batch_size * size
                )
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        @tf.function
        def benchmark_step(first_batch):
            strategy.run(replica_step)

    else:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

        @tf.function
        def benchmark_step(first_batch):
            # Horovod: use DistributedGradientTape
            with tf.GradientTape() as tape:
                probs = model(data, training=True)
                loss = tf.losses.sparse_categorical_crossentropy(target, probs)

            # Horovod: add Horovod Distributed GradientTape.
            tape = hvd.DistributedGradientTape(tape, compression=compression)

            gradients = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(gradients, model.trainable_variables))

            # Horovod: broadcast initial variable states from rank 0 to all other processes.
            # This is necessary to ensure consistent initialization of all workers when
            # training is started with random weights or restored from a checkpoint.
            #
            # Note: broadcast should be done after the first gradient step to ensure optimizer
            # initialization.
            if first_batch:
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)

    if args.eager:
        benchmark_step = benchmark_step.python_function

    log(f"Model: {args.model}, batch size: {args.batch_size}, ranks: {size}, impl: {args.impl}")
    log("Running warmup...")
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per rank" % (x, img_sec))
        img_secs.append(img_sec)

# Results
img_sec_mean = np.mean(img_secs)
img_sec_median = np.median(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log("Img/sec per rank: %.1f +-%.1f (median %.1f)" % (img_sec_mean, img_sec_conf, img_sec_median))
log("Total img/sec on %d rank(s): %.1f +-%.1f" % (size, size * img_sec_mean, size * img_sec_conf))
sys.stdout.flush()
