"""TensorFlow worker scenarios run on every rank by test_tensorflow.py
(``python tf_workers.py NAME[,NAME...] [MODE[,MODE...]]``).

Each scenario builds its collectives once and runs them in one of three
modes: ``eager``, ``function`` (inside ``tf.function``) or ``graph`` (a TF1
graph run by a ``tf.compat.v1.Session``). Results are checked against
references computed here from every rank's deterministic inputs; the first
failure exits non-zero. Nothing here imports torch.

``eager,function`` runs the scenario in eager mode, then again inside
``tf.function``, in one process (one TensorFlow import per rank where two
jobs took two); ``graph`` disables eager execution for the whole process, so
it runs alone.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MODES = (sys.argv[2] if len(sys.argv) > 2 else "eager").split(",")
if "graph" in MODES and len(MODES) > 1:
    raise SystemExit(f"tf_workers.py: graph mode runs alone (TF1 graphs disable eager execution), not in {MODES}")
MODE = MODES[0]
if MODE == "graph":
    tf.compat.v1.disable_eager_execution()

import hvdd.tensorflow as hvd  # noqa: E402

DTYPES = [
    tf.uint8,
    tf.int8,
    tf.uint16,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
]
FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def data(rank: int, dtype: tf.DType, shape=(3, 4), seed: int = 0) -> np.ndarray:
    """Rank-specific deterministic input with small values (no overflow), as
    float64 (bool as 0/1)."""
    g = np.random.default_rng(1000 * seed + rank)
    if dtype == tf.bool:
        return g.integers(0, 2, shape).astype(np.float64)
    if dtype in FLOATS:
        return g.integers(-8, 9, shape) / 4.0
    lo = 0 if dtype in (tf.uint8, tf.uint16) else -3
    return g.integers(lo, 4, shape).astype(np.float64)


def reference_reduce(xs: list, op: int, dtype: tf.DType, n: int, pre: float = 1.0, post: float = 1.0) -> np.ndarray:
    if dtype == tf.bool:
        st = np.stack(xs) != 0
        return (st.any(0) if op in (hvd.Sum, hvd.Max, hvd.Average) else st.all(0)).astype(np.float64)
    x = [a * pre for a in xs]
    if op in (hvd.Sum, hvd.Average):
        r = np.sum(x, axis=0)
    elif op == hvd.Min:
        r = np.min(x, axis=0)
    elif op == hvd.Max:
        r = np.max(x, axis=0)
    else:
        r = np.prod(x, axis=0)
    r = r * (post / n if op == hvd.Average else post)
    if dtype not in FLOATS:
        r = np.trunc(r)
    return r


def tol(dtype: tf.DType) -> float:
    return {tf.float16: 1e-2, tf.bfloat16: 5e-2}.get(dtype, 1e-6)


def check(got: Any, want: Any, what: str, t: float = 0.0) -> None:
    got = np.asarray(got, dtype=np.float64) if not isinstance(got, np.ndarray) else got.astype(np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, atol=t, rtol=t):
        raise AssertionError(f"{what}: got\n{got}\nwant\n{want}")


def run(build: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """Builds the collectives and runs them in MODE; returns numpy values."""
    if MODE == "eager":
        out = build()
    elif MODE == "function":
        out = tf.function(build)()
    else:
        # Fewer inter-op threads than the graph has independent collectives:
        # no collective may hold one while it waits (hvdd/tensorflow/mpi_ops.py).
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
        with tf.compat.v1.Session(config=config) as s:
            out = build()
            s.run(tf.compat.v1.global_variables_initializer())
            return s.run(out)
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


def const(a: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    return tf.cast(tf.constant(a), dtype)


# ------------------------------------------------------------------ scenarios


def ops() -> None:
    """Every collective on every dtype it takes, against references."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    cases = []  # (key, dtype, reference)

    def build() -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        cases.clear()
        for dt in DTYPES:
            x = const(data(r, dt), dt)
            everyone = [data(q, dt) for q in range(n)]
            ops_ = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average]
            for op in ops_:
                if dt == tf.bool and op == hvd.Average:
                    continue
                k = f"allreduce/{dt.name}/{int(op)}"
                out[k] = hvd.allreduce(x, op=op, name=k)
                cases.append((k, dt, reference_reduce(everyone, op, dt, n)))
            if dt in FLOATS or dt in (tf.int32, tf.int64):
                k = f"scaled/{dt.name}"
                out[k] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name=k)
                want = reference_reduce(everyone, hvd.Sum, dt, n, 0.5, 3.0)
                if dt not in FLOATS:  # integer scaling: int(fp64(x) * f) per rank, as Horovod
                    want = np.trunc(np.sum([np.trunc(a * 0.5) for a in everyone], 0) * 3.0)
                cases.append((k, dt, want))
            # allgather with a first dimension that differs per rank
            k = f"allgather/{dt.name}"
            out[k] = hvd.allgather(const(data(r, dt, (r + 1, 2)), dt), name=k)
            cases.append((k, dt, np.concatenate([data(q, dt, (q + 1, 2)) for q in range(n)])))
            k = f"broadcast/{dt.name}"
            out[k] = hvd.broadcast(x, root_rank=n - 1, name=k)
            cases.append((k, dt, everyone[n - 1]))
            k = f"alltoall/{dt.name}"
            out[k] = hvd.alltoall(const(data(r, dt, (2 * n, 3)), dt), name=k)
            cases.append((k, dt, np.concatenate([data(q, dt, (2 * n, 3))[2 * r : 2 * r + 2] for q in range(n)])))
        # Two unnamed collectives of one tensor in one graph get distinct names.
        x2 = const(data(r, tf.float32, seed=3), tf.float32)
        out["twice/sum"], out["twice/max"] = hvd.allreduce(x2, op=hvd.Sum), hvd.allreduce(x2, op=hvd.Max)
        everyone2 = [data(q, tf.float32, seed=3) for q in range(n)]
        cases.append(("twice/sum", tf.float32, reference_reduce(everyone2, hvd.Sum, tf.float32, n)))
        cases.append(("twice/max", tf.float32, reference_reduce(everyone2, hvd.Max, tf.float32, n)))
        # grouped allreduce: one node, several tensors
        xs = [const(data(r, tf.float32, (i + 2,), seed=i), tf.float32) for i in range(3)]
        for i, y in enumerate(hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")):
            out[f"grouped/{i}"] = y
            cases.append((f"grouped/{i}", tf.float32, sum(data(q, tf.float32, (i + 2,), seed=i) for q in range(n))))
        for i, y in enumerate(
            hvd.grouped_allgather([const(data(r, tf.int32, (r + 1,), seed=i), tf.int32) for i in range(2)])
        ):
            out[f"grouped_allgather/{i}"] = y
            want = np.concatenate([data(q, tf.int32, (q + 1,), seed=i) for q in range(n)])
            cases.append((f"grouped_allgather/{i}", tf.int32, want))
        # alltoall with splits: rank r sends q+1 rows to rank q
        rows = sum(q + 1 for q in range(n))
        a2a_in = const(data(r, tf.float32, (rows, 2), seed=5), tf.float32)
        got, rsp = hvd.alltoall(a2a_in, splits=[q + 1 for q in range(n)], name="a2a_splits")
        out["a2a_splits"], out["a2a_recv"] = got, rsp
        start = sum(q + 1 for q in range(r))
        cases.append(
            (
                "a2a_splits",
                tf.float32,
                np.concatenate([data(q, tf.float32, (rows, 2), seed=5)[start : start + r + 1] for q in range(n)]),
            )
        )
        cases.append(("a2a_recv", tf.int32, np.full(n, r + 1)))
        # reducescatter, Sum and Average, uneven rows; grouped
        d0 = 2 * n + 1
        lo = sum(d0 // n + (1 if q < d0 % n else 0) for q in range(r))
        hi = lo + d0 // n + (1 if r < d0 % n else 0)
        for op in (hvd.Sum, hvd.Average):
            k = f"reducescatter/{int(op)}"
            out[k] = hvd.reducescatter(const(data(r, tf.float64, (d0, 2)), tf.float64), op=op, name=k)
            full = reference_reduce([data(q, tf.float64, (d0, 2)) for q in range(n)], op, tf.float64, n)
            cases.append((k, tf.float64, full[lo:hi]))
        g = hvd.grouped_reducescatter([const(data(r, tf.float32, (d0, 2), seed=7), tf.float32)], op=hvd.Sum)
        out["grouped_reducescatter"] = g[0]
        cases.append(
            (
                "grouped_reducescatter",
                tf.float32,
                sum(data(q, tf.float32, (d0, 2), seed=7) for q in range(n))[lo:hi],
            )
        )
        # IndexedSlices: allgathered values and indices, averaged values
        sl = tf.IndexedSlices(
            tf.constant(data(r, tf.float32, (2, 3), seed=9), tf.float32), tf.constant([r, 0], tf.int64), [n + 1, 3]
        )
        red = hvd.allreduce(sl, name="slices")
        out["slices/values"], out["slices/indices"] = red.values, red.indices
        cases.append(
            ("slices/values", tf.float32, np.concatenate([data(q, tf.float32, (2, 3), seed=9) for q in range(n)]) / n)
        )
        cases.append(("slices/indices", tf.int64, np.array([v for q in range(n) for v in (q, 0)])))
        # fp16 compression keeps the dtype and the values
        c = hvd.allreduce(const(data(r, tf.float32), tf.float32), op=hvd.Sum, compression=hvd.Compression.fp16)
        out["fp16"] = c
        cases.append(("fp16", tf.float32, sum(data(q, tf.float32) for q in range(n))))
        out["size_op"], out["rank_op"] = hvd.size_op(), hvd.rank_op()
        out["local_size_op"], out["local_rank_op"] = hvd.local_size_op(), hvd.local_rank_op()
        cases.extend([("size_op", tf.int32, n), ("rank_op", tf.int32, r), ("local_size_op", tf.int32, n)])
        cases.append(("local_rank_op", tf.int32, r))
        return out

    got = run(build)
    for k, dt, want in cases:
        check(got[k], want, f"{MODE} {k}", tol(dt))
        if k.startswith(("allreduce/", "broadcast/", "allgather/")):
            want_dt = dt.as_numpy_dtype
            if np.asarray(got[k]).dtype != np.dtype(want_dt):
                raise AssertionError(f"{MODE} {k}: dtype {np.asarray(got[k]).dtype}, want {np.dtype(want_dt)}")
    # Variables: broadcast_ in place, broadcast_variables; objects.
    if MODE == "graph":
        v = tf.compat.v1.Variable(np.full(3, float(r)), dtype=tf.float64)
        w = tf.compat.v1.Variable(np.full(2, float(r + 10)), dtype=tf.float32)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(hvd.broadcast_(v, root_rank=n - 1))
            s.run(hvd.broadcast_variables([w], root_rank=0))
            vv, wv = s.run([v, w])
            s.run(hvd.barrier())
            last = s.run(hvd.join())
    else:
        v = tf.Variable(np.full(3, float(r)), dtype=tf.float64)
        w = tf.Variable(np.full(2, float(r + 10)), dtype=tf.float32)
        hvd.broadcast_(v, root_rank=n - 1)
        hvd.broadcast_variables([w], root_rank=0)
        vv, wv = v.numpy(), w.numpy()
        # Eagerly, a plain tensor takes allreduce's fast path and a variable
        # the general one: both give a tensor of the value, on the device
        # the call runs on.
        for what, x in (("tensor", tf.constant([1.0, float(r)])), ("variable", tf.Variable([1.0, float(r)]))):
            with tf.device("/CPU:0"):
                y = hvd.allreduce(x, op=hvd.Sum, name=f"eager/{what}")
            if not isinstance(y, tf.Tensor) or "CPU:0" not in y.device:
                raise AssertionError(f"eager allreduce of a {what}: {type(y)} on {getattr(y, 'device', None)}")
            check(y.numpy(), np.array([n, n * (n - 1) / 2]), f"eager allreduce of a {what}")
        hvd.barrier()
        last = hvd.join().numpy()
    check(vv, np.full(3, n - 1.0), f"{MODE} broadcast_")
    check(wv, np.full(2, 10.0), f"{MODE} broadcast_variables")
    if not 0 <= int(last) < n:
        raise AssertionError(f"join returned {last}")
    obj = hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=n - 1)
    if obj != {"from": n - 1, "list": [n - 1] * 3}:
        raise AssertionError(f"broadcast_object: {obj}")
    if hvd.allgather_object(("rank", r)) != [("rank", q) for q in range(n)]:
        raise AssertionError("allgather_object")
    print(f"rank {r}: {MODE} ops ok ({len(cases)} checks)")


def grads() -> None:
    """Gradients of allreduce, allgather, broadcast (and alltoall,
    reducescatter), as Horovod registers them."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    x0 = data(r, tf.float64, (r + 1, 2))
    want: Dict[str, np.ndarray] = {}
    # reducescatter: uneven rows, a different upstream gradient on every rank
    d0 = 2 * n + 1
    rows = [d0 // n + (1 if q < d0 % n else 0) for q in range(n)]
    ups = [data(q, tf.float64, (rows[q], 2), seed=9) for q in range(n)]

    def build() -> Dict[str, Any]:
        x = tf.constant(x0)
        c = tf.constant(np.full((2, 3), r + 1.0))
        out = {}
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, c])
            # allreduce Sum: d/dc sum(w * allreduce(c)) = allreduce(w) = sum of ranks' w
            ar = hvd.allreduce(c * (r + 1), op=hvd.Sum)
            l_ar = tf.reduce_sum(ar * (r + 1))
            # allgather: rank r's slice of the averaged upstream gradient
            ag = hvd.allgather(x)
            weights = tf.reshape(tf.range(tf.shape(ag)[0] * 2, dtype=tf.float64), tf.shape(ag))
            l_ag = tf.reduce_sum(ag * weights * (r + 1))
            # broadcast: the averaged gradient on the root, zero elsewhere
            bc = hvd.broadcast(c, root_rank=0)
            l_bc = tf.reduce_sum(bc * (r + 2))
            # average allreduce: the gradient is averaged too
            av = hvd.allreduce(c)
            l_av = tf.reduce_sum(av * (r + 1))
            # reducescatter: Horovod's gradient, the upstream one times the
            # size for Sum and times the scale factors, allgathered
            rs_in = tf.constant(data(r, tf.float64, (d0, 2), seed=8))
            tape.watch(rs_in)
            l_rs = tf.reduce_sum(hvd.reducescatter(rs_in, op=hvd.Sum) * ups[r])
            rsa = hvd.reducescatter(rs_in, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0)
            l_rsa = tf.reduce_sum(rsa * ups[r])
        out["rs"] = tape.gradient(l_rs, rs_in)
        out["rsa"] = tape.gradient(l_rsa, rs_in)
        out["ar"] = tape.gradient(l_ar, c)
        out["ag"] = tape.gradient(l_ag, x)
        out["bc"] = tape.gradient(l_bc, c)
        out["av"] = tape.gradient(l_av, c)
        return out

    sum_w = sum(q + 1 for q in range(n))
    want["ar"] = np.full((2, 3), float(sum_w) * (r + 1))
    total_rows = sum(q + 1 for q in range(n))
    w_all = np.arange(total_rows * 2, dtype=np.float64).reshape(total_rows, 2) * sum_w / n
    start = sum(q + 1 for q in range(r))
    want["ag"] = w_all[start : start + r + 1]
    want["bc"] = np.full((2, 3), sum(q + 2 for q in range(n)) / n) if r == 0 else np.zeros((2, 3))
    want["av"] = np.full((2, 3), sum_w / n)
    want["rs"] = np.concatenate(ups) * n
    want["rsa"] = np.concatenate(ups) * 1.5
    got = run(build)
    for k, w in want.items():
        check(got[k], w, f"{MODE} grad {k}", 1e-9)
    print(f"rank {r}: {MODE} grads ok")


def allgather_grads() -> None:
    """The gradients of allgather and grouped_allgather, as Horovod 0.28.1's
    ``_allgather_grad`` / ``_grouped_allgather_grad`` define them: the
    upstream gradient averaged over the ranks (an ``op=Average`` allreduce),
    split by the gathered first dimensions, this rank's piece (older Horovod
    summed instead: N times larger). The ranks contribute different first
    dimensions and a different upstream gradient each; every value is a
    multiple of 1/4, so the expected gradients are exact in float64."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    rows = [3 - q % 3 for q in range(n)]  # 3, 2, 1, 3: not all the same
    total, start = sum(rows), sum(rows[:r])
    xs = [data(q, tf.float64, (rows[q], 2), seed=31) for q in range(n)]
    ys = [data(q, tf.float64, (rows[q], 3), seed=32) for q in range(n)]
    # each rank's upstream gradient of the gathered tensors
    up_x = [data(q, tf.float64, (total, 2), seed=33) for q in range(n)]
    up_y = [data(q, tf.float64, (total, 3), seed=34) for q in range(n)]

    def build() -> Dict[str, Any]:
        x, a, b = tf.constant(xs[r]), tf.constant(xs[r]), tf.constant(ys[r])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, a, b])
            ag = hvd.allgather(x)
            l_ag = tf.reduce_sum(ag * up_x[r])
            ga, gb = hvd.grouped_allgather([a, b])
            l_g = tf.reduce_sum(ga * up_x[r]) + tf.reduce_sum(gb * up_y[r])
        d_ga, d_gb = tape.gradient(l_g, [a, b])
        return {"ag": ag, "ga": ga, "gb": gb, "d_ag": tape.gradient(l_ag, x), "d_ga": d_ga, "d_gb": d_gb}

    # Horovod 0.28.1: Average-allreduce of the upstream gradients, then
    # tf.split(grad, gathered first dimensions)[rank]
    mean_x = np.sum(up_x, axis=0) / n
    mean_y = np.sum(up_y, axis=0) / n
    want = {
        "ag": np.concatenate(xs),
        "ga": np.concatenate(xs),
        "gb": np.concatenate(ys),
        "d_ag": mean_x[start : start + rows[r]],
        "d_ga": mean_x[start : start + rows[r]],
        "d_gb": mean_y[start : start + rows[r]],
    }
    got = run(build)
    for k, w in want.items():
        check(got[k], w, f"{MODE} allgather grads {k} (rank {r} of {n})")
    print(f"rank {r}: {MODE} allgather grads ok")


