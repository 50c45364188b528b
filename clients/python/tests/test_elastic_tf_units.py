"""hvdd.tensorflow.elastic and the Keras elastic modules without a daemon:
TensorFlowState and KerasState commit / restore, the Keras callbacks, and
run's handling of a graph's wrapped error. Broadcasts are the identity."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdd.elastic as elastic  # noqa: E402
import hvdd.keras as hk  # noqa: E402
import hvdd.tensorflow as hvd  # noqa: E402
import hvdd.tensorflow.elastic as tf_elastic  # noqa: E402
import hvdd.tensorflow.keras as htk  # noqa: E402
from hvdd.exceptions import HorovodInternalError, HvddInternalError  # noqa: E402


@pytest.fixture(autouse=True)
def no_broadcast(monkeypatch):
    calls = []

    def bcast_object(obj, *args, **kwargs):
        return obj

    def bcast_variables(variables, root_rank, *args, **kwargs):
        calls.append(len(list(variables)))

    monkeypatch.setattr(tf_elastic, "broadcast_object", bcast_object)
    monkeypatch.setattr(tf_elastic, "broadcast_variables", bcast_variables)
    # One rank, no daemon: the ranks' agreement on skipping the sync is its own.
    monkeypatch.setattr(elastic, "_all_skip_sync", lambda skip: skip)
    return calls


def values(variables):
    return [np.array(v.numpy()).tolist() for v in variables]


def test_tensorflow_state_commit_restore(no_broadcast):
    a = tf.Variable([1.0, 2.0])
    b = tf.Variable(3, dtype=tf.int64)
    state = hvd.elastic.TensorFlowState([a, b], epoch=1)
    a.assign([5.0, 6.0])
    b.assign(4)
    state.epoch = 2
    state.restore()
    assert values([a, b]) == [[1.0, 2.0], 3] and state.epoch == 1
    a.assign([7.0, 8.0])
    state.epoch = 3
    state.commit()
    a.assign([0.0, 0.0])
    state.epoch = 4
    state.restore()
    np.testing.assert_array_equal(a.numpy(), [7.0, 8.0])
    assert state.epoch == 3
    state.sync()
    assert no_broadcast == [2]  # eagerly, sync broadcasts the variables


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    return model, opt


def _train(model, steps=1):
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)
    model.fit(x, y, batch_size=4, epochs=steps, verbose=0)


@pytest.mark.parametrize("pkg", [htk, hk], ids=["tensorflow.keras", "keras"])
def test_keras_state_commit_restore(pkg, no_broadcast):
    model, opt = _model()
    state = pkg.elastic.KerasState(model, batch=0, epoch=0)
    assert state.optimizer is opt
    w0, o0 = values(model.variables), values(opt.variables)
    _train(model)
    assert not all(np.array_equal(x, y) for x, y in zip(values(model.variables), w0))
    state.restore()
    for got, want in zip(values(model.variables) + values(opt.variables), w0 + o0):
        np.testing.assert_array_equal(got, want)

    _train(model)
    state.batch = 5
    state.commit()
    w1, o1 = values(model.variables), values(opt.variables)
    _train(model, 2)
    state.batch = 9
    state.restore()
    for got, want in zip(values(model.variables) + values(opt.variables), w1 + o1):
        np.testing.assert_array_equal(got, want)
    assert state.batch == 5
    state.sync()
    assert no_broadcast == [len(model.variables) + len(opt.variables)]


def test_tensorflow_keras_state_needs_a_built_model():
    model = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="Model must be built first"):
        hvd.elastic.TensorFlowKerasState(model)


def test_keras_callbacks_update_and_commit_the_state():
    model, _ = _model()
    state = htk.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    state.commit = lambda: commits.append((state.epoch, state.batch))
    x, y = np.ones((8, 3), np.float32), np.zeros((8, 1), np.float32)
    callbacks = [
        htk.elastic.UpdateBatchStateCallback(state),
        htk.elastic.UpdateEpochStateCallback(state),
        htk.elastic.CommitStateCallback(state, batches_per_commit=2),
    ]
    model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=callbacks)
    # Commits after batches 1 and 3 of each epoch, and at each epoch's end
    # (after the batch and epoch callbacks ran: batch 0, the next epoch).
    assert commits == [(0, 1), (0, 3), (1, 0), (1, 1), (1, 3), (2, 0)]
    assert (state.epoch, state.batch) == (2, 0)


def test_update_batch_state_shortens_the_resumed_epoch():
    model, _ = _model()
    state = htk.elastic.KerasState(model, batch=3, epoch=0)
    cb = htk.elastic.UpdateBatchStateCallback(state)
    cb.set_params({"steps": 10})
    cb.on_train_begin()
    cb.on_epoch_begin(0)
    assert cb.params["steps"] == 7


def test_run_turns_a_graph_error_into_horovod_internal_error(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    resets = []
    monkeypatch.setattr(elastic._basics, "shutdown", lambda _elastic_reset=False: resets.append("shutdown"))
    monkeypatch.setattr(elastic._basics, "init", lambda: resets.append("init"))

    def fail():
        raise HvddInternalError("rank 1 lost")

    @tf.function
    def step():
        return tf.numpy_function(fail, [], tf.float32)

    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(1)
        if len(attempts) == 1:
            step()
        return "done"

    state = hvd.elastic.TensorFlowState([tf.Variable(1.0)])
    assert train(state) == "done"
    assert resets == ["shutdown", "init"]

    # Other graph errors are not retried.
    def other():
        raise KeyError("bug")

    @tf.function
    def bad():
        return tf.numpy_function(other, [], tf.float32)

    with pytest.raises(tf.errors.UnknownError):
        hvd.elastic.run(lambda state: bad())(state)


def test_exports():
    for mod in (htk.elastic, hk.elastic):
        assert set(mod.__all__) == {
            "KerasState",
            "CommitStateCallback",
            "UpdateBatchStateCallback",
            "UpdateEpochStateCallback",
            "run",
        }
        assert all(hasattr(mod, n) for n in mod.__all__)
    assert hk.elastic.KerasState.__module__ == "hvdd.keras.elastic"
    assert issubclass(htk.elastic.KerasState, hvd.elastic.TensorFlowKerasState)
    assert isinstance(HorovodInternalError("x"), RuntimeError)
