"""Watching MXNet's first forward pass: the operators it runs while autograd records.

The priority of a gradient is the order in which the forward pass first reads its parameter
(:mod:`bytesched.core.forward`), not the Trainer's index: ``gluon.Trainer(net.collect_params())``
numbers a dict by sorted name (``conv10`` before ``conv2``). Gluon has no hook for "a parameter
was read", and neither the store nor Horovod's optimizer sees the network. But every operator an
imperative block runs goes through one call, ``_imperative_invoke`` (looked up at each call in
``mxnet.ndarray.register``, where MXNet generates the operator functions), and a hybridized
block's through ``CachedOp.__call__``, which lists the block's inputs and parameters in its
graph's order. While a :class:`ForwardWatch` is on, both are wrapped: each call made while
autograd records (the training forward pass and its loss; not initialisation, evaluation or data
loading) is handed to every watching recorder with its input and output arrays, identified by
their handles. A parameter is known by its arrays (one per context): the store sees them at
``init``/``broadcast``, the optimizer through the Trainer's ``param_dict``.

A plugin starts watching when it is made (before the first forward pass: the Trainer calls the
store and the optimizer only from its first ``step``). The watch ends at the first backward pass
(``NDArray.backward`` or ``autograd.backward``, wrapped as well), or at the plugin's first
communication if that comes first: the recorder keeps every array it saw alive, since a freed
array's handle is soon another array's (a parameter created by deferred initialisation inside
the pass, say), and autograd keeps the forward pass's arrays until that backward pass anyway.
The wrappers go once no watch is on. MXNet's symbolic Module API runs its symbol's executors,
which this does not see: nothing is recorded there, and the order given stays (Module's is its
symbol's argument order, a topological order of its graph).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Hashable, Iterator

import mxnet as mx
import mxnet.ndarray.register as _register
from mxnet.ndarray import _internal

from bytesched.core.forward import ForwardPass, ForwardRecorder

log = logging.getLogger("bytesched")

_lock = threading.Lock()
_watches: list["ForwardWatch"] = []
_originals: tuple[Callable[..., Any], ...] | None = None


def handle_of(array: mx.nd.NDArray) -> Hashable:
    """An NDArray's identity: its handle (two arrays alive at once never share one)."""
    return array.handle.value


def _arrays(result: Any) -> Iterator[mx.nd.NDArray]:
    if isinstance(result, mx.nd.NDArray):
        yield result
    elif isinstance(result, (list, tuple)):
        for item in result:
            yield from _arrays(item)


def _record(inputs: Any, result: Any) -> None:
    if _watches and mx.autograd.is_recording():
        outputs = list(_arrays(result))
        for watch in list(_watches):
            watch.recorder.op(_arrays(inputs), outputs)


def _install() -> None:
    global _originals
    invoke, call = _register._imperative_invoke, _internal.CachedOp.__call__
    array_backward, backward = mx.nd.NDArray.backward, mx.autograd.backward

    def traced_invoke(handle: Any, ndargs: Any, keys: Any, vals: Any, out: Any, *rest: Any) -> Any:
        result = invoke(handle, ndargs, keys, vals, out, *rest)
        _record(ndargs, result)
        return result

    def traced_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = call(self, *args, **kwargs)
        _record(args, result)
        return result

    def traced_array_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        _end_of_pass()
        return array_backward(self, *args, **kwargs)

    def traced_backward(*args: Any, **kwargs: Any) -> Any:
        _end_of_pass()
        return backward(*args, **kwargs)

    _register._imperative_invoke = traced_invoke
    mx.nd.NDArray.backward = traced_array_backward
    mx.autograd.backward = traced_backward
    try:
        _internal.CachedOp.__call__ = traced_call
    except TypeError:  # MXNet's Cython build: its CachedOp cannot be wrapped
        log.info("bytesched: hybridized blocks are not traced (MXNet's Cython CachedOp); their parameters "
                 "keep the order given")
    _originals = (invoke, call, array_backward, backward)


def _uninstall() -> None:
    global _originals
    if _originals is None:
        return
    invoke, call, array_backward, backward = _originals
    _register._imperative_invoke = invoke
    mx.nd.NDArray.backward = array_backward
    mx.autograd.backward = backward
    if _internal.CachedOp.__call__ is not call:
        _internal.CachedOp.__call__ = call
    _originals = None


def _end_of_pass() -> None:
    """A backward pass begins: the forward pass it follows is every watch's (module doc)."""
    with _lock:
        for watch in list(_watches):
            watch._end()


class ForwardWatch:
    """Records the operators run while autograd records, from now until the first backward pass
    or :meth:`stop`."""

    def __init__(self) -> None:
        self.recorder = ForwardRecorder(key=handle_of)
        self._recorded: ForwardPass | None = None
        with _lock:
            if not _watches:
                _install()
            _watches.append(self)

    def _end(self) -> None:
        """Stop watching and keep what was recorded (the module's lock held)."""
        if self._recorded is None:
            self._recorded = self.recorder.finish()
            _watches.remove(self)
            if not _watches:
                _uninstall()

    def stop(self) -> ForwardPass:
        """Stop watching (idempotent); what was recorded."""
        with _lock:
            self._end()
        assert self._recorded is not None
        return self._recorded
