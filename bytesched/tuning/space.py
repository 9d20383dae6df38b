"""Where the tuner looks: partition and credit sizes (and, on a backend that batches, the batching
threshold) on a log-scaled lattice fitted to the architecture.

Training speed as a function of the partition size δ and the credit c is neither smooth nor
unimodal (paper §4.1: a rounding term per partition plus a decreasing pipelining term), and the
good values span orders of magnitude, so each knob is searched on a log scale. Each axis is a
lattice of sizes ``low * 2**(i/2)``: two points per octave, six octaves. A step of a factor
sqrt(2) is about what a window of a few dozen training steps can tell apart, so a finer grid
would only spend trials on differences hidden by measurement noise, and a lattice lets every
rank, every log row and the study name a point exactly.

The bounds bracket the paper's optima (Table 1, 32 GPUs at 100 Gbps): parameter server around
(3-6 MB, 17-29 MB), all-reduce around (56-88 MB, 64-171 MB). All-reduce needs much larger
pieces because every collective pays a synchronisation cost across all ranks (paper §6.3).

A backend that starts batches (batching while busy, ``Backend.batches``: torch.distributed) adds
a third axis, the batching threshold: off, or one of the same log-scaled sizes. The start-up plan
weighs batching at the threshold its calibration computes (``f(2x) / 2f(x)``, Caramel's rule);
the tuner searches the threshold like the other two knobs, since that rule's 0.8 is a guess and
the best threshold also depends on the partition size.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Iterator

from ..core.config import ConfigError, SchedulingParams, format_size

Point = tuple[int, ...]
"""A lattice point: (partition index, credit index), and the batching threshold's index where
the space has that axis."""

STEPS_PER_OCTAVE = 2
OCTAVES = 6


@dataclass(frozen=True)
class Axis:
    """One knob's lattice: ``low * 2**(i / steps_per_octave)`` bytes for i in 0..size-1, over
    ``octaves`` octaves; with ``off``, index 0 is 0 bytes (the knob switched off) and the sizes
    start at index 1."""

    name: str
    low: int
    off: bool = False
    steps_per_octave: int = STEPS_PER_OCTAVE
    octaves: int = OCTAVES

    @property
    def size(self) -> int:
        return self.octaves * self.steps_per_octave + 1 + self.off

    def value(self, index: int) -> int:
        """Bytes at ``index``."""
        if not 0 <= index < self.size:
            raise ValueError(f"{self.name} index {index} is outside the lattice 0..{self.size - 1}")
        if self.off and index == 0:
            return 0
        return int(round(self.low * 2 ** ((index - self.off) / self.steps_per_octave)))

    def nearest(self, nbytes: float) -> int:
        """The index whose size is closest to ``nbytes`` on a log scale (clipped to the bounds;
        0 bytes is ``off``'s index 0)."""
        if nbytes == math.inf:
            return self.size - 1
        if self.off and nbytes == 0:
            return 0
        if not nbytes > 0:
            raise ValueError(f"{self.name} size {nbytes!r} must be positive")
        index = round(self.steps_per_octave * math.log2(nbytes / self.low)) + self.off
        return min(max(index, int(self.off)), self.size - 1)

    @property
    def high(self) -> int:
        return self.value(self.size - 1)


@dataclass(frozen=True)
class SearchSpace:
    """The (partition, credit) lattice of one architecture, with a batching threshold axis
    (``batch``) on a backend that batches."""

    arch: str
    partition: Axis
    credit: Axis
    batch: Axis | None = None

    @property
    def axes(self) -> tuple[Axis, ...]:
        return (self.partition, self.credit) + (() if self.batch is None else (self.batch,))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(axis.size for axis in self.axes)

    def params(self, point: Point) -> SchedulingParams:
        """The scheduling parameters at a lattice point."""
        if len(point) != len(self.axes):
            raise ValueError(f"{point!r} is not a point of the {len(self.axes)}-dimensional {self.arch} lattice")
        batch = 0 if self.batch is None else self.batch.value(point[2])
        return SchedulingParams(partition_bytes=self.partition.value(point[0]),
                                credit_bytes=self.credit.value(point[1]), batch_bytes=batch)

    def nearest(self, params: SchedulingParams, default_partition: float) -> Point:
        """The lattice point closest to ``params`` (``partition_bytes=None`` means
        ``default_partition``, the policy's own default)."""
        partition = default_partition if params.partition_bytes is None else params.partition_bytes
        point: Point = (self.partition.nearest(partition), self.credit.nearest(params.credit_bytes))
        return point if self.batch is None else point + (self.batch.nearest(params.batch_bytes),)

    def points(self, stride: int = 1) -> Iterator[Point]:
        """Every ``stride``-th lattice point in each dimension, row by row (partition major).

        ``stride=2`` is the grid of factor-2 steps the study's grid search walks; on the batch
        axis it keeps ``off``.
        """
        return itertools.product(*(range(0, axis.size, stride) for axis in self.axes))

    def describe(self, point: Point) -> str:
        """``partition 4MB, credit 16MB`` (``, batching under 1MB``) for logs."""
        params = self.params(point)
        partition = format_size(params.partition_bytes)  # type: ignore[arg-type]  # lattice sizes are set
        text = f"partition {partition}, credit {format_size(params.credit_bytes)}"
        if self.batch is None:
            return text
        return text + (f", batching under {format_size(params.batch_bytes)}" if params.batch_bytes else ", no batching")


SPACES: dict[str, SearchSpace] = {
    # 0.5 MB .. 32 MB and 2 MB .. 128 MB: the paper's PS optima (3-6, 17-29) sit in the middle.
    "ps": SearchSpace("ps", Axis("partition", 500_000), Axis("credit", 2_000_000)),
    # 8 MB .. 512 MB and 16 MB .. 1 GB: the paper's all-reduce optima (56-88, 64-171) likewise.
    "allreduce": SearchSpace("allreduce", Axis("partition", 8_000_000), Axis("credit", 16_000_000)),
}


BATCH_AXIS = Axis("batch", 62_500, off=True, steps_per_octave=1, octaves=9)
"""Off, or 62.5 KB .. 32 MB in factor-2 steps. The calibration's threshold ``1.5 a / b`` for a
ring all-reduce of many ranks (``b`` about 2 bytes' time on the link per byte) at a fixed cost
``a`` of 300 us lies in it from about 2 Gbit/s up; the simulator's best thresholds on 16 workers
at 25 Gbit/s reach the 4-32 MB end (``docs/tuning.md``). Factor-2 steps, not sqrt(2): a third
axis multiplies the lattice, and the threshold's landscape is a few plateaus, one per tensor size
it starts batching."""


SMALLEST_FLOOR = 64_000
"""The lowest partition a model's size moves the lattice to (64 KB, the benchmark's "fine
partitions"): a tiny model's lattice would otherwise reach pieces of a few hundred bytes, each
paying a whole message's fixed cost (about 1 ms per Horovod operation on the benchmark's
emulated network)."""


def space_for(arch: str, floor: tuple[int, int] | None = None, model_bytes: int | None = None,
              batches: bool = False) -> SearchSpace:
    """The search space of ``arch`` (``ps`` or ``allreduce``), with the batching threshold's
    axis :data:`BATCH_AXIS` where the backend ``batches``.

    With ``floor`` (the smallest partition and credit, ``BYTESCHED_TUNING_FLOOR``) the lattice
    is moved to start there. Otherwise, for a model of ``model_bytes`` gradient bytes smaller
    than the lattice's largest partition, it is moved down until that largest partition is the
    whole model (never below :data:`SMALLEST_FLOOR`), keeping the architecture's ratio of credit
    to partition. The default bounds fit the paper's models (VGG16's 553 MB is about the
    all-reduce lattice's top, 512 MB); on a smaller model most of them would be partitions that
    cut no tensor, and the tuner could only choose how many whole tensors fly at once.
    """
    try:
        space = SPACES[arch]
    except KeyError:
        raise ConfigError(f"tuning: architecture {arch!r} is unknown: expected one of {', '.join(SPACES)}") from None
    if floor is None and model_bytes is not None:
        low = max(SMALLEST_FLOOR, model_bytes // 2 ** OCTAVES)
        if low < space.partition.low:
            floor = low, low * space.credit.low // space.partition.low
    if floor is not None:
        space = SearchSpace(arch, Axis("partition", floor[0]), Axis("credit", floor[1]))
    return dataclasses.replace(space, batch=BATCH_AXIS) if batches else space
