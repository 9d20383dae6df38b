"""Bad input, one test per row of the table in docs/reliability.md: every BYTESCHED_* variable
with wrong values, and wrong use of the API. Each error must name the culprit."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

import bytesched.core.core as core_module
from bytesched.core import Config, Core
from bytesched.core.config import VARIABLES, ConfigError, from_env
from bytesched.core.stall_check import StallCheck
from bytesched.core.task import CommTask, SubTask
from bytesched.runtime.lifecycle import needs_channel

from coretools import BufferTask

# The wrong values every variable of a kind must refuse (zero only where it is not "off").
SIZE = ["-4MB", "0", "four", "4XB", "2000000TB"]
SIZE_OR_OFF = ["-4MB", "00", "four", "4XB", "2000000TB"]
SECONDS = ["-1", "0", "soon", "5ms", "1e12", "nan", "inf"]
SECONDS_OR_OFF = ["-1", "soon", "5ms", "1e12", "nan", "inf"]
COUNT_FROM_1 = ["-1", "0", "ten", "2.5", "99999999999"]
COUNT_FROM_0 = ["-1", "ten", "2.5", "99999999999"]
KINDS = {
    "BYTESCHED_PARTITION_BYTES": SIZE, "BYTESCHED_CREDIT_BYTES": SIZE, "BYTESCHED_FUSION_BYTES": SIZE,
    "BYTESCHED_STAY_OUT_FUSION_BYTES": SIZE, "BYTESCHED_BATCH_BYTES": SIZE_OR_OFF,
    "BYTESCHED_PIECE_BYTES": SIZE,
    "BYTESCHED_POLICY": ["fastest", ""], "BYTESCHED_ORDER": ["random", "0"],
    "BYTESCHED_STAY_OUT_PATH": ["always", ""], "BYTESCHED_NATIVE": ["yes", ""], "BYTESCHED_TIMELINE": ["  "],
    "BYTESCHED_LOG_LEVEL": ["loud", "5"],
    "BYTESCHED_CHANNEL_HOST": [" "], "BYTESCHED_CHANNEL_PORT": ["0", "-1", "70000", "http", "29517.5"],
    "BYTESCHED_CHANNEL_TIMEOUT_S": SECONDS, "BYTESCHED_JOB_TOKEN": [""],
    "BYTESCHED_STALL_WARNING_S": SECONDS, "BYTESCHED_STALL_TIMEOUT_S": SECONDS_OR_OFF,
    "BYTESCHED_FAULT_TIMEOUT_S": SECONDS_OR_OFF, "BYTESCHED_CHECK": COUNT_FROM_0, "BYTESCHED_PLAN": ["2", "auto"],
    "BYTESCHED_PLAN_TRIAL": ["2", "maybe"],
    "BYTESCHED_TUNING": ["2", "maybe"], "BYTESCHED_TUNING_MAX_TRIALS": COUNT_FROM_1,
    "BYTESCHED_TUNING_STEPS_PER_TRIAL": COUNT_FROM_1, "BYTESCHED_TUNING_WARMUP_STEPS": COUNT_FROM_0,
    "BYTESCHED_TUNING_SEED": COUNT_FROM_0, "BYTESCHED_TUNING_XI": ["-0.1", "lots", "inf"],
    "BYTESCHED_TUNING_LOG": [" "], "BYTESCHED_TUNING_LOAD": [" "], "BYTESCHED_TUNING_PROFILE": [" "],
    "BYTESCHED_TUNING_BANDWIDTH": [" "], "BYTESCHED_TUNING_FLOOR": ["4MB", "4MB:inf", "x:1MB", "0:1MB", "1MB:"],
}
ROWS = [(name, value) for name, values in KINDS.items() for value in values]


def test_every_variable_has_bad_values_in_the_table() -> None:
    assert {v.name for v in VARIABLES} == set(KINDS), "add the new variable's bad values to KINDS"


@pytest.mark.parametrize("name, value", ROWS, ids=[f"{n}={v!r}" for n, v in ROWS])
def test_bad_variable_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name) as err:
        from_env({name: value})
    assert "expected" in str(err.value) or "e.g." in str(err.value) or "unset it" in str(err.value)


def stall_timeout_fails_a_stuck_core(config: Config, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the stall check, looking far past every deadline at a sub-task that never finishes,
    fails the Core (and would end the process)."""
    exits: list[str] = []
    monkeypatch.setattr(core_module, "exit_later", lambda reason, grace_s=10.0: exits.append(reason))
    core = Core(config).start()
    started, handled = threading.Event(), threading.Event()
    try:
        core.enqueue(BufferTask("stuck.w", 0, 8, on_start=lambda sub: started.set()), ready=True)
        assert started.wait(5), "the sub-task never started"
        StallCheck(core, None).check(time.monotonic() + 1e6)  # far past every warning and timeout
        core.call_soon(handled.set)  # after what the check posted: a failed Core never gets to it
        deadline = time.monotonic() + 5
        while core.running and not handled.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handled.is_set() or not core.running, "the Core neither stopped nor went on"
        return not core.running and bool(exits)
    finally:
        core.shutdown(0.1)


