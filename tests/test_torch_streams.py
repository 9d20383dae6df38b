"""What a GPU changes for the PyTorch plugin, checked on CPU.

- Backends may write their result back with a tensor copy (Gloo's CUDA path stages through host
  memory), which bumps the written tensor's version counter: bytesched must not take that for the
  user modifying a gradient in place, and must still catch the user doing it.
- Every tensor handed from one thread to another is ordered on the CUDA streams by a mark the
  producer records and the consumer waits for (bytesched.plugins.torch.streams). On CPU marks are
  None, so the test records them instead and checks, at each consumer, that it waited for the
  producer's mark before it worked on the tensor.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Iterable

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bytesched.core import shutdown
from bytesched.plugins.torch import BarrierCrossingError, ScheduledOptimizer
from bytesched.plugins.torch import optimizer as optimizer_module
from bytesched.plugins.torch import streams
from bytesched.plugins.torch.distributed import DistributedBackend
from bytesched.plugins.torch.fusion import pack


class CopyBackBackend(DistributedBackend):
    """torch.distributed, reducing a staged copy and writing the result back with ``copy_`` once
    the collective completes: what ProcessGroupGloo does for CUDA tensors."""

    def start(self, task: Any, sub: Any) -> None:
        staged = sub.payload.clone()
        work = dist.all_reduce(staged, op=dist.ReduceOp.SUM, group=self._group, async_op=True)

        def done(future: torch.futures.Future) -> None:
            future.value()
            sub.payload.copy_(staged)
            task.finish(sub)

        work.get_future().then(done)


def model_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))
    return model, copy.deepcopy(model)


def scheduled(model: nn.Module, monkeypatch: pytest.MonkeyPatch, backend: type = CopyBackBackend,
              **options: Any) -> ScheduledOptimizer:
    """ScheduledOptimizer over a one-rank Gloo group through ``backend``, with partitions of
    64 bytes so that every gradient is split and each piece is written back separately."""
    monkeypatch.setattr(optimizer_module, "make_backend", lambda optimizer, group: backend(group))
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "64")
    monkeypatch.setenv("BYTESCHED_FUSION_BYTES", "1")  # fusion off
    shutdown()  # a Core with this test's settings
    return ScheduledOptimizer(model, torch.optim.Adam(model.parameters(), lr=1e-2), **options)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 6, generator=gen), torch.randn(4, 2, generator=gen)) for _ in range(steps)]


def test_a_lone_gradient_is_packed_without_copy_and_without_sharing_its_version() -> None:
    grad = torch.ones(3, 2)
    flat = pack([grad])
    before = grad._version
    flat.mul_(2.0)  # what a backend does to the wire buffer
    assert flat.data_ptr() == grad.data_ptr() and grad.tolist() == [[2.0, 2.0]] * 3
    assert grad._version == before
    grad.add_(1.0)  # what the user does to the gradient
    assert grad._version == before + 1


@pytest.mark.parametrize("cross_barrier", [True, False])
def test_a_backend_that_writes_back_by_copy_trains_bit_for_bit(one_rank_group: object, cross_barrier: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU failure mode reproduced on CPU: every piece's result lands by ``copy_``. Training
    runs, and gives the bits of plain training (one rank: the average is the gradient)."""
    reference, model = model_pair()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    opt = scheduled(model, monkeypatch, cross_barrier=cross_barrier)
    try:
        for x, y in batches(5):
            for net, optimizer in ((reference, ref_opt), (model, opt)):
                optimizer.zero_grad()
                (net(x) - y).square().sum().backward()
                optimizer.step()
        opt.synchronize()
    finally:
        opt.close()
    for a, b in zip(reference.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_the_user_clipping_between_backward_and_step_is_still_caught(one_rank_group: object,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the same copy-back backend, clipping while crossing the barrier raises the error that
    names the ways out."""
    _, model = model_pair()
    opt = scheduled(model, monkeypatch)
    with pytest.raises(BarrierCrossingError, match=r"modified in place.*synchronize\(\)"):
        try:
            for x, y in batches(3):
                opt.zero_grad()
                (model(x) - y).square().sum().backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
                opt.step()
            opt.synchronize()
        finally:
            opt.close(timeout=10.0)


class MarkRecorder:
    """Stands in for CUDA events: ``mark`` returns a fresh token, ``wait`` remembers which tokens
    each thread waited for. A consumer calls :meth:`check` before it works on a tensor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waited: dict[int, set[object]] = {}
        self.marks = 0
        self.problems: list[str] = []

    def mark(self, device: torch.device) -> object:
        with self._lock:
            self.marks += 1
        return object()

    def wait(self, marks: Iterable[object], device: torch.device) -> None:
        with self._lock:
            self.waited.setdefault(threading.get_ident(), set()).update(m for m in marks if m is not None)

    def check(self, what: str, marks: Iterable[object]) -> None:
        marks = list(marks)
        with self._lock:
            seen = self.waited.get(threading.get_ident(), set())
            if any(m is None for m in marks):
                self.problems.append(f"{what} on {threading.current_thread().name}: a mark was never recorded")
            elif not all(m in seen for m in marks):
                self.problems.append(f"{what} on {threading.current_thread().name}: did not wait for its marks")


@pytest.mark.parametrize("cross_barrier", [True, False])
def test_every_hand_over_between_threads_waits_for_the_producers_mark(one_rank_group: object, cross_barrier: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Ready -> the Core thread's collective; completion -> finalising on the update thread;
    reduced -> the training thread (barrier mode); applied -> the next forward's reads. On the
    Python Core: the marks stand in for CUDA events, and the native Core runs on the CPU only."""
    monkeypatch.setenv("BYTESCHED_NATIVE", "off")
    recorder = MarkRecorder()
    monkeypatch.setattr(streams, "mark", recorder.mark)
    monkeypatch.setattr(streams, "wait", recorder.wait)
    reference, model = model_pair()
    opt = scheduled(model, monkeypatch, backend=DistributedBackend, cross_barrier=cross_barrier)
    backend, pipeline = opt._backend, opt._pipeline
    start, finalize = backend.start, backend.finalize

    def checked_start(task: Any, sub: Any) -> None:
        recorder.check(f"all-reduce of {task.name}", [task.ready])
        start(task, sub)

    def checked_finalize(task: Any) -> None:
        assert task.communicated  # one mark per piece
        recorder.check(f"finalising {task.name}", task.communicated)
        finalize(task)

    monkeypatch.setattr(backend, "start", checked_start)
    monkeypatch.setattr(backend, "finalize", checked_finalize)
    slot_of = {id(slot.param): slot for slot in pipeline.slots}
    applied_reads = 0

    def reads(module: nn.Module, args: Any) -> None:  # runs after bytesched's forward proxies
        nonlocal applied_reads
        for param in module.parameters(recurse=False):
            slot = slot_of[id(param)]
            if slot.applied is not None:
                applied_reads += 1
                recorder.check(f"forward read of {slot.name}", [slot.applied])

    hooks = [m.register_forward_pre_hook(reads) for m in model if list(m.parameters(recurse=False))]
    try:
        for x, y in batches(4):
            opt.zero_grad()
            (model(x) - y).square().sum().backward()
            if not cross_barrier:  # backward returned with the gradients reduced: the user may read them
                recorder.check("reading reduced gradients", [t.reduced_mark for t in pipeline._round])
            opt.step()
        opt.synchronize()
    finally:
        for hook in hooks:
            hook.remove()
        opt.close()
    assert not recorder.problems, recorder.problems
    assert recorder.marks > 0
    if cross_barrier:
        assert applied_reads == 3 * 3 * 2  # three layers of two parameters, read after each update
