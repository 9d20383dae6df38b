"""``python -m benchmarks compiled``: its report and its compilable emulated model (the jobs
themselves need an emulated network and run in docs/plugins/torch.md's measurements)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from benchmarks.compiled.command import summary
from benchmarks.compiled.model import CompiledModel
from benchmarks.compiled.worker import piece_bytes, prepare
from benchmarks.emulated.scaling import Scale, scaled_profile


def test_summary_is_the_median_rate_and_the_median_ratio_of_each_round() -> None:
    runs = [{"config": config, "round": number, "samples_per_second": rate}
            for number, rates in enumerate([(100.0, 120.0), (110.0, 110.0), (90.0, 126.0)])
            for config, rate in zip(("ddp", "bytesched"), rates)]
    table = summary({"configs": ["ddp", "bytesched"], "runs": runs})
    assert table["ddp"] == {"median_samples_per_second": 100.0, "median_ratio": 1.0, "ratio_range": [1.0, 1.0]}
    assert table["bytesched"]["median_samples_per_second"] == 120.0
    assert table["bytesched"]["median_ratio"] == pytest.approx(1.2)
    assert table["bytesched"]["ratio_range"] == pytest.approx([1.0, 1.4])


def test_piece_sizes_are_scaled_like_the_model() -> None:
    assert piece_bytes("bytesched", 0.5) == 2_000_000
    assert piece_bytes("bytesched-barrier:25MB", 0.1) == pytest.approx(2_500_000)
    assert piece_bytes("bytesched:inf", 0.1) == math.inf
    with pytest.raises(ValueError, match="unknown"):
        prepare("bytesched-nothing", torch.nn.Linear(1, 1), 1.0)


def test_the_emulated_model_compiles_to_one_graph_that_sleeps_its_profile() -> None:
    """One graph (no break at the sleeps), and a step takes the profile's compute time."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them
    profile = scaled_profile("resnet50", Scale(0.001, 0.05))
    model = CompiledModel(profile)
    compiled = torch.compile(model, backend="aot_eager")
    compiled(torch.zeros(1)).sum().backward()  # compiles
    started = time.perf_counter()
    compiled(torch.zeros(1)).sum().backward()
    assert time.perf_counter() - started >= profile.compute_time
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    torch._dynamo.reset()
