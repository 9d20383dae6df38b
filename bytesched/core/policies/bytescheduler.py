"""``bytescheduler``: Algorithm 1 of the paper - priority queue, partitioning, credit window."""

from __future__ import annotations

from .base import CreditPolicy


class ByteSchedulerPolicy(CreditPolicy):
    """Start the highest-priority ready sub-task while the credit allows (paper §4.2).

    The default partition (4 MB) and credit (16 MB) match the original's defaults of 1M and 4M
    four-byte elements; the tuner replaces them with measured optima.
    """

    name = "bytescheduler"
    default_partition_bytes = 4_000_000
