"""Compiled models (``torch.compile``) under ScheduledOptimizer.

Multi-process (tests/scripts/torch_compile_equivalence.py, 2 ranks over Gloo): a compiled model
trains bit for bit as the same compiled model with the plain all-reduce, over torch.distributed and
over Horovod. In one process: what the pieces of a compiled graph do to Dynamo (nothing compiles
twice), and what a forward pass compiled elsewhere does to the optimizer.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bytesched.core as core
from bytesched.plugins.torch import ScheduledOptimizer
from conftest import SCRIPTS, require, require_executable, run_job
from test_torch_plugin import Launch, free_port, job_env

MODEL_CASES = ["compile/sgd/whole_graph", "compile/adam/pieces", "compile/sgd/pieces_split", "compile/sgd/barrier",
               "compile/sgd/in_place", "compile/adam/tied", "compile/sgd/backward_passes_per_step=2",
               "compile/adam/passing_through"]
ALL_CASES = [*MODEL_CASES, "compile/adam/eval_after_step", "compile/adam/eager_eval_after_step",
             "compile/sgd/training_step", "compile/training_step_in_barrier_mode_in_pieces"]


@pytest.fixture(scope="module")
def dist2() -> Launch:
    torchrun = require_executable("torchrun")
    result = run_job([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                      SCRIPTS / "torch_compile_equivalence.py", "--backend", "torch"], timeout=400, env=job_env())
    return Launch(2, result.stdout, result.returncode)


@pytest.fixture(scope="module")
def hvd2() -> Launch:
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      SCRIPTS / "torch_compile_equivalence.py", "--backend", "horovod"], timeout=400, env=job_env())
    return Launch(2, result.stdout, result.returncode)


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_compiled_model_bit_identical_to_the_plain_all_reduce(dist2: Launch) -> None:
    """torch.compile(model) and model.compile(), one piece and split, partitions, barrier mode,
    tied weights, accumulation, passing through; an eval pass compiled after step() while Adam's
    updates are pending; the training step compiled as a whole (barrier mode, in pieces)."""
    dist2.check(ALL_CASES)
    assert dist2.returncode == 0, dist2.output[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_compiled_model_bit_identical_to_plain_horovod(hvd2: Launch) -> None:
    hvd2.check(ALL_CASES)
    assert hvd2.returncode == 0, hvd2.output[-3000:]


# ------------------------------------------------------------------------------------ one process

class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo with nothing compiled and its counters at zero (``reset()`` keeps the counters)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
    core.shutdown()


def settings(**overrides: object) -> core.Config:
    return dataclasses.replace(core.from_env(), plan=False, **overrides)


def train(forward: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(forward(torch.randn(4, 8, generator=generator)), torch.zeros(4, 4)).backward()
        optimizer.step()


def test_the_pieces_of_a_compiled_model_compile_once(one_rank_group: object, fresh_dynamo: None) -> None:
    """Each Linear's parameters in a piece of their own; training, passing through and back, and
    closing compile no graph again (the hooks stay on, doing nothing while passing through)."""
    model = Net()
    forward = torch.compile(model)
    optimizer = ScheduledOptimizer(forward, torch.optim.SGD(model.parameters(), lr=0.1),
                                   config=settings(piece_bytes=100))
    train(forward, optimizer, 3)
    optimizer._pass_through("a test")
    train(forward, optimizer, 2)
    optimizer._return_to_core()
    train(forward, optimizer, 2)
    assert optimizer.graph_pieces == [3]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    optimizer.close()


def test_closing_gives_the_compiled_model_its_own_backend_back(one_rank_group: object, fresh_dynamo: None) -> None:
    model = Net()
    forward = torch.compile(model)
    own = forward.dynamo_ctx
    optimizer = ScheduledOptimizer(forward, torch.optim.SGD(model.parameters(), lr=0.1), config=settings())
    assert forward.dynamo_ctx is not own
    train(forward, optimizer, 1)
    optimizer.close()
    assert forward.dynamo_ctx is own
    train(forward, torch.optim.SGD(model.parameters(), lr=0.1), 1)


def test_a_forward_pass_compiled_outside_the_model_switches_to_barrier_mode(one_rank_group: object,
                                                                           fresh_dynamo: None) -> None:
    """A compiled function that calls the plain model: the forward proxies are traced where they
    cannot wait, so the optimizer stops crossing the barrier before that graph runs; the model's
    own call, eager, changes nothing."""
    model = Net()
    optimizer = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), config=settings())
    train(model, optimizer, 2)
    assert optimizer._cross_barrier
    train(torch.compile(lambda x: model(x)), optimizer, 2)
    assert not optimizer._cross_barrier
    optimizer.close()
