"""The PyTorch plugin's pieces in one process: per-parameter updates with the user's optimizer,
the first-forward trace, the Horovod handle poller, and argument errors."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bytesched.core import from_env, shutdown
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.plugins.torch.distributed import DistributedBackend
from bytesched.plugins.torch.fusion import agree_on_buckets, merge_buckets, pack, plan_buckets, unpack
from bytesched.plugins.torch.horovod import HandlePoller
from bytesched.plugins.torch.slots import ParamSlot
from bytesched.plugins.torch.trace import ForwardTrace
from bytesched.plugins.torch.updates import PartialStep, hyperparameters

# Every per-parameter optimizer of torch.optim, with settings that exercise its state.
PER_PARAMETER: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD nesterov+wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "SGD dampening": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.2),
    "Adam amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=1e-3),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05),
    "RMSprop centered": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.9, centered=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=1e-3),
    "Adadelta": lambda p: torch.optim.Adadelta(p, lr=1.0),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=1e-2),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=1e-2),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=1e-2),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=1e-2),
}


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def set_gradients(model: nn.Module, step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    for param in model.parameters():
        param.grad = torch.randn(param.shape, generator=gen)


@pytest.mark.parametrize("name", sorted(PER_PARAMETER))
def test_partial_updates_equal_one_full_step(name: str) -> None:
    """Updating parameters a few at a time, in a scrambled order, with hyperparameters snapshotted
    before an LR change, gives exactly the parameters and state of ordinary step() calls."""
    reference, scheduled = small_model(), small_model()
    ref_opt = PER_PARAMETER[name](reference.parameters())
    opt = PER_PARAMETER[name](scheduled.parameters())
    update = PartialStep(opt, type(opt).step)
    for step in range(4):
        set_gradients(reference, step)
        ref_opt.step()
        set_gradients(scheduled, step)
        hparams = hyperparameters(opt)
        for group in opt.param_groups:
            group["lr"] *= 0.5  # an LR scheduler stepping right after step(): must not leak in
        params = list(scheduled.parameters())
        with torch.no_grad():  # one parameter alone, then two in one call, in no particular order
            for batch in ((2,), (3, 0), (1,)):
                update([params[i] for i in batch], [params[i].grad for i in batch], hparams[0])
        for group in opt.param_groups:
            group["lr"] *= 2.0
    for a, b in zip(reference.parameters(), scheduled.parameters()):
        assert torch.equal(a, b), name
    ref_state, state = ref_opt.state_dict(), opt.state_dict()
    assert ref_state["param_groups"] == state["param_groups"]
    for index, values in ref_state["state"].items():
        for key, value in values.items():
            other = state["state"][index][key]
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(other)), (name, index, key)


def test_partial_updates_still_run_the_step_hooks_a_user_registered() -> None:
    """Without hooks the update skips torch's step wrapper; with one (of the optimizer, or
    global) it goes through the wrapper, so the hook sees every partial step as before."""
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    update = PartialStep(opt, type(opt).step)
    calls: list[str] = []
    params = list(model.parameters())

    def step_once() -> None:
        with torch.no_grad():
            update(params[:1], [torch.ones_like(params[0])], hyperparameters(opt)[0])
    step_once()
    assert calls == []
    handle = opt.register_step_post_hook(lambda *_: calls.append("optimizer"))
    step_once()
    handle.remove()
    handle = register_optimizer_step_pre_hook(lambda *_: calls.append("global"))
    step_once()
    handle.remove()
    step_once()
    assert calls == ["optimizer", "global"]


def test_stand_in_gradient_survives_model_zero_grad() -> None:
    """The update reads the gradient it was given, even if param.grad was cleared meanwhile."""
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    param = next(model.parameters())
    before = param.detach().clone()
    reduced = torch.ones_like(param)
    param.grad = None
    with torch.no_grad():
        PartialStep(opt, type(opt).step)([param], [reduced], hyperparameters(opt)[0])
    assert torch.equal(param.detach(), before - 1.0)
    assert param.grad is None


class Tied(nn.Module):
    """Registers its layers in another order than its forward pass reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
        self.embed = nn.Linear(4, 6, bias=False)
        self.body[2].weight = self.body[0].weight
        self.scale = nn.Parameter(torch.ones(6))
        self.unused = nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.embed(x)) * self.scale
        return F.linear(h, self.embed.weight.t())