def _linear_data(rank: int, step: int, bs: int = 4) -> tuple:
    g = np.random.default_rng(100 * step + rank)
    x = g.normal(size=(bs, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1).astype(np.float32)
    return x, y


def tape() -> None:
    """DistributedGradientTape on 2 ranks ends with the weights of one process
    training on both ranks' batches (eager and tf.function; groups; an
    embedding's IndexedSlices gradient with and without sparse_as_dense)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps, lr = 4, 0.1

    def train(distributed: bool, fn: bool, **kw: Any) -> list:
        # Initial values differ per rank (the broadcast makes them rank 0's);
        # the reference starts from rank 0's.
        k = r + 1 if distributed else 1
        w = tf.Variable(np.full((3, 1), 0.3 * k, np.float32))
        b = tf.Variable(np.zeros(1, np.float32))
        emb = tf.Variable(np.ones((5, 2), np.float32) * k)
        if distributed:
            hvd.broadcast_variables([w, b, emb], root_rank=0)

        def step(x: tf.Tensor, y: tf.Tensor, ids: tf.Tensor) -> None:
            with tf.GradientTape() as t:
                pred = tf.matmul(x, w) + b
                e = tf.reduce_sum(tf.gather(emb, ids), axis=1, keepdims=True)
                loss = tf.reduce_mean((pred + 0.01 * e - y) ** 2)
            if distributed:
                t = hvd.DistributedGradientTape(t, **kw)
            gs = t.gradient(loss, [w, b, emb])
            for v, g in zip([w, b, emb], gs):
                v.assign_sub(lr * tf.convert_to_tensor(g))

        f = tf.function(step) if fn else step
        for s in range(steps):
            if distributed:
                x, y = _linear_data(r, s)
                ids = np.array([r, s % 5, 4, 1], np.int32)
            else:  # one process on every rank's batch
                xs, ys = zip(*[_linear_data(q, s) for q in range(n)])
                x, y = np.concatenate(xs), np.concatenate(ys)
                ids = None
            if distributed:
                f(tf.constant(x), tf.constant(y), tf.constant(ids))
            else:
                # the reference: average of the per-rank mean losses' gradients
                with tf.GradientTape() as t:
                    loss = 0.0
                    for q in range(n):
                        xq, yq = _linear_data(q, s)
                        idq = tf.constant([q, s % 5, 4, 1], tf.int32)
                        pred = tf.matmul(xq, w) + b
                        e = tf.reduce_sum(tf.gather(emb, idq), axis=1, keepdims=True)
                        loss += tf.reduce_mean((pred + 0.01 * e - yq) ** 2) / n
                gs = t.gradient(loss, [w, b, emb])
                for v, g in zip([w, b, emb], gs):
                    v.assign_sub(lr * tf.convert_to_tensor(g))
        return [w.numpy(), b.numpy(), emb.numpy()]

    ref = train(False, False)
    for fn in (False, True):
        for kw in ({}, {"sparse_as_dense": True}, {"groups": 2}, {"compression": hvd.Compression.fp16}):
            got = train(True, fn, **kw)
            for i, (g, w_) in enumerate(zip(got, ref)):
                check(g, w_, f"tape fn={fn} {kw} var {i}", 1e-3 if kw.get("compression") else 1e-5)
    # PartialDistributedGradientTape: the local layer's gradient is this
    # rank's own, divided by the number of ranks; the others are averaged.
    dense = tf.keras.layers.Dense(1, kernel_initializer="ones")
    local = tf.keras.layers.Dense(1, kernel_initializer="ones")
    xin = tf.constant(np.full((2, 3), r + 1.0, np.float32))
    dense(xin), local(xin)
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(dense(xin)) + tf.reduce_sum(local(xin))
    t = hvd.PartialDistributedGradientTape(t, local_layers=[local])
    gd, gl = t.gradient(loss, [dense.kernel, local.kernel])
    check(gd, np.full((3, 1), 2.0 * sum(q + 1 for q in range(n)) / n), "partial tape: shared gradient", 1e-6)
    check(gl, np.full((3, 1), 2.0 * (r + 1) / n), "partial tape: local gradient", 1e-6)
    print(f"rank {r}: tape ok")


def tf1_optimizer() -> None:
    """TF1 DistributedOptimizer with MonitoredTrainingSession and
    BroadcastGlobalVariablesHook matches one process on every batch; with
    backward_passes_per_step=2 it applies the summed (or averaged) gradient
    every second pass."""
    tf.compat.v1.disable_eager_execution()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    lr, steps = 0.1, 4

    def reference(passes: int, average_aggregated: bool) -> np.ndarray:
        w = np.full((3, 1), 0.3, np.float64)  # rank 0's initial value
        acc = np.zeros_like(w)
        for s in range(steps):
            g = np.zeros_like(w)
            for q in range(n):
                x, y = (a.astype(np.float64) for a in _linear_data(q, s))
                g += 2 * x.T @ (x @ w - y) / len(x) / n
            acc += g
            if (s + 1) % passes == 0:
                w = w - lr * (acc / passes if average_aggregated else acc)
                acc[:] = 0
        return w

    for passes, avg in ((1, False), (2, False), (2, True)):
        with tf.Graph().as_default():
            config = tf.compat.v1.ConfigProto()
            config.gpu_options.visible_device_list = str(hvd.local_rank())
            x = tf.compat.v1.placeholder(tf.float32, [None, 3])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            w = tf.compat.v1.get_variable("w", initializer=np.full((3, 1), 0.3 * (r + 1), np.float32))
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
            opt = hvd.DistributedOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(lr),
                backward_passes_per_step=passes,
                average_aggregated_gradients=avg,
            )
            train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
            hooks = [hvd.BroadcastGlobalVariablesHook(0)]
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks, config=config) as sess:
                for s in range(steps):
                    xb, yb = _linear_data(r, s)
                    sess.run(train, feed_dict={x: xb, y: yb})
                got = sess.run(w)
        check(got, reference(passes, avg), f"tf1 optimizer passes={passes} avg={avg}", 1e-5)
    # broadcast_global_variables in a plain session
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=np.full(2, float(r), np.float32))
        bcast = hvd.broadcast_global_variables(1)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(bcast)
            check(s.run(v), np.full(2, 1.0), "broadcast_global_variables")
    print(f"rank {r}: tf1 optimizer ok")


def adasum_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two ranks' tensors (per tensor), in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ab = float(np.sum(a * b))
    return (1 - ab / (2 * float(np.sum(a * a)))) * a + (1 - ab / (2 * float(np.sum(b * b)))) * b


def adasum() -> None:
    """op=hvd.Adasum on 2 ranks: allreduce, DistributedGradientTape's
    gradients and the TF1 delta DistributedOptimizer (also with
    backward_passes_per_step=2) match the Adasum formula computed here; the
    Keras optimizers refuse Adasum as Horovod 0.28.1 does. On 3 ranks every
    Adasum path refuses with Horovod's message."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    xs = [data(q, tf.float32, (5,), seed=7) + 0.5 for q in range(n)]
    if n & (n - 1):
        sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        w = tf.Variable(tf.ones([3]))
        for bad, what in (
            (lambda: hvd.allreduce(tf.constant(xs[r]), op=hvd.Adasum), "allreduce"),
            (lambda: hvd.grouped_allreduce([tf.constant(xs[r])], op=hvd.Adasum), "grouped_allreduce"),
            (lambda: _adasum_tape_grads(w, r), "DistributedGradientTape"),
            (lambda: _adasum_tf1_eager(sgd, w, r), "TF1 DistributedOptimizer"),
        ):
            try:
                bad()
            except NotImplementedError as e:
                if "Running Adasum with non-power of 2 ranks is not supported yet." not in str(e):
                    raise
            else:
                raise AssertionError(f"{what}: Adasum on {n} ranks did not raise")
        got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after_adasum")
        check(got, np.full(2, float(n)), "allreduce after the Adasum refusals")
        print(f"rank {r}: adasum refused on {n} ranks")
        return
    assert n == 2, n
    want = adasum_ref(xs[0], xs[1])
    got = run(lambda: {"x": hvd.allreduce(tf.constant(xs[r], tf.float32), op=hvd.Adasum, name="ada")})
    check(got["x"], want, f"{MODE} allreduce Adasum", 1e-5)
    # Not a sum nor an average: the test would catch either.
    assert not np.allclose(want, xs[0] + xs[1]) and not np.allclose(want, (xs[0] + xs[1]) / 2)

    # DistributedGradientTape(op=Adasum): each variable's gradient is the
    # Adasum of the ranks' gradients of that variable.
    def tape_grads() -> Dict[str, Any]:
        w = tf.constant(np.full(3, 0.3, np.float32))
        b = tf.constant(np.float32(0.1))
        gw, gb = _adasum_tape_grads((w, b), r)
        return {"w": gw, "b": gb}

    got = run(tape_grads)
    refs = [_linear_grads(np.full(3, 0.3), 0.1, q) for q in range(n)]
    check(got["w"], adasum_ref(refs[0][0], refs[1][0]), f"{MODE} tape Adasum grad w", 1e-5)
    check(got["b"], adasum_ref(refs[0][1], refs[1][1]), f"{MODE} tape Adasum grad b", 1e-5)

    # TF1 DistributedOptimizer(op=Adasum): local SGD steps, then every
    # `passes` steps start + Adasum(deltas since start).
    lr, steps = 0.1, 4
    for passes in (1, 2):
        w0, b0 = np.full(3, 0.3), 0.1
        start = (w0.copy(), b0)
        local = [(w0.copy(), b0) for _ in range(n)]
        for s in range(steps):
            local = [
                (lw - lr * gw, lb - lr * gb)
                for (lw, lb), (gw, gb) in ((lc, _linear_grads(lc[0], lc[1], q, s)) for q, lc in enumerate(local))
            ]
            if s % passes == passes - 1:
                dw = adasum_ref(local[0][0] - start[0], local[1][0] - start[0])
                db = adasum_ref(local[0][1] - start[1], local[1][1] - start[1])
                start = (start[0] + dw, start[1] + db)
                local = [(start[0].copy(), start[1]) for _ in range(n)]
        got = _adasum_tf1_train(lr, steps, passes, r)
        check(got["w"], start[0], f"{MODE} TF1 Adasum optimizer w passes={passes}", 1e-5)
        check(got["b"], start[1], f"{MODE} TF1 Adasum optimizer b passes={passes}", 1e-5)

    if MODE == "eager":
        _adasum_keras_refusals()
    print(f"rank {r}: {MODE} adasum ok")


def _adasum_keras_refusals() -> None:
    """Keras optimizers refuse Adasum, with Horovod 0.28.1's messages."""
    import hvdd.tensorflow.keras as hvd_k

    keras_opt = tf.keras.optimizers.SGD(0.1)
    for bad, msg in (
        (lambda: hvd.DistributedOptimizer(keras_opt, op=hvd.Adasum), "op == Adasum is not supported yet with Keras"),
        (lambda: hvd_k.DistributedOptimizer(keras_opt, op=hvd.Adasum), "op currently only supports Average and Sum"),
    ):
        try:
            bad()
        except ValueError as e:
            if msg not in str(e):
                raise
        else:
            raise AssertionError(f"no ValueError: {msg}")


def _linear_grads(w: np.ndarray, b: float, rank: int, step: int = 0) -> tuple:
    """Gradients of mean((x·w + b - y)²) on rank's batch, in float64."""
    x, y = (a.astype(np.float64) for a in _linear_data(rank, step))
    err = x @ np.asarray(w, np.float64) + b - y[:, 0]
    return 2 * x.T @ err / len(x), 2 * float(np.sum(err)) / len(x)


def _adasum_tape_grads(variables: Any, rank: int) -> Any:
    variables = variables if isinstance(variables, tuple) else (variables, tf.constant(0.0))
    w, b = variables
    x, y = _linear_data(rank, 0)
    with tf.GradientTape() as t:
        t.watch([w, b])
        loss = tf.reduce_mean((tf.linalg.matvec(tf.constant(x), w) + b - tf.constant(y)[:, 0]) ** 2)
    tape = hvd.DistributedGradientTape(t, op=hvd.Adasum)
    return tape.gradient(loss, [w, b])


def _adasum_tf1_eager(sgd: Any, w: Any, rank: int) -> Any:
    opt = hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    return opt.apply_gradients([(tf.ones([3]), w)])


def _adasum_tf1_train(lr: float, steps: int, passes: int, rank: int) -> Dict[str, Any]:
    """Trains the linear model with the TF1 Adasum DistributedOptimizer in
    MODE from the same start on every rank; returns the final variables."""

    def loss_fn(w: Any, b: Any, x: Any, y: Any) -> Any:
        return tf.reduce_mean((tf.linalg.matvec(x, w) + b - y[:, 0]) ** 2)

    opt = hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(lr), op=hvd.Adasum, backward_passes_per_step=passes
    )
    if MODE == "graph":
        with tf.Graph().as_default():
            w = tf.compat.v1.get_variable("w", initializer=np.full(3, 0.3, np.float32), use_resource=True)
            b = tf.compat.v1.get_variable("b", initializer=np.float32(0.1), use_resource=True)
            x = tf.compat.v1.placeholder(tf.float32, [None, 3])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            train = opt.minimize(loss_fn(w, b, x, y), var_list=[w, b])
            config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=64)
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for s in range(steps):
                    xb, yb = _linear_data(rank, s)
                    sess.run(train, feed_dict={x: xb, y: yb})
                return {"w": sess.run(w), "b": sess.run(b)}
    w = tf.Variable(np.full(3, 0.3, np.float32))
    b = tf.Variable(np.float32(0.1))

    def step(x: Any, y: Any) -> None:
        with tf.GradientTape() as t:
            loss = loss_fn(w, b, x, y)
        opt.apply_gradients(zip(t.gradient(loss, [w, b]), [w, b]))

    if MODE == "function":
        step = tf.function(step)
    for s in range(steps):
        xb, yb = _linear_data(rank, s)
        step(tf.constant(xb), tf.constant(yb))
    return {"w": w.numpy(), "b": b.numpy()}


