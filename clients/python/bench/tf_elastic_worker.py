"""Elastic recovery worker in TensorFlow, for hvdd.tensorflow or, with
HVDD_BENCH_IMPL=horovod, horovod.tensorflow (bench/horovod/elastic_recovery.sh).

A tiny model trained with hvd.elastic.run, TensorFlowKerasState and
DistributedGradientTape, one commit per step. The last rank of the first
epoch prints ``KILL <time>`` and kills itself with SIGKILL at step KILL_AT
(with HVDD_BENCH_EXIT=raise it raises an exception instead, and its process
exits with status 1 through Python's exit path); the survivors print
``RECOVERED <time> size N`` when their step KILL_AT has completed at the new
size.

Usage: tf_elastic_worker.py STEPS KILL_AT
"""

import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

if os.environ.get("HVDD_BENCH_IMPL") == "horovod":
    import horovod.tensorflow as hvd
else:
    import hvdd.tensorflow as hvd

steps, kill_at = int(sys.argv[1]), int(sys.argv[2])
hvd.init()
victim = hvd.rank() == hvd.size() - 1
tf.random.set_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
model.build((None, 4))
opt = tf.keras.optimizers.SGD(0.05)
state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)


def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


@hvd.elastic.run
def train(state):
    while state.step < steps:
        if victim and state.step == kill_at:
            print(f"KILL {time.time():.6f}", flush=True)
            if os.environ.get("HVDD_BENCH_EXIT") == "raise":
                raise RuntimeError(f"rank {hvd.rank()} fails at step {state.step} (HVDD_BENCH_EXIT=raise)")
            os.kill(os.getpid(), signal.SIGKILL)
        g = tf.random.Generator.from_seed(1000 * state.step + hvd.rank())
        x = g.normal((8, 4))
        train_step(x, tf.reduce_sum(x, 1, keepdims=True) * 0.5)
        if state.step == kill_at:
            print(f"RECOVERED {time.time():.6f} size {hvd.size()}", flush=True)
        state.step += 1
        state.commit()


train(state)
print(f"DONE rank {hvd.rank()} size {hvd.size()}", flush=True)