def traced(model: nn.Module, *inputs: torch.Tensor) -> ForwardTrace:
    """Run one forward pass with the trace driven by module hooks, as the forward proxies do."""
    trace = ForwardTrace(model.parameters())
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda m, a: trace.module_enter(m), prepend=True))
        handles.append(module.register_forward_hook(lambda m, a, o: trace.module_exit(m), prepend=True,
                                                    always_call=True))
    model(*inputs)
    for handle in handles:
        handle.remove()
    return trace


def test_trace_orders_by_first_read_and_finds_the_hook_point_before_it() -> None:
    model = Tied()
    trace = traced(model, torch.randn(2, 4))
    assert trace.state == "done"
    names = {id(p): n for n, p in model.named_parameters()}
    assert list(names.values()) == ["scale", "unused", "body.0.weight", "body.0.bias", "body.2.bias",
                                    "embed.weight"]  # registration order
    order = sorted(trace.first_read, key=lambda key: trace.first_read[key][0])
    assert [names[key] for key in order] == ["embed.weight", "body.0.weight", "body.0.bias", "body.2.bias", "scale"]
    point = {names[key]: (where, module) for key, (_, (module, where)) in trace.first_read.items()}
    assert point["embed.weight"] == ("pre", model.embed)
    assert point["body.0.weight"] == ("pre", model.body[0])  # tied: read first by body.0
    assert point["scale"] == ("post", model.body)  # owned by the container, read after body returns
    assert id(model.unused) not in trace.first_read


def test_trace_closes_when_the_forward_raises() -> None:
    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.fc(x)
            raise ValueError("boom")

    model = Failing()
    with pytest.raises(ValueError):
        traced(model, torch.randn(1, 2))
    torch.randn(1)  # the mode was popped: torch functions run normally
    assert torch.overrides._get_current_function_mode_stack() == []


