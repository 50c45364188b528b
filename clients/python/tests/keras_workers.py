"""Keras worker scenarios run on every rank by test_keras.py
(``python keras_workers.py NAME``).

Training scenarios check the distributed result against a reference computed
in the same process with plain Keras on every rank's batches concatenated
(plain SGD makes the two the same up to float rounding); they exit non-zero
on the first failure. Scenarios whose expectations the test computes print
one ``RESULT <json>`` line. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdd.tensorflow as hvd_tf  # noqa: E402
import hvdd.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
BS = 4  # per-rank batch size


# --------------------------------------------------------------------------- helpers


def data(rank: int, steps: int, seed: int = 0, bs: int = BS) -> tuple[np.ndarray, np.ndarray]:
    """Rank-specific deterministic regression data: steps batches of bs rows."""
    rng = np.random.default_rng(1000 * seed + rank)
    x = rng.normal(size=(steps * bs, 4)).astype(np.float32)
    y = rng.normal(size=(steps * bs, 2)).astype(np.float32)
    return x, y


def joined(n: int, steps: int, per_batch: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's data, arranged so that batch k of size n*BS*per_batch holds
    every rank's batches k*per_batch .. k*per_batch+per_batch-1."""
    parts = [data(r, steps, seed) for r in range(n)]
    xs, ys = [], []
    for k in range(steps // per_batch):
        for r in range(n):
            lo, hi = k * per_batch * BS, (k + 1) * per_batch * BS
            xs.append(parts[r][0][lo:hi])
            ys.append(parts[r][1][lo:hi])
    return np.concatenate(xs), np.concatenate(ys)


def mlp(seed: int = 0, out: int = 2) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(out)])


def weights_of(model: keras.Model) -> list[np.ndarray]:
    return [np.array(w) for w in model.get_weights()]


def expect_close(got: list, want: list, what: str, tol: float = 1e-5) -> None:
    assert len(got) == len(want), (what, len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        if not np.allclose(g, w, rtol=tol, atol=tol):
            raise AssertionError(f"{what}: weight {i} differs by {np.abs(g - w).max()}\n{g}\nwant\n{w}")


def expect_same_on_all_ranks(ws: list, what: str) -> None:
    everyone = hvd_tf.allgather_object([np.asarray(w) for w in ws], name=f"same.{what}")
    for r, other in enumerate(everyone):
        expect_close(other, everyone[0], f"{what}: rank {r} vs rank 0", tol=0.0)


def expect_raises(exc: type, fn, what: str, contains: str = "") -> None:
    try:
        fn()
    except exc as e:
        assert contains in str(e), f"{what}: {e}"
    else:
        raise AssertionError(f"{what}: did not raise {exc.__name__}")


def reference_fit(init: list, n: int, steps: int, lr: float, per_batch: int = 1, seed: int = 0) -> list:
    """Plain Keras on the concatenated batches, from the same weights."""
    ref = mlp()
    ref.set_weights(init)
    ref.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    x, y = joined(n, steps, per_batch, seed)
    ref.fit(x, y, batch_size=n * BS * per_batch, epochs=1, shuffle=False, verbose=0)
    return weights_of(ref)


def distributed_fit(steps: int, lr: float, seed: int = 0, opt_cls=None, **kwargs) -> tuple[list, list, keras.Model]:
    r = hvd.rank()
    model = mlp()
    init = weights_of(model)
    base = (opt_cls or keras.optimizers.SGD)(lr)
    opt = hvd.DistributedOptimizer(base, **kwargs)
    model.compile(optimizer=opt, loss="mse")
    x, y = data(r, steps, seed)
    model.fit(x, y, batch_size=BS, epochs=1, shuffle=False, verbose=0)
    return init, weights_of(model), model


# --------------------------------------------------------------------------- scenarios


def optimizer() -> None:
    hvd.init()
    n = hvd.size()
    steps, lr = 6, 0.1

    init, got, model = distributed_fit(steps, lr)
    opt = model.optimizer
    assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD), type(opt)
    assert type(opt) is not keras.optimizers.SGD
    cfg = opt.get_config()
    assert keras.optimizers.SGD.from_config(cfg).get_config()["learning_rate"] == cfg["learning_rate"]
    assert not np.allclose(got[0], init[0]), "training did not change the weights"
    expect_close(got, reference_fit(init, n, steps, lr), "fit vs reference")
    expect_same_on_all_ranks(got, "fit")

    # Split averaging (predivide) and explicit groups reduce the same way.
    _, got2, _ = distributed_fit(steps, lr, gradient_predivide_factor=2.0)
    expect_close(got2, got, "gradient_predivide_factor=2")
    _, got3, _ = distributed_fit(steps, lr, groups=2)
    expect_close(got3, got, "groups=2")
    _, got4, _ = distributed_fit(steps, lr, op=hvd.Sum)
    expect_close(got4, reference_fit(init, n, steps, lr * n), "op=Sum (= Average at n x lr)")

    # A custom loop: apply_gradients reduces too, exactly once.
    m = mlp()
    m.set_weights(init)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr))
    x, y = data(hvd.rank(), 1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(m(x) - y))
    opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
    expect_close(weights_of(m), reference_fit(init, n, 1, lr), "custom loop apply_gradients")

    # hvdd.tensorflow.DistributedOptimizer hands Keras optimizers to this module.
    via_tf = hvd_tf.DistributedOptimizer(keras.optimizers.SGD(lr))
    assert getattr(type(via_tf), "_HVDD_DISTRIBUTED", False) and isinstance(via_tf, keras.optimizers.SGD)

    # Argument checks, as Horovod.
    sgd = keras.optimizers.SGD(lr)
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0), "pf")
    expect_raises(
        ValueError,
        lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True),
        "adasum",
        "Adasum",
    )
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Min), "min", "Average and Sum")
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0), "bpps")
    expect_raises(
        RuntimeError, lambda: hvd.broadcast_global_variables(0), "bgv eager", "BroadcastGlobalVariablesCallback"
    )
    hvd.shutdown()


