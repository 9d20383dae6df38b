"""``p3``: Priority-based Parameter Propagation (Jayarajan et al., SysML'19) as a policy."""

from __future__ import annotations

from ..task import SubTask
from .base import PriorityPolicy, Window


class P3Policy(PriorityPolicy):
    """Priority order with stop-and-wait: one sub-task in flight at a time.

    P3 slices tensors at 40,000 float32 elements (``MXNET_KVSTORE_BIGARRAY_BOUND``), i.e. 160 KB,
    and keeps about one message outstanding so a more urgent slice waits at most one slice.
    """

    name = "p3"
    default_partition_bytes = 160_000

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return window.inflight_count == 0
