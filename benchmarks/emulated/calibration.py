"""What one communication operation costs on the emulated network, measured, for the simulator.

The simulator's defaults describe the paper's testbed: about 0.3 ms of fixed cost per message
(GPUs, RDMA) and links that deliver their nominal rate. On a 2-core machine a Horovod/Gloo
all-reduce or a ps-lite push+pull costs milliseconds however small it is (Horovod's negotiation
cycle, Gloo's round trips, Python on the critical path), and a tbf-shaped veth delivers less
than its rate once TCP and the shaper's bursts are paid. Predicting with the defaults missed by
19 % median (docs/benchmarks.md). So before a group's runs the harness starts one calibration
job on the same cluster and framework: it times a 4-byte operation (the fixed cost) and an
operation of the workload's whole gradient size (from which the delivered bandwidth follows),
and the prediction and the simulator-chosen sizes use those two figures.

bytesched's own path costs more per sub-task than the framework's bare operation (the Core,
the plugin's start and completion, the rank-0 order for a PS, Python on a loaded CPU). Where a
group runs ``bytescheduler-sim``, the calibration also runs the workload itself under fixed
partition sizes (the ``probe-*`` configurations: two for all-reduce, three for a PS) and on the
framework's plain path, and :func:`.prediction.fit_probes` finds the cost with which the
simulator reproduces the probes' step times relative to the plain one: a per-message overhead
for all-reduce, a pipelined per-message latency for a PS (whose credit, not its connections, is
what such a delay starves); the scheduled configurations are then predicted, and their sizes
chosen, with that cost. Where a group runs ``bytescheduler-tuned``, a
tuning job follows: bytesched's auto-tuner searches partition and credit on the workload itself
and the pair it keeps is what that configuration then runs.

The operation is what the framework does per tensor: an all-reduce (Horovod, torch.distributed)
or a fused pushpull of one key (a ``dist_sync`` KVStore, as Gluon's Trainer does; results files
from older versions timed a push followed by a pull).

The emulated compute itself is measured too: one training step of the emulated model with the
framework's plain optimizer and no communication. It takes longer than the profile's scaled
times (each layer's two sleeps overshoot by 0.1-0.2 ms median on this VM, with tails past 1 ms,
and autograd adds its own work per layer): 263 ms instead of 192 for the 77-layer Transformer,
230 instead of 192 for VGG16's 16 layers. The prediction scales the profile's times to the
measured step, as it scales the network to the measured operations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from bytesched.runtime.calibration import NetworkCost, median_seconds

FIXED_REPEATS = 30
"""4-byte operations timed (after one untimed): a median of 30 settles within a few percent."""
LARGE_REPEATS = 3
"""Whole-gradient operations timed (after one untimed): each takes a sizeable part of a second."""
COMPUTE_REPEATS = 5
"""Compute-only training steps timed (after one untimed): a step is a few hundred ms."""
PROBE_BYTES = 4
"""The small operation's size: one float32, so its time is all fixed cost."""


@dataclass(frozen=True)
class Calibration:
    """The measured medians of one framework on one emulated network."""

    fixed_seconds: float
    """A 4-byte operation: the per-operation cost, independent of size."""
    large_seconds: float
    """An operation of ``large_bytes``."""
    large_bytes: int
    probe_seconds: tuple[float, ...] | None = None
    """Seconds per step of the workload under the probes (:func:`.configs.probes`, in order)."""
    probe_baseline_seconds: float | None = None
    """Seconds per step of the workload on the framework's plain path, run with the probes: the
    yardstick their times are fitted relative to (None in results files written before it was)."""
    scheduled_overhead: float | None = None
    """The per-message cost of bytesched's path fitted from the probes (None: not fitted)."""
    compute_seconds: float | None = None
    """One training step of the emulated model without communication (None: not measured, as in
    results files written before this was)."""
    scheduled_latency: float | None = None
    """The pipelined per-message latency of bytesched's PS path fitted from the probes (None: not
    fitted: all-reduce, or results files written before it was)."""
    tuned_sizes: tuple[int, int] | None = None
    """The partition and credit (bytes) bytesched's auto-tuner kept in the group's tuning job
    (None: the group runs no ``bytescheduler-tuned``)."""
    tuning_trials: tuple[tuple[str, ...], ...] | None = None
    """That job's tuning log, one row per trial (the CSV's columns, as text)."""
    tuning_seconds: float | None = None
    """How long the tuning job took, start-up included."""

    def __post_init__(self) -> None:
        _ = self.network  # raises ValueError if the two operations' times are inconsistent

    @property
    def network(self) -> NetworkCost:
        """The two operations, as the start-up plan measures them too."""
        return NetworkCost(self.fixed_seconds, self.large_seconds, self.large_bytes)

    def simulator_options(self, arch: str, workers: int, scheduled: bool = False) -> dict[str, float]:
        """``overhead``, ``latency`` and ``bandwidth`` for :func:`bytesched.sim.predict.simulate`
        that reproduce both measurements in the simulator's cost model
        (:meth:`bytesched.runtime.calibration.NetworkCost.simulator_options`); with ``scheduled``,
        the overhead and latency are the fitted ones of bytesched's path, where there are any."""
        options = self.network.simulator_options(arch, workers)
        if scheduled and self.scheduled_overhead is not None:
            options["overhead"] = self.scheduled_overhead
        if scheduled and self.scheduled_latency is not None:
            options["latency"] = self.scheduled_latency
        return options

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Calibration":
        """The worker's record of the two operations (the probes are added by the harness)."""
        compute = record.get("compute_seconds")
        return cls(float(record["fixed_seconds"]), float(record["large_seconds"]), int(record["large_bytes"]),
                   compute_seconds=None if compute is None else float(compute))


def calibrate(make_operation: Callable[[int], Callable[[], None]], large_bytes: int,
              compute_step: Callable[[], None] | None = None) -> Calibration:
    """Time the framework's operation on 4 bytes and on ``large_bytes``, then ``compute_step``
    (one training step without communication) if given; ``make_operation(nbytes)`` returns a
    blocking call that communicates that many bytes. The operations come first, right after the
    job started, as before the compute was measured: in the one benchmark run that timed the
    compute first, the Transformer groups' 4-byte all-reduce read 8.0 and 2.3 ms (1.1 ms in the
    run before; not reproduced on loopback)."""
    fixed = median_seconds(make_operation(PROBE_BYTES), FIXED_REPEATS)
    large = median_seconds(make_operation(large_bytes), LARGE_REPEATS)
    compute = None if compute_step is None else median_seconds(compute_step, COMPUTE_REPEATS)
    return Calibration(fixed, large, large_bytes, compute_seconds=compute)
