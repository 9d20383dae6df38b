"""Sub-tasks that stalled, and which rank held them up.

A collective (all-reduce, or a synchronous push-pull) finishes on every rank only once the last
rank has started it, so a partition in flight far longer than usual was either slow on the wire or
waiting for a rank that started it late. With the traces of several ranks the second case is
visible: the same key (tensor, step, partition) started later on the culprit rank.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from .trace import SubTaskRecord


@dataclass(frozen=True)
class Stall:
    """A sub-task in flight for ``in_flight_s`` on ``rank``; ``waited_for`` is the rank that
    started it last, ``lateness_s`` after this one, when that explains most of the time."""

    tensor: str
    step: int
    partition: int
    rank: int
    in_flight_s: float
    waited_for: int | None
    lateness_s: float | None


def find_stalls(records: list[SubTaskRecord], *, factor: float = 5.0, floor_s: float = 0.001,
                limit: int = 10) -> tuple[float, list[Stall]]:
    """(threshold, the ``limit`` longest stalls): sub-tasks in flight at least ``factor`` times the
    median in-flight time of all of them (and at least ``floor_s``)."""
    if factor <= 0 or floor_s < 0:
        raise ValueError(f"stall factor must be > 0 and floor >= 0, got {factor} and {floor_s}")
    threshold = max(factor * statistics.median(r.in_flight for r in records), floor_s)
    by_key: dict[tuple[str, int, int], list[SubTaskRecord]] = defaultdict(list)
    for r in records:
        by_key[r.key].append(r)
    stalls: list[Stall] = []
    for r in sorted(records, key=lambda r: -r.in_flight):
        if r.in_flight < threshold or len(stalls) == limit:
            break
        last = max(by_key[r.key], key=lambda other: other.start)
        lateness = last.start - r.start
        if last.rank != r.rank and lateness > r.in_flight / 2:
            stalls.append(Stall(r.tensor, r.step, r.partition, r.rank, r.in_flight, last.rank, lateness))
        else:
            stalls.append(Stall(r.tensor, r.step, r.partition, r.rank, r.in_flight, None, None))
    return threshold, stalls


__all__ = ["Stall", "find_stalls"]