def errors() -> None:
    """Mismatches raise on every rank with the daemon's message; bad arguments
    raise ValueError before anything is sent; the job goes on."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def expect_fail(build: Callable[[], Any], words: tuple, what: str) -> None:
        try:
            run(lambda: {"x": build()})
        except hvd.HorovodInternalError as e:
            msg = str(e)
        except tf.errors.OpError as e:  # inside a graph TF wraps the error
            msg = e.message
        else:
            raise AssertionError(f"{MODE} {what}: no error")
        for w in words:
            if w not in msg:
                raise AssertionError(f"{MODE} {what}: {w!r} not in {msg!r}")

    shape = (2,) if r == 0 else (3,)
    expect_fail(lambda: hvd.allreduce(tf.ones(shape), name="bad_shape"), ("bad_shape", "shape"), "shape mismatch")
    dt = tf.float32 if r == 0 else tf.float64
    expect_fail(lambda: hvd.allreduce(tf.ones([2], dt), name="bad_dtype"), ("bad_dtype",), "dtype mismatch")
    op = hvd.Sum if r == 0 else hvd.Max
    expect_fail(lambda: hvd.allreduce(tf.ones([2]), op=op, name="bad_op"), ("bad_op",), "op mismatch")
    # Bad arguments: ValueError, nothing sent.
    for bad, what in (
        (lambda: hvd.allreduce(tf.constant(["a"]), name="s"), "string tensor"),
        (lambda: hvd.allreduce(tf.ones([2]), op=17), "unknown op"),
        (lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, average=True), "op and average"),
    ):
        try:
            bad()
        except ValueError:
            pass
        else:
            raise AssertionError(f"{what}: no ValueError")
    # An alltoall's splits, checked as hvdd.torch checks them (hvdd.ops):
    # ValueError at the call eagerly; in a graph, the values' checks when it
    # runs (TensorFlow raises the ValueError as InvalidArgumentError).
    x = tf.ones([2 * n, 1])
    for splits, text, static in (
        (tf.ones([n], tf.float32), "alltoall expects splits to contain 32-bit integer elements.", True),
        (tf.ones([1, n], tf.int32), "alltoall expects a 1D splits tensor", True),
        ([3] * n, "Sum of splits entries is greater than the first dimension of tensor.", False),
        ([1] * (n + 1), "Number of entries in splits does not equal number of workers.", False),
    ):
        try:
            run(lambda: {"x": hvd.alltoall(x, splits=splits, name="bad_splits")[0]})
        except ValueError as e:
            msg = str(e)
        except tf.errors.InvalidArgumentError as e:
            if static:
                raise
            msg = e.message
        else:
            raise AssertionError(f"{MODE} alltoall splits={splits}: no error")
        if text not in msg:
            raise AssertionError(f"{MODE} alltoall splits={splits}: {text!r} not in {msg!r}")
    try:
        run(lambda: {"x": hvd.alltoall(tf.ones([n + 1]), name="bad_rows")})
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        assert "not an even multiple" in str(e), str(e)
    else:
        raise AssertionError(f"{MODE} alltoall of {n + 1} rows without splits: no error")
    # Inside XLA-compiled code: a clear ValueError at trace time.
    if MODE == "function":
        try:
            tf.function(lambda: hvd.allreduce(tf.ones([2]), name="xla"), jit_compile=True)()
        except ValueError as e:
            if "jit_compile=False" not in str(e):
                raise
        else:
            raise AssertionError("no ValueError for a collective under jit_compile=True")
    # DistributedOptimizer's argument checks, before anything is built.
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for bad, exc, what in (
        (lambda: hvd.DistributedOptimizer(object()), ValueError, "not an optimizer"),
        (
            lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum, process_set=hvd.ProcessSet([0])),
            NotImplementedError,
            "Adasum with a process set",
        ),
        (
            lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True),
            ValueError,
            "Adasum averaging passes",
        ),
        (lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0), ValueError, "predivide"),
        (lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0), ValueError, "no passes"),
        (lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=-1), ValueError, "negative groups"),
    ):
        try:
            bad()
        except exc:
            pass
        else:
            raise AssertionError(f"DistributedOptimizer with {what}: no {exc.__name__}")
    # The job still works.
    got = run(lambda: {"x": hvd.allreduce(tf.ones([2]) * (r + 1), op=hvd.Sum, name="after")})
    check(got["x"], np.full(2, n * (n + 1) / 2), "allreduce after errors")
    print(f"rank {r}: {MODE} errors ok")


def victim() -> None:
    """The last rank dies before a collective; the others' pending collective
    fails (HorovodInternalError eagerly, an OpError in a graph) instead of
    hanging."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(tf.ones([1]), name="warmup")
    if r == n - 1:
        os.kill(os.getpid(), 9)
    try:
        run(lambda: {"x": hvd.allreduce(tf.ones([4]), name="orphan")})
    except (hvd.HorovodInternalError, tf.errors.OpError) as e:
        msg = str(e)
        if f"rank {n - 1}" not in msg:
            raise AssertionError(f"error does not name the lost rank: {msg}")
        print(f"rank {r}: {MODE} lost rank reported: {msg.splitlines()[0][:200]}")
        return
    raise AssertionError("no error after a rank died")


