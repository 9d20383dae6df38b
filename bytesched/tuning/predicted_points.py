"""Warm start: the simulator's predicted best points, tried before the optimiser's own guesses.

Real trials cost minutes of training each; a simulated one costs a fraction of a second. So rank
0 runs :mod:`bytesched.sim` on the job's measured profile and a measured bandwidth over the
factor-2 grid of the search space (49 points, 294 with the batching axis) and hands the best few
predictions to the search as its first points. The prediction is not trusted as a measurement (the simulator's absolute
speeds differ from the real ones): it only decides where to look first, and the Gaussian process
learns from what the real trials measure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.config import Config, ConfigError, SchedulingParams
from .space import Point, SearchSpace

if TYPE_CHECKING:
    from ..sim import Cluster, ModelProfile

PREDICTED_POINTS = 3
"""How many predicted points are tried first."""
GRID_STRIDE = 2
"""Every second lattice point per dimension: factor-2 steps, 7 x 7 points (x 6 batching thresholds,
off included, in factor-4 steps)."""


def predict_points(profile: "ModelProfile", cluster: "Cluster", space: SearchSpace, *, policy: str = "bytescheduler",
                   count: int = PREDICTED_POINTS, stride: int = GRID_STRIDE) -> list[Point]:
    """The ``count`` grid points with the highest predicted throughput, best first."""
    return best_points(predicted_throughput(profile, cluster, space, policy=policy, stride=stride), count)


def best_points(predicted: dict[Point, float], count: int = PREDICTED_POINTS) -> list[Point]:
    """The ``count`` points of highest predicted throughput, best first."""
    return sorted(predicted, key=lambda point: -predicted[point])[:count]


def predicted_throughput(profile: "ModelProfile", cluster: "Cluster", space: SearchSpace, *,
                         policy: str = "bytescheduler", stride: int = GRID_STRIDE,
                         points: list[Point] | None = None) -> dict[Point, float]:
    """Simulated iterations per second at each point (the factor-2 grid unless ``points`` is given)."""
    from ..sim import run

    chosen = list(space.points(stride)) if points is None else points
    out = {}
    for point in chosen:
        params: SchedulingParams = space.params(point)
        out[point] = 1.0 / run(profile, cluster, policy, params, iterations=1, warmup=1).iteration_time
    return out


def warm_start_inputs(config: Config, arch: str, world_size: int,
                      fuses_submitted: bool = True) -> tuple["ModelProfile", "Cluster"]:
    """The profile and cluster named by ``BYTESCHED_TUNING_PROFILE`` and
    ``BYTESCHED_TUNING_BANDWIDTH`` (an all-reduce that fuses nothing by itself, as over
    torch.distributed, unless ``fuses_submitted``); ConfigError naming the variable if either is
    missing or bad."""
    from ..sim import ProfileError, load_profile, make_cluster

    if not (config.tuning_profile and config.tuning_bandwidth):
        missing = "BYTESCHED_TUNING_BANDWIDTH" if config.tuning_profile else "BYTESCHED_TUNING_PROFILE"
        raise ConfigError(f"the tuning warm start needs both BYTESCHED_TUNING_PROFILE and "
                          f"BYTESCHED_TUNING_BANDWIDTH: set {missing} too, or unset the other")
    try:
        profile = load_profile(config.tuning_profile)
    except (ProfileError, OSError) as exc:
        raise ConfigError(f"BYTESCHED_TUNING_PROFILE={config.tuning_profile!r}: {exc}") from None
    try:
        cluster = make_cluster(arch=arch, workers=world_size, bandwidth=config.tuning_bandwidth,
                               fusion_threshold=None if fuses_submitted else 0)
    except ConfigError as exc:
        raise ConfigError(f"BYTESCHED_TUNING_BANDWIDTH={config.tuning_bandwidth!r}: {exc}") from None
    return profile, cluster
