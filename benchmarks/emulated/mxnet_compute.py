"""MXNet (Gluon) emulated profile layers: the MXNet twin of :mod:`.torch_compute`.

Each profile layer owns Gluon parameters with its tensors' sizes. Its forward and backward time
is spent on an emulated accelerator (``csrc/emulated_device.cc``): one asynchronous MXNet engine
operation per layer and pass that, once its inputs are ready, completes from a timer thread
after the layer's time. The device runs them one at a time in posting order, as kernels on one
GPU stream run, and keeps its own clock, so the engine's dispatch gaps between layers do not add
up; a forward layer reads its weights (it waits for their pull or update) and a
backward layer writes its gradients (the KVStore's or Horovod's transfer of them waits for it).
So the engine sees each layer's gradients become ready in backward order at the profile's times,
and they travel through the real KVStore or Horovod transfers, while the host's CPUs and the GIL
stay free for communication, as on a GPU-trained job.

Why not Python custom operators (what this module used at first): each such layer
enters the interpreter several times per pass, so it competed for the GIL with bytesched's
Python threads, and the emulated Transformer's backward took 326 ms under bytesched against
197 ms under the plain store. It also made about 10,000
cyclic objects per step for the garbage collector. A real model's layers are C++ operators and
need neither.

The weights' and gradients' values are left as they are (zeros from initialisation, and sums or
averages of zeros after communication): only their bytes and their timing matter.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from pathlib import Path
from typing import Sequence

import mxnet as mx
from mxnet import gluon

from bytesched.plugins.mxnet.proxies import BUILD_HINT, handle_array
from bytesched.sim.profile import ModelProfile
from .scaling import layer_sizes

LIBRARY = Path(__file__).resolve().parent / "libbytesched_emulated_device.so"


class EmulatedDeviceError(RuntimeError):
    """The emulated device's library is missing or one of its calls failed."""


@functools.cache
def _library() -> ctypes.PyDLL:
    """The loaded library. Its calls only post to MXNet's engine, so they keep the GIL
    (``PyDLL``): letting it go would make the training thread win it back after every call."""
    if not LIBRARY.exists():
        raise EmulatedDeviceError(f"the emulated device library {LIBRARY} does not exist: {BUILD_HINT}")
    lib = ctypes.PyDLL(str(LIBRARY))
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    lib.bs_last_error.restype = ctypes.c_char_p
    lib.bs_emulate_layers.argtypes = [i32, vp, vp, vp, vp, vp, ctypes.c_char_p]
    lib.bs_mark_gradients_fresh.argtypes = [vp, i32]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise EmulatedDeviceError(f"{what}: {_library().bs_last_error().decode(errors='replace')}")


def _ends(groups: Sequence[Sequence[mx.nd.NDArray]]) -> ctypes.Array:
    """Where each layer's arrays end in the flattened list (the library's ``*_ends``)."""
    ends = list(itertools.accumulate(len(group) for group in groups))
    return (ctypes.c_int * len(ends))(*ends)


class Pass:
    """One pass over the layers as the library's arguments, built once: layer i takes
    ``seconds[i]``, reads ``reads[i]`` and writes ``writes[i]``."""

    def __init__(self, name: str, seconds: Sequence[float], reads: Sequence[Sequence[mx.nd.NDArray]],
                 writes: Sequence[Sequence[mx.nd.NDArray]]) -> None:
        if not len(seconds) == len(reads) == len(writes):
            raise ValueError(f"{name}: {len(seconds)} times for {len(reads)} reads and {len(writes)} writes")
        self.name = name
        self.arguments = (len(seconds), (ctypes.c_double * len(seconds))(*seconds),
                          handle_array([a for group in reads for a in group]), _ends(reads),
                          handle_array([a for group in writes for a in group]), _ends(writes),
                          name.encode())

    def post(self) -> None:
        _check(_library().bs_emulate_layers(*self.arguments), f"posting the {self.name}")


class EmulatedModel:
    """A profile's layers: parameters with its tensors' sizes, and its times on the emulated
    device. ``params`` is what the Trainer and Horovod's broadcast take; their arrays stay the
    same objects for the model's life (Gluon updates, pulls and broadcasts in place), so the
    passes are built once."""

    def __init__(self, profile: ModelProfile) -> None:
        self.params = gluon.ParameterDict("emulated_")
        layers = [[self.params.get(f"layer{i}_w{j}", shape=(n,), init=mx.init.Zero())
                   for j, n in enumerate(layer_sizes(layer))] for i, layer in enumerate(profile.layers)]
        self.params.initialize()
        self.loss = mx.nd.zeros((1,))
        none: list[mx.nd.NDArray] = []
        self._forward = Pass("emulated forward pass", [layer.forward for layer in profile.layers],
                             reads=[[p.data() for p in layer] for layer in layers],
                             writes=[none] * (len(layers) - 1) + [[self.loss]])
        self._backward = Pass("emulated backward pass", [layer.backward for layer in reversed(profile.layers)],
                              reads=[none] * len(layers),
                              writes=[[p.grad() for p in layer] for layer in reversed(layers)])
        self._weights = handle_array([p.data() for p in self.params.values()])

    def step(self) -> mx.nd.NDArray:
        """Post one forward and one backward pass and mark every gradient computed, as
        autograd's backward does; the returned loss is ready once the forward pass ran."""
        self._forward.post()
        self._backward.post()
        _check(_library().bs_mark_gradients_fresh(self._weights, len(self._weights)), "marking the gradients")
        return self.loss