def aggregation() -> None:
    hvd.init()
    n = hvd.size()
    steps, lr = 6, 0.1
    # Summed over 2 passes: one step of 2x lr on the 2 passes' joined batches.
    init, got, model = distributed_fit(steps, lr, backward_passes_per_step=2)
    assert int(model.optimizer.iterations.numpy()) == steps, model.optimizer.iterations
    expect_close(got, reference_fit(init, n, steps, 2 * lr, per_batch=2), "bpps=2 summed")
    expect_same_on_all_ranks(got, "bpps=2")
    # Averaged over the passes: lr on the joined batches.
    _, got, _ = distributed_fit(steps, lr, backward_passes_per_step=2, average_aggregated_gradients=True)
    expect_close(got, reference_fit(init, n, steps, lr, per_batch=2), "bpps=2 averaged")
    # Three passes, eagerly (run_eagerly): the same machinery without tf.function.
    model = mlp()
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(lr), backward_passes_per_step=3, average_aggregated_gradients=True
    )
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    x, y = data(hvd.rank(), steps)
    model.fit(x, y, batch_size=BS, epochs=1, shuffle=False, verbose=0)
    expect_close(weights_of(model), reference_fit(init, n, steps, lr, per_batch=3), "bpps=3 eager")
    hvd.shutdown()


def _embedding_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(10, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )


def sparse() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps, lr = 4, 0.5

    def ids(rank: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(7 + rank)
        return rng.integers(0, 10, size=(steps * BS, 3)).astype(np.int32), rng.normal(size=(steps * BS, 1)).astype(
            np.float32
        )

    # The embedding's gradient is an IndexedSlices (the sparse path is real).
    m = _embedding_model()
    x, y = ids(r)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(m(x[:BS]) - y[:BS]))
    g = tape.gradient(loss, m.trainable_variables)
    assert isinstance(g[0], tf.IndexedSlices), type(g[0])

    # Reference: every rank's batches joined.
    ref = _embedding_model()
    init = weights_of(ref)
    ref.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    parts = [ids(q) for q in range(n)]
    jx = np.concatenate([parts[q][0][s * BS : (s + 1) * BS] for s in range(steps) for q in range(n)])
    jy = np.concatenate([parts[q][1][s * BS : (s + 1) * BS] for s in range(steps) for q in range(n)])
    ref.fit(jx, jy, batch_size=n * BS, epochs=1, shuffle=False, verbose=0)
    want = weights_of(ref)

    for sad in (False, True):
        m = _embedding_model()
        m.set_weights(init)
        m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr), sparse_as_dense=sad), loss="mse")
        m.fit(x, y, batch_size=BS, epochs=1, shuffle=False, verbose=0)
        expect_close(weights_of(m), want, f"embedding sparse_as_dense={sad}")
        expect_same_on_all_ranks(weights_of(m), f"embedding{sad}")
    hvd.shutdown()