def fault_detection_opens_the_channel(config: Config, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether a 2-rank job whose order and tuning need no rank-0 channel opens it anyway, for the
    heartbeats that detect a lost rank."""
    return needs_channel(config, "immediate", 2)


def check_compares_parameters(config: Config, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether a 2-rank PyTorch job makes the consistency check that compares its parameters."""
    from bytesched.plugins.torch.consistency import make_check
    return make_check(config.check_every, SimpleNamespace(size=2), [], lambda: None) is not None


SWITCHED_OFF_BY_ZERO = {
    "BYTESCHED_STALL_TIMEOUT_S": stall_timeout_fails_a_stuck_core,
    "BYTESCHED_FAULT_TIMEOUT_S": fault_detection_opens_the_channel,
    "BYTESCHED_CHECK": check_compares_parameters,
}


@pytest.mark.parametrize("name", SWITCHED_OFF_BY_ZERO)
def test_zero_switches_off(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """0 turns the variable's feature off, where 5 turns it on (so the effect is there to miss)."""
    active = SWITCHED_OFF_BY_ZERO[name]
    assert active(from_env({name: "5"}), monkeypatch)
    assert not active(from_env({name: "0"}), monkeypatch)


# ------------------------------------------------------------------------------ wrong API use


def scheduled(model: nn.Module, optimizer: torch.optim.Optimizer) -> object:
    from bytesched.plugins.torch import ScheduledOptimizer
    return ScheduledOptimizer(model, optimizer, config=Config(fault_timeout_s=0))


def test_optimizer_without_backend_says_how_to_get_one() -> None:
    if dist.is_initialized():
        pytest.fail("torch.distributed must not be initialised here (test order changed?)")
    model = nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match=r"SGD.*hvd\.DistributedOptimizer.*init_process_group"):
        scheduled(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_wrapping_twice_is_refused(one_rank_group: object) -> None:
    model = nn.Linear(4, 4)
    once = scheduled(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        with pytest.raises(TypeError, match="already a ScheduledOptimizer"):
            scheduled(model, once)  # type: ignore[arg-type]
    finally:
        once.close()  # type: ignore[attr-defined]


def test_model_without_parameters_is_refused(one_rank_group: object) -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        scheduled(nn.ReLU(), torch.optim.SGD([nn.Parameter(torch.ones(1), requires_grad=False)], lr=0.1))


def test_parameters_of_another_model_are_named(one_rank_group: object) -> None:
    with pytest.raises(ValueError, match=r"shape \(3, 3\).*not a parameter of the model"):
        scheduled(nn.Linear(4, 4), torch.optim.SGD(nn.Linear(3, 3).parameters(), lr=0.1))


def test_ddp_model_is_refused(one_rank_group: object) -> None:
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        scheduled(model, torch.optim.SGD(model.parameters(), lr=0.1))


class _Noop(CommTask):
    def partition(self, size: float) -> list[tuple[object, int]]:
        return [(None, 8)]

    def start(self, sub: SubTask) -> None:
        self.notify_finish(sub)


def test_enqueue_before_start_and_after_shutdown_name_the_task() -> None:
    core = Core(Config())
    with pytest.raises(RuntimeError, match=r"cannot enqueue .*grad\.w.*not started"):
        core.enqueue(_Noop("grad.w", 0, 8))
    core.start()
    core.shutdown(2.0)
    with pytest.raises(RuntimeError, match=r"cannot enqueue .*grad\.w.*shut down"):
        core.enqueue(_Noop("grad.w", 0, 8))


# -- API cases that must either work exactly like the plain optimizer or be refused by name ----

class Transposed(nn.Module):
    """A parameter stored transposed: its data and gradient are non-contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


class ComplexScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.cfloat) * self.w).abs()


def shrink_weight(model: nn.Module, step: int) -> None:
    if step == 0:  # the weight becomes (2, 8): the next gradient has another shape and size
        model.weight.data = model.weight.data[:2].clone()


API_CASES = {
    "float64": (lambda: nn.Linear(4, 4).double(), (2, 4), torch.float64, None),
    "float16": (lambda: nn.Linear(4, 4).half(), (2, 4), torch.float16, None),
    "bfloat16": (lambda: nn.Linear(4, 4).to(torch.bfloat16), (2, 4), torch.bfloat16, None),
    "complex64": (ComplexScale, (4,), torch.float32, None),
    "non-contiguous": (Transposed, (2, 6), torch.float32, None),
    "changes shape": (lambda: nn.Linear(8, 4, bias=False), (2, 8), torch.float32, shrink_weight),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_unusual_parameters_train_exactly_like_the_plain_optimizer(one_rank_group: object, case: str) -> None:
    """Dtypes other than float32, non-contiguous gradients and a parameter replaced by one of
    another shape between steps (after ``synchronize()``, as updates cross the barrier) are
    all-reduced and applied as the plain optimizer does."""
    make, shape, dtype, between = API_CASES[case]
    torch.manual_seed(0)
    ours, plain = make(), make()
    plain.load_state_dict(ours.state_dict())
    x = torch.randn(*shape).to(dtype)
    optimizers = [scheduled(ours, torch.optim.SGD(ours.parameters(), lr=0.1)),
                  torch.optim.SGD(plain.parameters(), lr=0.1)]
    try:
        for step in range(3):
            for model, optimizer in zip((ours, plain), optimizers):
                optimizer.zero_grad()
                model(x).float().sum().backward()
                optimizer.step()
                if between is not None:
                    if model is ours:
                        optimizer.synchronize()  # type: ignore[attr-defined]  # the update in flight lands first
                    between(model, step)
        optimizers[0].synchronize()  # type: ignore[attr-defined]
        for (name, a), b in zip(ours.named_parameters(), plain.parameters()):
            assert a.shape == b.shape and torch.equal(a, b), f"{case}: {name} differs from the plain optimizer's"
    finally:
        optimizers[0].close()  # type: ignore[attr-defined]


def test_sparse_gradient_is_refused_by_name(one_rank_group: object) -> None:
    model = nn.Embedding(10, 4, sparse=True)
    optimizer = scheduled(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        with pytest.raises(RuntimeError, match=r"'weight' has a sparse gradient.*nn\.Embedding\(sparse=False\)"):
            model(torch.tensor([1, 2])).sum().backward()
            optimizer.step()  # type: ignore[attr-defined]
    finally:
        optimizer.close(timeout=5)  # type: ignore[attr-defined]


def test_two_models_with_the_same_parameter_names_share_one_core(one_rank_group: object) -> None:
    """Duplicate task names: two optimizers (a GAN's) whose parameters are both called 'weight'
    and 'bias' feed one Core; the Core tells the tasks apart, and both train exactly."""
    torch.manual_seed(0)
    models = [nn.Linear(4, 4), nn.Linear(4, 4)]
    plains = [nn.Linear(4, 4), nn.Linear(4, 4)]
    for model, plain in zip(models, plains):
        plain.load_state_dict(model.state_dict())
    ours = [scheduled(m, torch.optim.SGD(m.parameters(), lr=0.1)) for m in models]
    theirs = [torch.optim.SGD(p.parameters(), lr=0.1) for p in plains]
    x = torch.randn(2, 4)
    try:
        assert ours[0].core is ours[1].core  # type: ignore[attr-defined]
        for _ in range(3):
            for net_list, opt_list in ((models, ours), (plains, theirs)):
                for opt in opt_list:
                    opt.zero_grad()
                (net_list[1](net_list[0](x))).sum().backward()  # both models' gradients in one backward
                for opt in opt_list:
                    opt.step()
        for opt in ours:
            opt.synchronize()  # type: ignore[attr-defined]
        for model, plain in zip(models, plains):
            for a, b in zip(model.parameters(), plain.parameters()):
                assert torch.equal(a, b)
    finally:
        for opt in ours:
            opt.close()  # type: ignore[attr-defined]