def fusion() -> None:
    """STEPS steps of a tf.function train step with DistributedGradientTape over
    six variables and no other collective: the test reads the daemon's
    counters (argv[3]: groups)."""
    hvd.init()
    r = hvd.rank()
    groups = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    vs = [tf.Variable(tf.ones([i + 1, 3])) for i in range(6)]

    @tf.function
    def step(x: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as t:
            loss = tf.add_n([tf.reduce_sum(v * x) for v in vs])
        t = hvd.DistributedGradientTape(t, groups=groups or None)
        for v, g in zip(vs, t.gradient(loss, vs)):
            v.assign_sub(0.1 * g)
        return loss

    for _ in range(int(os.environ.get("STEPS", "5"))):
        step(tf.constant(float(r + 1)))
    check(vs[0].numpy(), np.full((1, 3), 1 - 0.1 * 1.5 * int(os.environ.get("STEPS", "5"))), "fusion weights", 1e-5)
    print(f"rank {r}: fusion ok")


def _independent_collectives(r: int, n: int) -> tuple:
    """A training step's worth of collectives that do not depend on each other
    (8 allreduces, 3 allgathers, 3 broadcasts, a grouped allreduce, a
    reducescatter): a builder of the outputs and their expected values."""

    def build() -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for i in range(8):
            out[f"ar{i}"] = hvd.allreduce(tf.fill([i + 1], float(r + i)), op=hvd.Sum)
        for i in range(3):
            out[f"ag{i}"] = hvd.allgather(tf.fill([r + 1, i + 1], float(r)))
        for i in range(3):
            out[f"bc{i}"] = hvd.broadcast(tf.fill([i + 2], float(r + 10 * i)), root_rank=i % n)
        g = hvd.grouped_allreduce([tf.fill([2], float(r)), tf.fill([3], 1.0)], op=hvd.Sum)
        out["gr0"], out["gr1"] = g[0], g[1]
        out["rs"] = hvd.reducescatter(tf.fill([2 * n, 2], float(r)), op=hvd.Sum)
        return out

    rs = sum(range(n))
    want = {f"ar{i}": np.full(i + 1, float(rs + n * i)) for i in range(8)}
    for i in range(3):
        want[f"ag{i}"] = np.concatenate([np.full((q + 1, i + 1), float(q)) for q in range(n)])
        want[f"bc{i}"] = np.full(i + 2, float(i % n + 10 * i))
    want["gr0"], want["gr1"] = np.full(2, float(rs)), np.full(3, float(n))
    want["rs"] = np.full((2, 2), float(rs))
    return build, want


def idioms() -> None:
    """Horovod idioms that must not hang (issue 24), in one process with at
    most 2 inter-op threads (a 2-core machine's default), in eager mode:

    - broadcast_object(obj if rank 0 else None) and allgather_object of
      objects whose type differs per rank, unnamed: the default names must
      not depend on the value;
    - the gradient of broadcast: Horovod's averaged upstream gradient, on the
      root only;
    - a TF1 Session.run fetching 16 independent collectives at once, and the
      same collectives in a tf.function: every rank's executor runs them in
      its own order, so no collective may hold an executor thread while it
      waits for the other ranks.

    argv[3], if given, picks some of the parts (objects,grad,session,function)."""
    parts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["objects", "grad", "session", "function"]
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if "objects" in parts:
        _idioms_objects(r, n)
    if "grad" in parts:
        # broadcast's gradient with an all-ones upstream gradient
        x = tf.constant(np.full((2, 3), float(r + 1)))
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = hvd.broadcast(x, root_rank=0)
        check(tape.gradient(y, x), np.full((2, 3), 1.0 if r == 0 else 0.0), "eager broadcast gradient")
    build, want = _independent_collectives(r, n)
    if "session" in parts:
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
        with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as s:
            out = build()
            for step in range(3):
                got = s.run(out)
                for k, w in want.items():
                    check(got[k], w, f"session.run {step}: {k}")
    if "function" in parts:
        got = tf.function(build)()
        for k, w in want.items():
            check(got[k].numpy(), w, f"tf.function: {k}")
    print(f"rank {r}: idioms ok")


def _idioms_objects(r: int, n: int) -> None:
    """Unnamed object collectives whose objects' types differ per rank."""
    got = hvd.broadcast_object({"lr": 0.1, "from": r} if r == 0 else None, root_rank=0)
    if got != {"lr": 0.1, "from": 0}:
        raise AssertionError(f"broadcast_object: got {got!r}")
    got = hvd.broadcast_object_fn(root_rank=n - 1)([r] if r == n - 1 else None)
    if got != [n - 1]:
        raise AssertionError(f"broadcast_object_fn: got {got!r}")
    got = hvd.allgather_object(r if r % 2 == 0 else str(r))
    if got != [q if q % 2 == 0 else str(q) for q in range(n)]:
        raise AssertionError(f"allgather_object: got {got!r}")


def late_rank() -> None:
    """Rank 1 starts its graph collective late; rank 0's waits longer than
    HVDD_GRAPH_WAIT_WARN (1 s here) and the watchdog warns, naming it."""
    hvd.init()
    r = hvd.rank()
    x = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="late")
    with tf.compat.v1.Session() as s:
        if r == 1:
            import time

            time.sleep(4)  # the late rank: the condition under test, not synchronisation
        check(s.run(x), np.full(2, 2.0), "late allreduce")
    print(f"rank {r}: late ok")


def imports() -> None:
    """hvdd.tensorflow does not import torch."""
    if "torch" in sys.modules:
        raise AssertionError("importing hvdd.tensorflow imported torch")
    print("imports ok")


if __name__ == "__main__":
    # NAME[,NAME...]: several scenarios one after the other in one job (one
    # TensorFlow import per rank for all); NAME@MODE runs that one in MODE
    # only (one of MODES). Each starts with a "BEGIN NAME MODE" line.
    for spec in sys.argv[1].split(","):
        name, _, only = spec.partition("@")
        if only and only not in MODES:
            raise SystemExit(f"tf_workers.py: {spec}: {only} is not one of this job's modes {MODES}")
        for MODE in [only] if only else MODES:
            print(f"BEGIN {name} {MODE}", flush=True)
            globals()[name]()
            if MODE == "graph":
                tf.compat.v1.reset_default_graph()
