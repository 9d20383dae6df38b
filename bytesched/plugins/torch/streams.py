"""Ordering tensor work across threads on CUDA streams.

On a CPU a tensor operation has finished when the call returns, so handing a tensor to another
thread through a lock or a queue is enough. On a GPU a call only *enqueues* a kernel on the calling
thread's current stream (``torch.cuda.current_stream()`` is per thread: another thread enqueues on
its own current stream, the device's default stream unless it set one), and the kernel runs later.
A gradient that the autograd thread has "accumulated" may not hold its value yet when the Core
thread starts its all-reduce, and an update the update thread "applied" may still be running when
the next forward pass reads the parameter.

The rule bytesched follows, everywhere a tensor crosses a thread:

    the producing thread records a :class:`Mark` (a CUDA event) on its current stream when it
    hands the tensor over, and the consuming thread makes *its* current stream wait for that mark
    before it enqueues work that reads or writes the tensor.

Waiting is ``cudaStreamWaitEvent``: the host never blocks, only the consumer's later kernels are
held back on the device. On a CPU tensor a mark is None and waiting on it does nothing, so the
rule costs nothing there.

Collectives are issued from the Core thread inside :func:`comm_stream`: c10d (NCCL and Gloo) and
Horovod order their own streams after the *current* stream at the moment of the call. Issued on the
device's default stream, a partition's all-reduce would wait for every kernel queued there so far,
including the backward of layers computed after its gradient; issued on a side stream that waited
only for the gradient's mark, it starts as soon as its gradient is computed.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Iterator, Optional

import torch

Mark = Optional["torch.cuda.Event"]
"""Where a producer's stream stood when it handed a tensor over (None: nothing to order)."""


def mark(device: torch.device) -> Mark:
    """A mark on the calling thread's current stream of ``device`` (None unless CUDA)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def wait(marks: Iterable[Mark], device: torch.device) -> None:
    """Make the calling thread's current stream of ``device`` wait for every mark (no host wait)."""
    if device.type != "cuda":
        return
    stream = torch.cuda.current_stream(device)
    for event in marks:
        if event is not None:
            stream.wait_event(event)


def keep_alive(tensors: Iterable[torch.Tensor], device: torch.device) -> None:
    """Tell the CUDA caching allocator that ``tensors`` are used on the calling thread's current
    stream, so that memory freed by another thread (``param.grad = None``) is not handed out again
    before this stream's work on it has run."""
    if device.type != "cuda":
        return
    stream = torch.cuda.current_stream(device)
    for tensor in tensors:
        tensor.record_stream(stream)


_side_streams: dict[int, "torch.cuda.Stream"] = {}
_side_lock = threading.Lock()


@contextlib.contextmanager
def comm_stream(device: torch.device) -> Iterator[None]:
    """Run the block with bytesched's communication stream of ``device`` as the current stream
    (one per device, created on first use); on a CPU device, as it is."""
    if device.type != "cuda":
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side_streams.get(index)
    if stream is None:
        with _side_lock:
            stream = _side_streams.setdefault(index, torch.cuda.Stream(device=index))
    with torch.cuda.stream(stream):
        yield
