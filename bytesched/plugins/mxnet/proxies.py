"""Python side of the MXNet Dependency Proxies (csrc/proxies.cc), loaded with ctypes.

The C++ library posts the proxy operations into MXNet's engine and queues their events; this
module loads it, wraps its calls, makes avatars, and is the event source the bytesched Core's
thread waits on (:class:`ProxyEvents`, :meth:`bytesched.core.Core.wait_on`): the Core turns queued
engine events into :meth:`CommTask.notify_ready` / :meth:`CommTask.notify_finish` itself. Engine
threads never enter Python: they only push to the library's queue.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from pathlib import Path
from typing import Callable, Protocol, Sequence

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, NDArrayHandle, check_call

from bytesched.runtime import ENGINE, track

log = logging.getLogger("bytesched")

LIBRARY = Path(__file__).resolve().parent / "libbytesched_mxnet.so"
ABI_VERSION = 9
EVENT_READY = 1
EVENT_FINISH = 2
BUILD_HINT = ("build it with `.venv/bin/python csrc/build.py` (scripts/setup.sh does this; it "
              "needs g++ and the mxnet wheel's headers)")


class ProxyLibraryError(RuntimeError):
    """The proxy library is missing, stale, or one of its calls failed."""


def handle_array(arrays: Sequence[mx.nd.NDArray]) -> ctypes.Array:
    """``arrays``' NDArray handles as the C array MXNet's C API takes (the arrays must outlive it)."""
    return (ctypes.c_void_p * len(arrays))(*[a.handle.value for a in arrays])


class ProxyLibrary:
    """The loaded ``libbytesched_mxnet.so``: posts proxies and fences, releases proxies.

    Calls that keep the GIL. Posting and releasing are called through ``ctypes.PyDLL``, which
    keeps the GIL for the call, instead of ``CDLL``, which lets it go and then has to win it
    back. They take a few microseconds; winning the GIL back from a thread running Python (the
    training loop, MXNet's custom operators, the Core) can take up to the interpreter's switch
    interval, and the Core releases every partition with such a call (the figures:
    docs/experiments/per-tensor-cost.md, "Figures behind the MXNet plugin's posting rules").
    It is safe because these calls only take the library's
    own lock and the engine's, which no thread holds while waiting for the GIL: engine threads
    never enter Python here (see the module doc). :meth:`post_store` and :meth:`post_store_chain`
    make a KVStore's push or pull, which only posts engine operations too, except that a store
    without servers runs its updater inline: a Python callback, on this thread, which already
    holds the GIL. :meth:`wake` is such a call too. The one blocking call, the wait for events
    (:meth:`event_buffer`), and the rare ones go through ``CDLL``.
    """

    def __init__(self, path: Path = LIBRARY) -> None:
        if not path.exists():
            raise ProxyLibraryError(f"the MXNet Dependency Proxy library {path} does not exist: {BUILD_HINT}")
        try:
            lib = ctypes.CDLL(str(path))
            held = ctypes.PyDLL(str(path))  # the same library; see "Calls that keep the GIL"
        except OSError as error:
            raise ProxyLibraryError(f"cannot load {path} ({error}): rebuild it; {BUILD_HINT}") from error
        if lib.bs_abi_version() != ABI_VERSION:
            raise ProxyLibraryError(f"{path} is a stale build (interface {lib.bs_abi_version()}, "
                                    f"expected {ABI_VERSION}): {BUILD_HINT}")
        u64, i32, vp = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
        lib.bs_last_error.restype = ctypes.c_char_p
        lib.bs_next_events.argtypes = [vp, vp, vp, i32, ctypes.c_int64]
        lib.bs_make_avatar.argtypes = [vp, ctypes.POINTER(vp)]
        held.bs_post_entry.argtypes = [u64, i32, vp, i32, vp, i32, i32, i32]
        held.bs_post_exit.argtypes = [u64, i32, vp, i32, vp, i32, i32]
        held.bs_post_store_chain.argtypes = [u64, i32, vp, i32, vp, i32, vp, ctypes.c_uint32, vp, vp,
                                             ctypes.c_uint32, vp, vp, i32, i32]
        held.bs_post_store.argtypes = [vp, ctypes.c_uint32, vp, vp, ctypes.c_uint32, vp, vp, i32]
        held.bs_release.argtypes = [u64, i32]
        held.bs_wake.argtypes = []
        held.bs_post_copies.argtypes = [vp, vp, vp, i32, vp, i32, vp, i32, i32, ctypes.c_char_p]
        held.bs_post_fence.argtypes = [vp, i32, vp, i32, i32, i32, ctypes.c_char_p]
        self._lib = lib
        self._held = held
        self.path = path

    def _check(self, status: int, what: str) -> None:
        if status < 0:
            raise ProxyLibraryError(f"{what}: {self._lib.bs_last_error().decode(errors='replace')}")

    def post_entry(self, task: int, chain: "Chain", priority: int, released_on_ready: bool = False) -> None:
        """The head of ``task``'s chain: the entry fence (none for one partition: its ready proxy
        writes the tensors instead), then one ready proxy per partition
        (proxy i reads the tensors and holds partition i's avatars until :meth:`release`, or,
        ``released_on_ready``, only until it has run and queued the task's READY event)."""
        self._check(self._held.bs_post_entry(task, *chain.arguments, priority, int(released_on_ready)),
                    "posting the entry fence and ready proxies")

    def post_store_chain(self, task: int, chain: "Chain", call: "StoreCall", priority: int,
                         released_on_ready: bool = False) -> None:
        """``task``'s whole chain around a KVStore's own operation on its avatars (``call``), in
        one call: :meth:`post_entry`, the store's push, pull or pushpull, :meth:`post_exit`."""
        self._check(self._held.bs_post_store_chain(task, *chain.arguments, *call.arguments, priority,
                                                   int(released_on_ready)),
                    "posting a proxy chain around the KVStore's operation")

    def post_store(self, call: "StoreCall", priority: int) -> None:
        """A KVStore's own push, pull or pushpull (``call``) alone: what a store passing through posts."""
        self._check(self._held.bs_post_store(*call.arguments, priority), "posting the KVStore's operation")

    def release(self, task: int, index: int) -> None:
        """Let ready proxy ``index`` of ``task`` complete, so its push/pull may run."""
        self._check(self._held.bs_release(task, index), f"releasing proxy {index} of task {task}")

    def post_exit(self, task: int, chain: "Chain", priority: int) -> None:
        """The tail of ``task``'s chain: one finish proxy per partition, after whatever last
        wrote its avatars, then the exit fence that hands the tensors back to the framework
        (none for one partition: its finish proxy writes the tensors instead)."""
        self._check(self._held.bs_post_exit(task, *chain.arguments, priority),
                    "posting the finish proxies and exit fence")

    def post_copies(self, copies: "Copies", priority: int) -> None:
        """Post ``copies`` (one engine operation)."""
        self._check(self._held.bs_post_copies(*copies.arguments, priority, copies.name), "posting copies")

    def post_fence(self, fence: "Fence", priority: int) -> None:
        """Post ``fence`` (one engine operation that orders, see :class:`Fence`)."""
        self._check(self._held.bs_post_fence(*fence.arguments, priority, fence.name), "posting a fence")

    def to_default_layout(self, arrays: Sequence[mx.nd.NDArray], priority: int = 0) -> None:
        """Post an operation that brings ``arrays`` back to MXNet's default memory layout where an
        MKLDNN operator left them in a blocked one (a :class:`Fence` writing them): operations
        posted after it on views of them (a store's init from flat slices) then see the layout
        MXNet's copies into and out of views require (csrc/proxies.cc, "MKLDNN layouts")."""
        self.post_fence(Fence([], arrays, "bytesched_default_layout", framework=len(arrays)), priority)

    def make_avatar(self, array: mx.nd.NDArray) -> mx.nd.NDArray:
        """A new NDArray over ``array``'s memory with its own engine variable."""
        out = ctypes.c_void_p()
        self._check(self._lib.bs_make_avatar(array.handle, ctypes.byref(out)), "making an avatar")
        return mx.nd.NDArray(NDArrayHandle(out.value))

    def drain(self) -> int:
        """Release every open proxy and complete later ones at once (shutdown)."""
        return int(self._lib.bs_drain())

    def close(self) -> None:
        """Make every wait for events return: from now on :meth:`EventBuffer.next` answers None
        once the queue is empty."""
        self._lib.bs_close()

    def wake(self) -> None:
        """Make the current wait for events return now, or the next one at once."""
        self._held.bs_wake()

    def event_buffer(self, capacity: int) -> "EventBuffer":
        """What waits for queued events and takes up to ``capacity`` of them at a time."""
        return EventBuffer(self._lib.bs_next_events, self._check, capacity)


class EventBuffer:
    """Where :meth:`next` copies queued (kind, task, index) events: made once, since the Core
    thread drains the library's queue after every wake-up."""

    def __init__(self, next_events: Callable[..., int], check: Callable[[int, str], None], capacity: int) -> None:
        self._next_events = next_events
        self._check = check
        self.capacity = capacity
        self._kinds = (ctypes.c_int32 * capacity)()
        self._indices = (ctypes.c_int32 * capacity)()
        self._tasks = (ctypes.c_uint64 * capacity)()

    def next(self, timeout: float | None) -> list[tuple[int, int, int]] | None:
        """Up to :attr:`capacity` queued events, waiting (without the GIL) up to ``timeout``
        seconds (None: until one comes) or until :meth:`ProxyLibrary.wake`; ``None`` once the
        library was closed and its queue is empty."""
        micros = -1 if timeout is None else math.ceil(timeout * 1e6)
        n = self._next_events(self._kinds, self._indices, self._tasks, self.capacity, micros)
        if n == -2:
            return None
        self._check(n, "waiting for proxy events")
        kinds, tasks, indices = self._kinds, self._tasks, self._indices
        return [(kinds[i], tasks[i], indices[i]) for i in range(n)]


def _data_pointer(array: mx.nd.NDArray) -> int:
    """The address of ``array``'s first element (MXNet's own ``MXNDArrayGetData``)."""
    pointer = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer.value or 0


class Chain:
    """The arrays of one task's proxy chain, as the handle arrays the library takes.

    Built once per tensor layout and reused every step: a submission then costs two library
    calls and no list building; rebuilding them and calling four times per key spent most of the
    posting's time waiting to win the GIL back (docs/experiments/per-tensor-cost.md, "Figures
    behind the MXNet plugin's posting rules").

    ``parts[i]`` are partition i's avatars, held by ready proxy i and written by the backend;
    ``tensors`` are the framework's arrays the fences order (may be empty).
    """

    def __init__(self, tensors: Sequence[mx.nd.NDArray], parts: Sequence[Sequence[mx.nd.NDArray]]) -> None:
        if not parts or any(len(part) != len(parts[0]) or not part for part in parts):
            raise ValueError("a proxy chain needs at least one partition, each with the same "
                             "non-zero number of avatars")
        self._arrays = (list(tensors), [list(part) for part in parts])  # their handles stay valid
        # bs_post_entry's and bs_post_exit's arguments between the task token and the priority
        self.arguments = (len(parts), handle_array(tensors), len(tensors),
                          handle_array([a for part in parts for a in part]), len(parts[0]))


class StoreCall:
    """A KVStore's push, pull or pushpull of server keys, as :meth:`ProxyLibrary.post_store` and
    :meth:`ProxyLibrary.post_store_chain` take it: ``values[i]`` are pushed to ``keys[i]`` and
    ``outs[i]`` pulled from it (a pushpull where there are both: one request per key, which a
    ``dist_sync`` server answers in one round trip). Built once per key and arrays, as a
    :class:`Chain` is.

    Made by the library, the store's operation costs the training thread no call into MXNet's
    Python API, which converts its arguments on every call and lets go of the GIL, then has to win
    it back from the Core's thread and the engine's: twice what the library's call costs
    (docs/experiments/per-tensor-cost.md, "Figures behind the MXNet plugin's posting rules").
    """

    def __init__(self, store: mx.kv.KVStore, keys: Sequence[int], values: Sequence[Sequence[mx.nd.NDArray]],
                 outs: Sequence[Sequence[mx.nd.NDArray]]) -> None:
        if not any(values) and not any(outs):
            raise ValueError("a KVStore call needs values to push or outs to pull into")
        self._arrays = (store, [list(v) for v in values], [list(o) for o in outs])  # their handles stay valid
        self.arguments = (store.handle, *self._flat(keys, values), *self._flat(keys, outs))

    @staticmethod
    def _flat(keys: Sequence[int], arrays: Sequence[Sequence[mx.nd.NDArray]]) -> tuple[int, ctypes.Array, ctypes.Array]:
        """One key per array, as MXNet's C API takes them: count, keys, handles."""
        flat = [(key, array) for key, per_key in zip(keys, arrays) for array in per_key]
        return (len(flat), (ctypes.c_int * len(flat))(*[key for key, _ in flat]),
                handle_array([array for _, array in flat]))


class Fence:
    """An engine operation that orders: after every earlier user of ``reads`` (as their reader)
    and ``writes`` (as their writer), before every later one. Its only work: the first
    ``framework`` of ``writes``, the framework's arrays, are brought back to MXNet's default
    memory layout where an MKLDNN operator left them in a blocked one (csrc/proxies.cc, "MKLDNN
    layouts"), before communication writes their memory. Its handle arrays are built once, as a
    :class:`Chain`'s are."""

    def __init__(self, reads: Sequence[mx.nd.NDArray], writes: Sequence[mx.nd.NDArray], name: str,
                 framework: int = 0) -> None:
        self._arrays = (list(reads), list(writes))  # their handles stay valid
        self.name = name.encode()
        self.arguments = (handle_array(reads), len(reads), handle_array(writes), len(writes), framework)


class Copies:
    """Copies between same-sized arrays as one engine operation (a fusion bucket's pack or
    unpack), with none of the shared temp space MXNet's ``concat`` and ``identity`` draw.

    The operation orders as a reader of ``reads`` and a writer of ``writes``, the arrays that own
    the memory of the pieces' sources and targets (views share their base's engine variable, which
    the engine accepts only once: the caller names the owners). The addresses are taken now, once,
    as avatars take theirs: the arrays must be allocated, and posting then costs one call
    whatever the number of pieces.
    """

    def __init__(self, library: ProxyLibrary, pieces: Sequence[tuple[mx.nd.NDArray, mx.nd.NDArray]],
                 reads: Sequence[mx.nd.NDArray], writes: Sequence[mx.nd.NDArray], name: str) -> None:
        for source, target in pieces:
            if source.size != target.size or source.dtype != target.dtype:
                raise ValueError(f"{name}: cannot copy {source.size} x {np.dtype(source.dtype).name} into "
                                 f"{target.size} x {np.dtype(target.dtype).name}")
        n = len(pieces)
        self.library = library
        self.name = name.encode()
        self._arrays = (list(pieces), list(reads), list(writes))  # their handles and memory stay valid
        self.arguments = ((ctypes.c_void_p * n)(*[_data_pointer(s) for s, _ in pieces]),
                          (ctypes.c_void_p * n)(*[_data_pointer(t) for _, t in pieces]),
                          (ctypes.c_uint64 * n)(*[s.size * np.dtype(s.dtype).itemsize for s, _ in pieces]), n,
                          handle_array(reads), len(reads), handle_array(writes), len(writes))

    def post(self, priority: int = 0) -> None:
        """Post the copies: they run once everything earlier on ``reads`` and ``writes`` has."""
        self.library.post_copies(self, priority)


class ProxyTarget(Protocol):
    """What a proxy event is delivered to (a CommTask of the plugin)."""

    def proxy_ready(self) -> None:
        """Every ready proxy of the task has run: the tensor exists."""

    def proxy_finished(self, index: int) -> None:
        """Partition ``index``'s communication has written its data."""


class ProxyEvents:
    """The process's proxy tokens, and the event source the Core's thread waits on
    (:class:`bytesched.core.core.EventSource`).

    A token names one task's proxies in the C++ library. The plugins have their Core wait on this
    source (:meth:`bytesched.core.Core.wait_on`) before they post a chain: the Core's thread then
    sleeps in the library's blocking wait (the GIL is released there), costs nothing while the
    engine is quiet, and takes events in batches, so thousands of tiny partitions cost one wake-up
    per batch rather than one per partition. A thread of this module's own that handed every
    batch on to the Core's queue cost a second wake-up and GIL hand-off per batch
    (docs/experiments/per-tensor-cost.md, "Figures behind the MXNet plugin's posting rules").
    """

    BATCH = 256

    def __init__(self, library: ProxyLibrary) -> None:
        self.library = library
        self._buffer = library.event_buffer(self.BATCH)
        self._targets: dict[int, ProxyTarget] = {}
        self._next = 1
        self._lock = threading.Lock()
        self.wake = library.wake
        """Make the current :meth:`wait` return now, or the next one at once (from any thread)."""
        track(self, ENGINE)  # released by bytesched.runtime.shutdown once the plugins' objects closed

    def register(self, target: ProxyTarget) -> int:
        """A fresh token whose events go to ``target`` until :meth:`forget`."""
        with self._lock:
            token = self._next
            self._next += 1
            self._targets[token] = target
        return token

    def forget(self, token: int) -> None:
        with self._lock:
            self._targets.pop(token, None)

    def close(self, timeout: float = 5.0) -> None:
        """At shutdown: release every proxy (MXNet waits for all engine operations when the
        process ends, so none may stay open) and end waiting: the Core's thread delivers what is
        queued, then waits on its own queue alone."""
        self.library.drain()
        self.library.close()

    def wait(self, timeout: float | None) -> bool:
        """Deliver the queued events to their targets, on this thread, after waiting up to
        ``timeout`` seconds (None: as long as it takes) for one or for :meth:`wake`; False once
        the library was closed and nothing is left to deliver."""
        events = self._buffer.next(timeout)
        if events is None:
            return False
        targets = self._targets
        for kind, token, index in events:
            target = targets.get(token)
            if target is None:
                log.error("proxy event (%d, partition %d) for unknown task token %d", kind, index, token)
                continue
            try:
                if kind == EVENT_READY:
                    target.proxy_ready()
                else:
                    target.proxy_finished(index)
            except Exception:  # one bad task must not stop delivery to the others
                log.exception("delivering proxy event (%d, task %d, partition %d) failed", kind, token, index)
        return True


_events: ProxyEvents | None = None
_lock = threading.Lock()


def events() -> ProxyEvents:
    """The process's proxy library and its events (loaded once)."""
    global _events
    with _lock:
        if _events is None:
            _events = ProxyEvents(ProxyLibrary())
        return _events