class Handles:
    """Finished-flags for fake handles, flipped by the test (the poller's two callables)."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.released: list[int] = []

    def poll(self, handle: int) -> bool:
        return handle in self.done

    def release(self, handle: int) -> None:
        self.released.append(handle)


def test_poller_reports_completions_in_completion_order_and_backs_off_meanwhile() -> None:
    handles = Handles()
    reported: list[int] = []
    poller = HandlePoller(handles.poll, handles.release, lambda token, error: reported.append(token),
                          min_interval=0.001, max_interval=0.004)
    assert poller.poll() is None  # nothing in flight: no polling wanted
    for handle in (1, 2, 3):
        poller.watch(handle, handle)
    assert [poller.poll() for _ in range(4)] == [0.002, 0.004, 0.004, 0.004]  # doubling up to the max
    handles.done.add(3)
    delays = [poller.poll() for _ in range(4)]  # 3 finished behind running ones: a full scan finds it
    assert reported == [3] and delays[-1] == 0.001  # a completion resets the delay
    handles.done.update({1, 2})
    assert poller.poll() == 0.001 and reported == [3, 1, 2]
    assert handles.released == [3, 1, 2]
    assert poller.poll() is None


def test_poller_rounds_poll_in_start_order_up_to_the_first_running_handle() -> None:
    """A round stops at the first handle still running; a full scan reports those behind it."""
    handles = Handles()
    polled: list[int] = []

    def poll(handle: int) -> bool:
        polled.append(handle)
        return handles.poll(handle)

    poller = HandlePoller(poll, handles.release, lambda token, error: None)
    in_flight = [(handle, f"token {handle}") for handle in (1, 2, 3, 4)]
    handles.done.update({1, 3, 4})
    assert [h for h, _ in poller._finished(in_flight, full=False)] == [1]
    assert polled == [1, 2]
    assert [h for h, _ in poller._finished(in_flight, full=True)] == [1, 3, 4]


def test_poller_reports_a_failed_handle_as_an_error() -> None:
    handles = Handles()

    def release(handle: int) -> None:
        raise RuntimeError(f"handle {handle} failed")

    reports: list[tuple[str, BaseException | None]] = []
    poller = HandlePoller(handles.poll, release, lambda token, error: reports.append((token, error)))
    poller.watch(7, "partition 0")
    handles.done.add(7)
    poller.poll()
    [(token, error)] = reports
    assert token == "partition 0" and isinstance(error, RuntimeError) and "handle 7" in str(error)


def test_without_a_backend_the_error_names_both_ways() -> None:
    model = small_model()
    with pytest.raises(RuntimeError, match="hvd.DistributedOptimizer.*torch.distributed.init_process_group"):
        ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_bad_arguments_name_the_culprit() -> None:
    model = small_model()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        ScheduledOptimizer(copy.copy, torch.optim.SGD(model.parameters(), lr=0.1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        ScheduledOptimizer(model, object())  # type: ignore[arg-type]


def test_gradients_reduced_before_step_are_applied_in_one_optimizer_call(one_rank_group: object) -> None:
    """The updates due at step() (every gradient was reduced already) go through one call of the
    user's optimizer, and give the bits of a plain step() (one rank: the average is the gradient).
    Placed after the tests that need torch.distributed uninitialised."""
    deep = [nn.Linear(5, 5) for _ in range(6)]
    reference, model = nn.Sequential(*deep), copy.deepcopy(nn.Sequential(*deep))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    calls: list[int] = []
    apply_update = opt._pipeline._apply_update
    opt._pipeline._apply_update = lambda params, grads, hparams: (calls.append(len(params)),
                                                                 apply_update(params, grads, hparams))
    train_side_by_side(reference, ref_opt, model, opt, synchronize_first=True)  # all reduced before step()
    assert calls == [12, 12, 12]


def train_side_by_side(reference: nn.Module, ref_opt: torch.optim.Optimizer, model: nn.Module,
                       opt: ScheduledOptimizer, synchronize_first: bool = False, steps: int = 3,
                       before_step: Callable[[int], None] | None = None) -> None:
    """``steps`` steps on the same data with the plain and the scheduled optimizer (``opt`` is
    closed after; ``before_step(step)`` runs before each); both models must then hold the same
    bits (one rank: the average is the gradient)."""
    try:
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
        for step in range(steps):
            if before_step is not None:
                before_step(step)
            for net, optimizer in ((reference, ref_opt), (model, opt)):
                optimizer.zero_grad()
                net(x).square().sum().backward()
                if synchronize_first and optimizer is opt:
                    opt.synchronize()
                optimizer.step()
        opt.synchronize()
    finally:
        opt.close()  # conftest stops the process's Core after the module
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_buckets_join_consecutive_parameters_of_one_kind_up_to_the_fusion_size(one_rank_group: object) -> None:
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(50, 1), nn.Linear(5, 5).double(),
                          nn.Linear(5, 5))
    params = list(model.parameters())
    slots = [ParamSlot(f"p{i}", p, group=0 if i < 8 else 1, priority=i) for i, p in enumerate(params)]
    # bytes: 100 20 | 100 20 | 200 4 | 200 40 (float64) | 100 20, and p8 onwards is another group
    assert plan_buckets(slots, 150) == [[0, 1], [2, 3], [4], [5], [6], [7], [8, 9]]  # p4 and p6 alone
    assert plan_buckets(slots, 1) == [[i] for i in range(10)]  # fusion off: every tensor alone
    buckets = agree_on_buckets(DistributedBackend(one_rank_group), slots, 250)
    assert [b.name for b in buckets] == ["p0+3", "p4+1", "p6+1", "p8+1"]
    assert [b.group for b in buckets] == [0, 0, 0, 1] and slots[3].bucket is buckets[0]


def test_merged_buckets_join_consecutive_buckets_of_one_kind_until_they_hold_the_larger_bound(
        one_rank_group: object) -> None:
    """What a plan that stays out does to the agreed buckets: the first (p0) stays as it is, p1-p5
    (float32, group 0) join, the float64 bucket stays alone (another kind), and group 1 joins
    nothing across the boundary; under 250 bytes the run closes once p1-p4 hold 340 (DDP's rule)."""
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Linear(50, 1), nn.Linear(5, 5).double(),
                          nn.Linear(5, 5))
    slots = [ParamSlot(f"p{i}", p, group=0 if i < 8 else 1, priority=i) for i, p in enumerate(model.parameters())]
    buckets = agree_on_buckets(DistributedBackend(one_rank_group), slots, 1)  # every tensor alone
    merged = merge_buckets(buckets, 500)
    assert [b.name for b in merged] == ["p0", "p1+4", "p6+1", "p8+1"]
    assert [s.name for s in merged[1].slots] == [f"p{i}" for i in range(1, 6)] and slots[5].bucket is merged[1]
    assert slots[0].bucket is merged[0]
    assert [b.name for b in merge_buckets(buckets, 250)] == ["p0", "p1+3", "p5", "p6+1", "p8+1"]


