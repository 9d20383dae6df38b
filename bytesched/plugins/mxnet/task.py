"""ProxiedTask: a CommTask whose partitions are gated inside MXNet's engine by Dependency Proxies.

Both MXNet plugins (KVStore push/pull, Horovod all-reduce) communicate the same way; only the
backend call differs. :meth:`ProxiedTask.post` puts the whole chain into the engine, in program
order, from the framework's thread (paper §3.3, Figure 6)::

    entry fence     mutates the tensors: waits for every earlier user (e.g. backward still
                    reading a weight the pull will overwrite)
    ready proxies   one per partition; read the tensors, hold that partition's avatars; when
                    the engine runs them the gradient exists -> notify_ready(); each completes
                    only when the Core starts its partition -> CommTask.start()
    backend         the plugin's push/pull or all-reduce of every partition, on the avatars
    finish proxies  one per partition, after the backend wrote its avatars -> notify_finish()
    exit fence      mutates the tensors after all of it: later framework work waits here

A task of one partition posts no fences: its ready and finish proxies mutate the tensors
themselves (csrc/proxies.cc), which orders them as the fences would.

An *avatar* is an NDArray over a partition of the tensor's memory with its own engine variable
(:meth:`ProxyLibrary.make_avatar`). Holding avatars instead of the tensor keeps a delayed
partition from blocking anything but that tensor's next use, and lets the partitions of one
tensor be started, sent and finished independently.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import mxnet as mx

from bytesched.core import CommTask, SubTask

from .proxies import Chain, Fence, ProxyEvents, ProxyLibrary, StoreCall

Arrays = list[mx.nd.NDArray]
Ranges = Sequence[tuple[int, int]]


class Views:
    """Per partition, a plain view of each given tensor's elements ``[start, stop)`` (flattened).

    A view shares its tensor's engine variable, so an operation posted on it waits for the
    tensor as any MXNet operation does: what a store posts when it stays out of the way, with no
    proxy in between (:class:`Avatars` are what the Core's gating needs). Passing through, an
    entry fence goes first: it brings the tensors back to MXNet's default memory layout, which
    MXNet's copy into a view requires and which an MKLDNN operator may have changed (an
    evaluation pass does that to convolution weights; csrc/proxies.cc, "MKLDNN layouts").
    """

    def __init__(self, library: ProxyLibrary, arrays: Arrays, ranges: Ranges) -> None:
        self._library = library
        self.arrays = arrays
        self.ranges = tuple(ranges)
        self.parts: list[Arrays] = self._parts([a.reshape(-1) for a in arrays])

    def _parts(self, flats: Arrays) -> list[Arrays]:
        return [[flat[start:stop] for flat in flats] for start, stop in self.ranges]

    def matches(self, arrays: Arrays, ranges: Ranges) -> bool:
        """Built for these very arrays (identity: memory can move with a new NDArray) and ranges."""
        return (self.ranges == tuple(ranges) and len(arrays) == len(self.arrays)
                and all(a is b for a, b in zip(arrays, self.arrays)))

    def of(self, arrays: Arrays) -> list[Arrays]:
        """Per partition, the views of ``arrays`` (a subset of the tensors, in that order)."""
        position = {a.handle.value: j for j, a in enumerate(self.arrays)}
        return [[part[position[a.handle.value]] for a in arrays] for part in self.parts]

    @functools.cached_property
    def _entry(self) -> Fence:
        return Fence([], list(self.arrays), "bytesched_pass_through_entry", framework=len(self.arrays))

    def pass_through(self, priority: int, communicate: Callable[[], None]) -> None:
        """Post the entry fence, then ``communicate()`` (the backend's operations on these views):
        the engine orders them by the tensors' own variables."""
        self._library.post_fence(self._entry, priority)
        communicate()


class Avatars(Views):
    """Per partition, one avatar of each given tensor's elements ``[start, stop)`` (flattened):
    a view with an engine variable of its own, which the Dependency Proxies gate."""

    @functools.cached_property
    def chain(self) -> Chain:
        """The proxy chain's handle arrays, built at the first post (fenced avatars never need them)."""
        return Chain(self.arrays, self.parts)

    def _parts(self, flats: Arrays) -> list[Arrays]:
        return [[self._library.make_avatar(view) for view in part] for part in super()._parts(flats)]


class FencedAvatars(Avatars):
    """Avatars that a store passing through brackets with two fences instead of the proxy chain.

    Views of one tensor share its engine variable, and MXNet's dist store posts each server key's
    push+pull as a writer of the gradient it sends: the partitions of a tensor passed through on
    views would run one after another, each a full round trip to one server, while MXNet's own
    call of the whole tensor sends its per-server slices at once. On avatars the partitions run
    concurrently; the entry fence (a writer of the tensors and of every avatar, which also brings
    the tensors back to the default layout, as :class:`Views`' does) makes them wait for the
    gradient and for the weight's last reader, and the exit fence (a reader of the avatars, a
    writer of the tensors) makes the tensors' next users wait for all of them. No Core, proxy or
    event is involved."""

    @functools.cached_property
    def _entry(self) -> Fence:
        avatars = [a for part in self.parts for a in part]
        return Fence([], list(self.arrays) + avatars, "bytesched_pass_through_entry", framework=len(self.arrays))

    @functools.cached_property
    def _exit(self) -> Fence:
        return Fence([a for part in self.parts for a in part], self.arrays, "bytesched_pass_through_exit")

    def pass_through(self, priority: int, communicate: Callable[[], None]) -> None:
        super().pass_through(priority, communicate)
        self._library.post_fence(self._exit, priority)


def unique_arrays(arrays: Arrays) -> Arrays:
    """``arrays`` without repeats (the engine rejects a variable listed twice)."""
    return list({a.handle.value: a for a in arrays}.values())


class ProxiedTask(CommTask):
    """A CommTask over fixed element ranges of its tensors, gated by Dependency Proxies.

    The ranges are fixed when the task is created, because the engine operations of every
    partition are posted right then; :meth:`partition` returns them whatever size the Core asks
    (the plugins lay tensors out at the Core's partition size, and apply a new size to tasks
    created after it).
    """

    def __init__(self, name: str, priority: int, ranges: Ranges, itemsize: int, events: ProxyEvents) -> None:
        super().__init__(name, priority, sum(b - a for a, b in ranges) * itemsize)
        self.ranges = tuple(ranges)
        self.itemsize = itemsize
        self.events = events
        self.token = events.register(self)

    def partition(self, size: float) -> list[tuple[int, int]]:
        return [(i, (b - a) * self.itemsize) for i, (a, b) in enumerate(self.ranges)]

    def start(self, subtask: SubTask) -> None:
        if not self.released_on_ready:  # else its ready proxy completed by itself (see post)
            self.events.library.release(self.token, subtask.index)

    def proxy_ready(self) -> None:
        self.notify_ready()

    def proxy_finished(self, index: int) -> None:
        subtasks = self.subtasks  # assigned once, by the Core thread's enqueue
        if index < len(subtasks):
            self.notify_finish(subtasks[index])
        else:  # released on ready and done before the Core thread partitioned the task: finish
            # it there, after the enqueue and ready events that are ahead of this one in its queue
            self.core.call_soon(lambda: self.notify_finish(self.subtasks[index]))  # type: ignore[union-attr]  # enqueued

    def on_finish(self) -> None:
        self.events.forget(self.token)

    def on_error(self, error: BaseException) -> None:
        self.events.forget(self.token)
        self.events.library.drain()  # the Core failed or stopped: nothing may stay blocked in the engine

    def post(self, avatars: Avatars, priority: int, communicate: Callable[[], None]) -> None:
        """Post the proxy chain around ``communicate()`` (which posts the backend's operations on
        ``avatars``), with ``avatars.arrays`` as the framework's tensors. Call after the task
        was enqueued: a READY event may come at once."""
        lib = self.events.library
        lib.post_entry(self.token, avatars.chain, priority, self._release_on_ready())
        communicate()
        lib.post_exit(self.token, avatars.chain, priority)

    def post_store_call(self, avatars: Avatars, call: StoreCall, priority: int) -> None:
        """:meth:`post` around a KVStore's own push or pull (``call``, on ``avatars``), which the
        library makes between the chain's head and tail: one call into it for the whole chain."""
        self.events.library.post_store_chain(self.token, avatars.chain, call, priority, self._release_on_ready())

    def _release_on_ready(self) -> bool:
        """Where the Core would start every partition on readiness anyway, the ready proxies
        complete by themselves once they ran (:attr:`CommTask.released_on_ready`): a partition's
        push or all-reduce then follows the gradient without a wake-up of the Core thread in
        between, which on the 4-worker PS cost more than scheduling saved."""
        self.released_on_ready = self.core is not None and self.core.releases_on_ready()
        return self.released_on_ready
