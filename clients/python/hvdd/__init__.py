"""hvdd: Horovod's API, served by a per-node daemon.

``import hvdd.torch as hvd`` is the drop-in replacement for
``import horovod.torch as hvd``. This package holds the framework-independent
basics (init, rank, size, reduce ops, process sets, errors) that every
framework module re-exports.
"""

from __future__ import annotations

import logging

from . import basics as _basics
from . import exceptions as _exceptions
from .basics import *  # noqa: F401,F403 (Horovod's common basics: basics.__all__)
from .exceptions import *  # noqa: F401,F403 (exceptions.__all__)
from ._cuda import HvddStagingWarning  # a device tensor staged through host memory (warnings.filterwarnings)

__version__ = "0.1.0"

__all__ = [*_basics.__all__, *_exceptions.__all__, "HvddStagingWarning", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())