def test_a_bucket_packs_its_gradients_and_unpacks_the_reduced_buffer_into_them() -> None:
    grads = [torch.arange(6.0).view(2, 3), torch.arange(4.0).view(2, 2).t(), torch.tensor([7.0])]
    flat = pack(grads)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 0, 2, 1, 3, 7]  # the transposed one in its logical order
    unpack(flat * 2, grads)
    assert grads[1].tolist() == [[0, 4], [2, 6]] and grads[2].tolist() == [14.0]
    alone = torch.ones(3, 2)
    assert pack([alone]).data_ptr() == alone.data_ptr()  # a lone contiguous gradient is not copied


def test_fused_gradients_cost_one_collective_per_bucket_and_train_bit_for_bit(one_rank_group: object,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Six layers in two parameter groups, fused in buckets of at most 250 bytes: four all-reduces
    per step (groups are never mixed), and the parameters of plain training. On the Python Core,
    whose collectives are counted at ``dist.all_reduce`` (the native Core makes its own in C++)."""
    import torch.distributed as dist
    torch.manual_seed(0)
    layers = [nn.Linear(5, 5) for _ in range(6)]
    reference, model = nn.Sequential(*layers), copy.deepcopy(nn.Sequential(*layers))

    def groups(net: nn.Module) -> list[dict[str, Any]]:
        return [{"params": list(net[:3].parameters())}, {"params": list(net[3:].parameters()), "lr": 0.05}]

    ref_opt = torch.optim.SGD(groups(reference), lr=0.1, momentum=0.9)
    shutdown()  # the module's Core runs with the default configuration
    opt = ScheduledOptimizer(model, torch.optim.SGD(groups(model), lr=0.1, momentum=0.9),
                             config=dataclasses.replace(from_env(), fusion_bytes=250, native="off"))
    assert [b.name for b in opt._pipeline.buckets] == ["0.weight+3", "2.weight+1", "3.weight+3", "5.weight+1"]
    reduced: list[int] = []
    all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, **kw: (reduced.append(tensor.numel()),
                                                                  all_reduce(tensor, **kw))[1])
    train_side_by_side(reference, ref_opt, model, opt)
    assert sorted(reduced) == sorted([60, 30, 60, 30] * 3)


@pytest.mark.parametrize("fixed, collectives", [(False, 5), (True, 8)])
def test_scheduling_off_over_torch_distributed_fuses_as_a_plan_that_stays_out(
        one_rank_group: object, monkeypatch: pytest.MonkeyPatch, fixed: bool, collectives: int) -> None:
    """BYTESCHED_POLICY=off passes through from construction in the buckets a plan that stays out
    would fuse (four layers of 120 bytes, a quarter of the model: the first weight alone, then its
    bias with the next weight and so on, five collectives per step instead of eight), unless the
    job fixed its fusion bound; either way the bits of plain training."""
    import torch.distributed as dist
    torch.manual_seed(0)
    layers = [nn.Linear(5, 5) for _ in range(4)]
    reference, model = nn.Sequential(*layers), copy.deepcopy(nn.Sequential(*layers))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    shutdown()
    off = dataclasses.replace(from_env(), policy="fifo", scheduling=False, plan=False, fusion_bytes=1,
                              fusion_fixed=fixed)
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), config=off)
    assert opt.passes_through and len(opt._pipeline.buckets) == collectives
    reduced: list[int] = []
    all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, **kw: (reduced.append(tensor.numel()),
                                                                  all_reduce(tensor, **kw))[1])
    train_side_by_side(reference, ref_opt, model, opt)
    assert len(reduced) == collectives * 3  # train_side_by_side's three steps


def test_a_plan_that_stays_out_fuses_on_a_gpu_and_where_the_buckets_pass_through() -> None:
    """The fusion bound an optimizer's buckets take where it stays out: not over Horovod on the CPU
    (Horovod fuses by itself; the bound would shape only the Core's path), never once the job
    fixed its bound, and otherwise BYTESCHED_STAY_OUT_FUSION_BYTES, at most a quarter of the model
    (200 MB here: DDP's 25 MB by default, or the job's 2 MB)."""
    from types import SimpleNamespace

    from bytesched.plugins.torch.optimizer import _stay_out_bound
    horovod, distributed = SimpleNamespace(fuses_by_itself=True), SimpleNamespace(fuses_by_itself=False)
    config = dataclasses.replace(from_env(), fusion_bytes=1_000_000)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    model = 200_000_000
    assert [_stay_out_bound(config, cpu, horovod, model), _stay_out_bound(config, gpu, horovod, model),  # type: ignore[arg-type]
            _stay_out_bound(config, cpu, distributed, model)] == [None, 25_000_000, 25_000_000]  # type: ignore[arg-type]
    assert _stay_out_bound(config, cpu, distributed, 20_000_000) == 5_000_000  # type: ignore[arg-type]
    capped = from_env({"BYTESCHED_STAY_OUT_FUSION_BYTES": "2MB"})
    assert _stay_out_bound(capped, gpu, distributed, model) == 2_000_000  # type: ignore[arg-type]
    assert _stay_out_bound(dataclasses.replace(capped, stay_out_fusion_bytes=500_000), gpu, distributed,  # type: ignore[arg-type]
                           model) is None  # not above the 1 MB buckets: they stay as they are
    fixed = dataclasses.replace(config, fusion_fixed=True)
    assert _stay_out_bound(fixed, gpu, distributed, model) is None  # type: ignore[arg-type]


def test_fusing_again_between_steps_keeps_training_bit_for_bit(one_rank_group: object) -> None:
    """Buckets fused again after a step (as a plan that stays out does) train on unchanged."""
    torch.manual_seed(0)
    layers = [nn.Linear(5, 5) for _ in range(4)]
    reference, model = nn.Sequential(*layers), copy.deepcopy(nn.Sequential(*layers))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    shutdown()
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                             config=dataclasses.replace(from_env(), fusion_bytes=1, plan=False))

    def fuse_at_step_3(step: int) -> None:
        if step == 3:
            opt.synchronize()
            opt._pipeline.fuse(1000)
            assert [b.name for b in opt._pipeline.buckets] == ["0.weight", "0.bias+6"]  # the first stays

    train_side_by_side(reference, ref_opt, model, opt, steps=6, before_step=fuse_at_step_3)


def test_fusing_while_a_step_is_under_way_is_refused(one_rank_group: object) -> None:
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5))
    shutdown()
    opt = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             config=dataclasses.replace(from_env(), fusion_bytes=1, plan=False))
    try:
        model(torch.ones(1, 5)).sum().backward()
        with pytest.raises(RuntimeError, match="only be fused again between steps"):
            opt._pipeline.fuse(1000)
        opt.step()
        opt.synchronize()
    finally:
        opt.close()
