"""``hvdd.tensorflow.keras``: Horovod's ``horovod.tensorflow.keras`` on the hvdd
daemon, for ``tf.keras`` (Keras 3 with the TensorFlow backend; tf_keras when
``TF_USE_LEGACY_KERAS=1``).

Use it as ``import hvdd.tensorflow.keras as hvd``: ``hvd.init()``, wrap the
optimizer in ``hvd.DistributedOptimizer``, add
``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` to ``model.fit``. The
implementation is shared with ``hvdd.keras`` (``hvdd._keras``).
``hvd.elastic`` is elastic training (``KerasState`` and its callbacks).
"""

from __future__ import annotations

from tensorflow import keras as _keras

from ..._keras import api as _api
from . import callbacks, elastic

globals().update(_api.bind(_keras, __name__))

__all__ = [*_api.PUBLIC, "elastic"]
