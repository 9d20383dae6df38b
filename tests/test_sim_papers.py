"""The qualitative results of the ByteScheduler paper (§6.2, Figure 13), predicted by the
simulator with the shipped profiles.

The set-up is Figure 13's: 4 machines (PS: 4 workers and 4 servers; all-reduce: a ring of 32
GPUs), bandwidths from 1 to 100 Gbps, ByteScheduler auto-tuned (here: the best of a 9-point
partition x credit grid), speedup over the vanilla framework.

Each claim is checked where the paper's own explanation says it applies, and that regime is
decided from the model's lower bounds (communication vs compute time), never from the observed
speedups. Our profiles compute at 50% of a V100's FP32 peak, slower than the paper's testbed,
so the same regime sits at a lower bandwidth than in the paper.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from bytesched.core.config import SchedulingParams
from bytesched.sim import simulate

MODELS = ("vgg16", "resnet50", "transformer")
BANDWIDTHS = (1, 10, 25, 100)  # Gbps
SETUPS = {"ps": 4, "allreduce": 32}
GRID = [SchedulingParams(partition_bytes=p * 10**6, credit_bytes=p * 10**6 * k) for p in (1, 4, 16) for k in (1, 2, 8)]
TOLERANCE = 0.005


class Point(NamedTuple):
    gain: float
    comm_bound: bool
    """Moving the gradients at full speed takes longer than the compute (the lower bounds)."""


@pytest.fixture(scope="module")
def figure13() -> dict[tuple[str, str], dict[int, Point]]:
    table: dict[tuple[str, str], dict[int, Point]] = {}
    for arch, workers in SETUPS.items():
        for model in MODELS:
            report = simulate(model, arch=arch, workers=workers, policies="bytescheduler", tune=GRID,
                              sweep=("bandwidth", [f"{b}Gbps" for b in BANDWIDTHS]), warmup=1, iterations=1)
            table[arch, model] = {
                b: Point(p.result("bytescheduler").speedup, p.communication_time > p.compute_time)
                for b, p in zip(BANDWIDTHS, report.predictions)}
    return table


@pytest.mark.parametrize("arch", SETUPS)
def test_vgg16_and_transformer_gain_more_than_resnet50(figure13, arch: str) -> None:  # type: ignore[no-untyped-def]
    """§6.2: "larger speedup for VGG16 and Transformer than ResNet50 ... since training it
    [ResNet50] is not communication-bound". Checked at every bandwidth where ResNet50 is not
    communication-bound: never less, and clearly more at one of them at least."""
    resnet = figure13[arch, "resnet50"]
    regime = [b for b in BANDWIDTHS if not resnet[b].comm_bound]
    assert regime, "ResNet50 is communication-bound at every bandwidth: the profiles changed"
    for model in ("vgg16", "transformer"):
        gains = figure13[arch, model]
        for b in regime:
            assert gains[b].gain >= resnet[b].gain - TOLERANCE, (arch, model, b, gains[b], resnet[b])
        assert any(gains[b].gain > resnet[b].gain + 0.05 for b in regime), (arch, model, gains, resnet)


@pytest.mark.parametrize("arch", SETUPS)
def test_gains_shrink_as_bandwidth_grows(figure13, arch: str) -> None:  # type: ignore[no-untyped-def]
    """Figure 13: ResNet50's gain "is high when the bandwidth is less than 25Gbps but decreases
    as the bandwidth increases"; and no model gains more at 100 Gbps than at 10 or 25 Gbps."""
    resnet = figure13[arch, "resnet50"]
    assert resnet[10].gain > resnet[25].gain + 0.05
    assert resnet[25].gain >= resnet[100].gain - TOLERANCE
    for model in MODELS:
        gains = figure13[arch, model]
        assert gains[100].gain <= min(gains[10].gain, gains[25].gain) + TOLERANCE, (arch, model, gains)


def test_ps_gains_exceed_allreduce_gains(figure13) -> None:  # type: ignore[no-untyped-def]
    """§6.2: "larger speedup in PS architecture than in all-reduce" because "partitioning the
    tensors create[s] better pipelining of push and pull", which pays where the PS job is
    communication-bound. Checked at every such bandwidth, for every model."""
    checked = 0
    for model in MODELS:
        ps, allreduce = figure13["ps", model], figure13["allreduce", model]
        for b in BANDWIDTHS:
            if ps[b].comm_bound:
                assert ps[b].gain > allreduce[b].gain, (model, b, ps[b], allreduce[b])
                checked += 1
    assert checked >= len(MODELS), "too few communication-bound PS points: the profiles changed"


def test_scheduling_never_loses_when_tuned(figure13) -> None:  # type: ignore[no-untyped-def]
    """Figure 13: with auto-tuning ByteScheduler "consistently speeds up the training of VGG16
    and Transformer in all bandwidth settings" (and never slows any model down)."""
    for (arch, model), gains in figure13.items():
        for b, point in gains.items():
            assert point.gain >= 1 - TOLERANCE, (arch, model, b, point)
