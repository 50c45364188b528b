"""``hvdd.tensorflow.keras.callbacks``: Horovod's Keras callbacks for
``tf.keras`` (``horovod.tensorflow.keras.callbacks``)."""

from __future__ import annotations

from tensorflow import keras as _keras

from ..._keras import public_callbacks as _api

globals().update(_api.bind(_keras, __name__))

__all__ = list(_api.PUBLIC)
