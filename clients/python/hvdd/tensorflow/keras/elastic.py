"""``hvdd.tensorflow.keras.elastic``: Horovod's
``horovod.tensorflow.keras.elastic`` for ``tf.keras``: ``KerasState``,
``CommitStateCallback``, ``UpdateBatchStateCallback``,
``UpdateEpochStateCallback`` and ``run`` (see :mod:`hvdd.elastic`)."""

from __future__ import annotations

from tensorflow import keras as _keras

from ..._keras import elastic as _api

globals().update(_api.bind(_keras, __name__))

__all__ = list(_api.PUBLIC)
