"""``hvdd.keras``: Horovod's ``horovod.keras`` on the hvdd daemon, for the
``keras`` package (Keras 3 with the TensorFlow backend).

Use it as ``import hvdd.keras as hvd``; the API is ``hvdd.tensorflow.keras``'s
(the implementation is shared, ``hvdd._keras``), on ``keras`` instead of
``tf.keras``; ``hvd.elastic`` is elastic training (``KerasState`` and
its callbacks).
"""

from __future__ import annotations

import keras as _keras

from .._keras import api as _api
from . import callbacks, elastic

globals().update(_api.bind(_keras, __name__))

__all__ = [*_api.PUBLIC, "elastic"]
