"""The TF1 session a Keras backend runs in: what ``TensorFlowKerasState``,
the Keras API and its callbacks read values and run broadcasts through in a
TF1 graph."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["_session"]


def _session(backend: Any) -> Any:
    """The TF1 session a Keras backend (``tf.keras.backend`` or a module
    holding one as ``backend``) runs in: the default session if there is one."""
    sess = tf.compat.v1.get_default_session()
    if sess is not None:
        return sess
    get = getattr(backend, "get_session", None)
    if get is None:
        get = getattr(getattr(backend, "backend", None), "get_session", None)
    if get is None:
        get = tf.compat.v1.keras.backend.get_session
    return get()