def compression() -> None:
    hvd.init()
    n = hvd.size()
    steps, lr = 6, 0.1
    init, got, _ = distributed_fit(steps, lr, compression=hvd.Compression.fp16)
    assert not np.allclose(got[0], init[0])
    expect_close(got, reference_fit(init, n, steps, lr), "fp16 vs fp32 reference", tol=2e-3)
    expect_same_on_all_ranks(got, "fp16")
    hvd.shutdown()


def broadcast() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = mlp(seed=10 + r)  # different initial weights on every rank
    sums = hvd_tf.allgather_object(float(sum(np.abs(w).sum() for w in model.get_weights())))
    assert len(set(sums)) == n, f"initial weights should differ: {sums}"
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    x, y = data(r, 3)
    model.fit(
        x,
        y,
        batch_size=BS,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    expect_same_on_all_ranks(weights_of(model), "weights after broadcast")
    opt_vars = [np.asarray(v) for v in model.optimizer.variables]
    assert len(opt_vars) > 2, opt_vars
    expect_same_on_all_ranks(opt_vars, "optimizer variables after broadcast")

    # local_variables are left alone.
    model = mlp(seed=20 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    local = model.layers[-1].trainable_weights
    before = [np.asarray(v) for v in local]
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=local)
    model.fit(x[:BS], y[:BS], batch_size=BS, epochs=1, verbose=0, callbacks=[cb])
    expect_close([np.asarray(v) for v in local], before, "local variables kept", tol=0.0)
    expect_same_on_all_ranks([np.asarray(v) for v in model.layers[0].trainable_weights], "non-local broadcast")

    # The numpy helpers.
    v = np.arange(4, dtype=np.float32) * (r + 1)
    want_sum = np.arange(4, dtype=np.float32) * sum(q + 1 for q in range(n))
    np.testing.assert_allclose(hvd.allreduce(v), want_sum / n)
    np.testing.assert_allclose(hvd.allreduce(v, op=hvd.Sum), want_sum)
    np.testing.assert_allclose(hvd.allreduce(v, average=False), want_sum)
    np.testing.assert_allclose(hvd.allreduce(v, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), want_sum)
    g = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int32))
    assert isinstance(g, np.ndarray) and g.shape == (n * (n + 1) // 2, 2), g
    b = hvd.broadcast(np.array([r, 7.0]), 1 % n)
    np.testing.assert_allclose(b, [1 % n, 7.0])
    rs = hvd.reducescatter(np.ones((2 * n, 3), dtype=np.float32) * (r + 1), op=hvd.Sum)
    np.testing.assert_allclose(rs, np.full((2, 3), n * (n + 1) / 2))
    hvd.shutdown()


class _Record(keras.callbacks.Callback):
    """Records logs at epoch end (a copy) and the optimizer's lr/momentum at
    every batch begin."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list = []
        self.batches: list = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))

    def on_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        lr = float(np.asarray(opt.learning_rate))
        mom = float(np.asarray(opt.momentum)) if hasattr(opt, "momentum") else None
        self.batches.append([batch, lr, mom])


def metric_average() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse", metrics=["mae"])
    x, y = data(r, 4)
    y = y * (1 + 3 * r)  # rank-dependent losses
    before, after = _Record(), _Record()
    hist = model.fit(
        x,
        y,
        batch_size=BS,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[before, hvd.callbacks.MetricAverageCallback(), after],
    )
    raw = hvd_tf.allgather_object(before.epochs)
    for e in range(2):
        for key in ("loss", "mae"):
            vals = [raw[q][e][key] for q in range(n)]
            assert len(set(vals)) == n, f"ranks should see different {key}: {vals}"
            mean = sum(vals) / n
            assert abs(after.epochs[e][key] - mean) <= 1e-6 * max(1.0, abs(mean)), (key, after.epochs[e][key], mean)
            assert abs(hist.history[key][e] - mean) <= 1e-6 * max(1.0, abs(mean)), (key, hist.history[key][e], mean)
    hvd.shutdown()


def lr_schedule() -> None:
    hvd.init()
    r = hvd.rank()
    x, y = data(r, 4)
    out = {}
    # Staircase, constant multiplier, momentum correction.
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3, momentum=0.9)), loss="mse")
    rec = _Record()
    cb = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5, start_epoch=1, end_epoch=3)
    model.fit(x, y, batch_size=BS, epochs=4, shuffle=False, verbose=0, callbacks=[cb, rec])
    out["staircase"] = rec.batches
    out["staircase_logs"] = [e["lr"] for e in rec.epochs]
    # Smooth (per batch), callable multiplier, steps autodetected.
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.3)), loss="mse")
    rec = _Record()
    cb = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.2, multiplier=lambda epoch: 1.0 / (1.0 + epoch), staircase=False
    )
    model.fit(x, y, batch_size=BS, epochs=2, shuffle=False, verbose=0, callbacks=[cb, rec])
    out["smooth"] = rec.batches
    if r == 0:
        print("RESULT " + json.dumps(out))
    hvd.shutdown()


def lr_warmup() -> None:
    hvd.init()
    r = hvd.rank()
    x, y = data(r, 4)
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.5)), loss="mse")
    rec = _Record()
    cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=2, verbose=1)
    model.fit(x, y, batch_size=BS, epochs=3, shuffle=False, verbose=0, callbacks=[cb, rec])
    if r == 0:
        print("RESULT " + json.dumps({"batches": rec.batches, "logs": [e["lr"] for e in rec.epochs]}))
    hvd.shutdown()


class _FakeMetric(keras.callbacks.Callback):
    """Writes a scripted value of 'score' into the epoch's logs."""

    def __init__(self, values: list) -> None:
        super().__init__()
        self.values = values

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.values[epoch]


def checkpoint() -> None:
    hvd.init()
    r = hvd.rank()
    scores = [3.0, 1.0, 2.0, 0.5, 0.7]
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x, y = data(r, 2)
    d = os.path.abspath("ckpt")
    os.makedirs(d, exist_ok=True)
    callbacks = [_FakeMetric(scores), hvd.callbacks.MetricAverageCallback()]
    if r == 0:
        callbacks.append(
            hvd.callbacks.BestModelCheckpoint(
                monitor="score", mode="min", filepath=os.path.join(d, "best-{epoch}.keras")
            )
        )
    model.fit(x, y, batch_size=BS, epochs=len(scores), shuffle=False, verbose=0, callbacks=callbacks)
    hvd_tf.broadcast_object(0, root_rank=0, name="saved")  # rank 0 has finished saving
    files = sorted(os.listdir(d))
    assert files == ["best-1.keras", "best-2.keras", "best-4.keras"], files
    # Horovod's form: no path until set.
    cb = hvd.callbacks.BestModelCheckpoint()
    assert cb.filepath is None and cb.save_best_only
    expect_raises(ValueError, lambda: model.fit(x, y, epochs=1, verbose=0, callbacks=[cb]), "no filepath", "filepath")
    hvd.shutdown()


def load_model() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps, lr = 4, 0.1
    init, _, model = distributed_fit(steps, lr)
    path = os.path.abspath("model.keras")
    if r == 0:
        model.save(path)
    hvd_tf.broadcast_object(0, root_rank=0, name="saved")

    loaded = hvd.load_model(path)
    opt = loaded.optimizer
    assert type(opt).__name__ == "SGD" and isinstance(opt, keras.optimizers.SGD), type(opt)
    assert getattr(type(opt), "_HVDD_DISTRIBUTED", False), "optimizer was not wrapped"
    assert int(np.asarray(opt.iterations)) == steps, opt.iterations
    expect_close(weights_of(loaded), weights_of(model), "loaded weights", tol=0.0)
    # Without hvdd the saved model loads into the plain optimizer.
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.SGD, type(plain.optimizer)

    # Training continues, distributed: compare with plain Keras on the joined batches.
    x, y = data(r, steps, seed=1)
    loaded.fit(x, y, batch_size=BS, epochs=1, shuffle=False, verbose=0)
    jx, jy = joined(n, steps, seed=1)
    plain.fit(jx, jy, batch_size=n * BS, epochs=1, shuffle=False, verbose=0)
    expect_close(weights_of(loaded), weights_of(plain), "continued training")
    expect_same_on_all_ranks(weights_of(loaded), "continued")

    # custom_optimizers and an .h5 file.
    class MySGD(keras.optimizers.SGD):
        pass

    m = mlp()
    m.compile(optimizer=MySGD(lr), loss=keras.losses.MeanSquaredError())
    h5 = os.path.abspath(f"model{r}.h5")
    m.save(h5)
    got = hvd.load_model(h5, custom_optimizers=[MySGD], compression=hvd.Compression.fp16)
    assert type(got.optimizer).__name__ == "MySGD" and getattr(type(got.optimizer), "_HVDD_DISTRIBUTED", False)
    hvd.shutdown()


def legacy() -> None:
    """TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras; both its optimizers."""
    assert LEGACY and keras.__name__.startswith("tf_keras"), keras.__name__
    hvd.init()
    n = hvd.size()
    steps, lr = 6, 0.1
    for cls in (keras.optimizers.SGD, keras.optimizers.legacy.SGD):
        init, got, model = distributed_fit(steps, lr, opt_cls=cls)
        assert type(model.optimizer).__name__ == "SGD" and isinstance(model.optimizer, cls)
        assert not np.allclose(got[0], init[0])
        expect_close(got, reference_fit(init, n, steps, lr), f"tf_keras {cls.__module__}")
        expect_same_on_all_ranks(got, cls.__module__)
        _, got, _ = distributed_fit(steps, lr, opt_cls=cls, backward_passes_per_step=2)
        expect_close(got, reference_fit(init, n, steps, 2 * lr, per_batch=2), f"tf_keras bpps=2 {cls.__module__}")

    model = mlp(seed=hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(0.05, momentum=0.9)), loss="mse")
    x, y = data(hvd.rank(), 3)
    rec = _Record()
    cbs = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05, warmup_epochs=1),
        rec,
        hvd.callbacks.MetricAverageCallback(),
    ]
    model.fit(x, y, batch_size=BS, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
    expect_same_on_all_ranks(weights_of(model), "tf_keras broadcast")
    want = [0.05 / n * ((b + 1) / 3 * (n - 1) + 1) for b in range(3)]
    got = [lr for _, lr, _ in rec.batches]
    assert np.allclose(got, want, rtol=1e-6), (got, want)
    hvd.shutdown()


def mismatch() -> None:
    """Rank 1's model has another shape: every rank must raise, naming the
    tensor, instead of hanging."""
    hvd.init()
    r = hvd.rank()
    model = mlp(out=2 if r == 0 else 3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = data(r, 2)
    if r != 0:
        y = np.concatenate([y, y[:, :1]], axis=1)
    try:
        model.fit(x, y, batch_size=BS, epochs=1, verbose=0)
    except (hvd.HorovodInternalError, tf.errors.OpError) as e:
        msg = str(e)
        print("ERROR " + msg[msg.find("HvddInternalError") :][:600].replace("\n", " "))
        assert "Mismatched ALLREDUCE tensor shapes" in msg, msg
        # The daemon names the (grouped) gradient allreduce.
        assert 'tensor "grouped_allreduce.DistributedSGD_Allreduce/' in msg, msg
    else:
        raise AssertionError("mismatched models did not raise")
    # The job still works afterwards.
    np.testing.assert_allclose(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, float(hvd.size())))
    hvd.shutdown()


def victim() -> None:
    """The last rank dies in the middle of model.fit (SIGKILL at its third
    batch); the others' fit must raise, naming the lost rank, instead of
    hanging."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = data(r, 8)

    class Die(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if r == n - 1 and batch == 2:
                os.kill(os.getpid(), 9)

    try:
        model.fit(x, y, batch_size=BS, epochs=1, verbose=0, callbacks=[Die()])
    except (hvd.HorovodInternalError, tf.errors.OpError) as e:
        msg = str(e)
        assert f"rank {n - 1}" in msg and "lost" in msg, msg
        print("LOST " + msg[msg.find("HvddInternalError") :][:300].replace("\n", " "))
        return
    raise AssertionError("model.fit went on after a rank died")


def keras_package() -> None:
    """hvdd.keras on the keras package."""
    import keras as k3

    import hvdd.keras as hk

    assert not LEGACY
    hk.init()
    r, n = hk.rank(), hk.size()
    steps, lr = 4, 0.1
    k3.utils.set_random_seed(0)
    model = k3.Sequential([k3.Input((4,)), k3.layers.Dense(8, activation="tanh"), k3.layers.Dense(2)])
    init = weights_of(model)
    model.compile(optimizer=hk.DistributedOptimizer(k3.optimizers.SGD(lr)), loss="mse")
    x, y = data(r, steps)
    rec = _Record()
    model.fit(
        x,
        y,
        batch_size=BS,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0), hk.callbacks.MetricAverageCallback(), rec],
    )
    expect_close(weights_of(model), reference_fit(init, n, steps, lr), "hvdd.keras fit")
    losses = hvd_tf.allgather_object(rec.epochs[0]["loss"])
    assert len(set(losses)) == 1, losses
    # PartialDistributedOptimizer: the last layer stays local (its gradient / n).
    k3.utils.set_random_seed(0)
    model = k3.Sequential([k3.Input((4,)), k3.layers.Dense(8, activation="tanh"), k3.layers.Dense(2)])
    opt = hk.PartialDistributedOptimizer(k3.optimizers.SGD(lr), local_layers=[model.layers[-1]])
    model.compile(optimizer=opt, loss="mse")
    model.fit(x[:BS], y[:BS], batch_size=BS, epochs=1, shuffle=False, verbose=0)
    ws = hvd_tf.allgather_object(weights_of(model))
    expect_close(ws[0][:2], ws[-1][:2], "partial: shared layer identical", tol=0.0)
    if n > 1:
        assert not np.allclose(ws[0][2], ws[-1][2]), "partial: local layer should differ"
    # The local layer's step is its own gradient / n.
    ref = k3.Sequential([k3.Input((4,)), k3.layers.Dense(8, activation="tanh"), k3.layers.Dense(2)])
    ref.set_weights(init)
    ref.compile(optimizer=k3.optimizers.SGD(lr / n), loss="mse")
    ref.fit(x[:BS], y[:BS], batch_size=BS, epochs=1, shuffle=False, verbose=0)
    expect_close(weights_of(model)[2:], weights_of(ref)[2:], "partial: local layer step")
    hk.shutdown()


def elastic() -> None:
    """hvd.elastic on a real job: KerasState.sync gives every rank rank 0's
    weights and values; @hvd.elastic.run with the state callbacks trains,
    commits every batch and counts epochs; a failed first attempt (every
    rank, HOROVOD_ELASTIC=1) is restored, the job re-formed, and fit resumes
    for the epochs left."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps = 3
    model = mlp(seed=r)  # different weights on every rank
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, batch=0, epoch=r)
    state.sync()
    expect_same_on_all_ranks(weights_of(model), "weights after sync")
    assert (state.epoch, state.batch) == (0, 0), (state.epoch, state.batch)
    x, y = data(r, steps)
    attempts = []

    class FailOnce(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if len(attempts) == 1 and epoch == 1:
                raise hvd.HorovodInternalError("simulated loss of a rank")

    @hvd.elastic.run
    def train(state):
        attempts.append(state.epoch)
        callbacks = [
            hvd.elastic.CommitStateCallback(state),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            FailOnce(),
        ]
        model.fit(x, y, batch_size=BS, epochs=3 - state.epoch, shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
    # The first attempt committed epoch 1 (at its end) and failed in epoch 2;
    # the second resumed there.
    assert attempts == [0, 1] and (state.epoch, state.batch) == (3, 0), (attempts, state.epoch, state.batch)
    expect_same_on_all_ranks(weights_of(model), "weights after training")
    hvd.shutdown()


SCENARIOS = {
    f.__name__: f
    for f in (
        optimizer,
        aggregation,
        sparse,
        compression,
        broadcast,
        metric_average,
        lr_schedule,
        lr_warmup,
        checkpoint,
        load_model,
        legacy,
        mismatch,
        victim,
        keras_package,
        elastic,
    )
}

if __name__ == "__main__":
    # NAME or NAME,NAME,...: several scenarios in one job, one after the
    # other (each init()s and shut()s down), so that TensorFlow's import
    # (3-4 CPU-seconds a rank) is paid once; each one done prints
    # "SCENARIO NAME OK", and the first failure ends the job.
    for name in sys.argv[1].split(","):
        sys.stdout.write(f"BEGIN {name}\n")
        SCENARIOS[name]()
        keras.backend.clear_session()
        sys.stdout.write(f"SCENARIO {name} OK\n")
    sys.stdout.write("OK\n")
