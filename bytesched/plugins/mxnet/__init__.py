"""MXNet plugin: ScheduledKVStore (parameter server) and ScheduledOptimizer (Horovod all-reduce).

    from bytesched.plugins.mxnet import ScheduledKVStore, ScheduledOptimizer

The names are imported on first use (PEP 562): a parameter server unpickles
:mod:`.server_optimizer` while ``import mxnet`` is still running there, and must not pull in the
worker side (the Core, the proxy library, Horovod). ScheduledKVStore loads the Dependency Proxy
library built from ``csrc/`` (``python csrc/build.py``); see docs/plugins/mxnet.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ScheduledKVStore": ".kvstore",
    "KVCommTask": ".kvstore",
    "ScheduledOptimizer": ".horovod",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
