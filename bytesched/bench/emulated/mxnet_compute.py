"""MXNet (Gluon) emulated profile layers: the MXNet twin of :mod:`.torch_compute`.

A custom operator sleeps for the layer's forward time and, in backward, for its backward time,
then writes a (zero) gradient into every parameter of the layer. MXNet runs custom operators on
their own worker thread, so the engine sees each layer's gradients become ready in backward
order at the profile's times, and they travel through the real KVStore or Horovod transfers.

The operator writes its outputs with one engine operation each (``identity``, ``zeros_like``),
not with ``CustomOp.assign``: that slices in Python and spent about 1.5 ms of CPU per backward
layer on the host, which a real layer (GPU kernels) does not, and it ran slower while the two
cores also carried communication: the emulated VGG16's backward took 223 ms per step under
bytesched against 175 ms under the plain store (docs/benchmarks.md, "The emulated MXNet layers
cost host CPU").
"""

from __future__ import annotations

import time
from typing import Any

import mxnet as mx
from mxnet import gluon

from ...sim.profile import ModelProfile
from .scaling import layer_sizes

OP_TYPE = "bytesched_bench_sleep"


def _copy(dst: mx.nd.NDArray, req: str, src: mx.nd.NDArray) -> None:
    """``dst`` (op)= ``src`` as ``req`` says, in one engine operation."""
    if req in ("write", "inplace"):
        mx.nd.identity(src, out=dst)
    elif req == "add":
        mx.nd.elemwise_add(dst, src, out=dst)


def _zero(dst: mx.nd.NDArray, req: str) -> None:
    """``dst`` (op)= 0 as ``req`` says: adding zero leaves it as it is."""
    if req in ("write", "inplace"):
        mx.nd.zeros_like(dst, out=dst)


class _SleepingLayer(mx.operator.CustomOp):
    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.backward_s = backward_s

    def forward(self, is_train: bool, req: list, in_data: list, out_data: list, aux: list) -> None:
        time.sleep(self.forward_s)
        _copy(out_data[0], req[0], in_data[0])

    def backward(self, req: list, out_grad: list, in_data: list, out_data: list, in_grad: list, aux: list) -> None:
        time.sleep(self.backward_s)
        _copy(in_grad[0], req[0], out_grad[0])
        for grad, how in zip(in_grad[1:], req[1:]):
            _zero(grad, how)


@mx.operator.register(OP_TYPE)
class _SleepingLayerProp(mx.operator.CustomOpProp):
    """Inputs: the activation and the layer's parameters; output: the activation unchanged."""

    def __init__(self, forward_s: str, backward_s: str, num_params: str) -> None:
        super().__init__(need_top_grad=True)
        self.forward_s = float(forward_s)
        self.backward_s = float(backward_s)
        self.num_params = int(num_params)

    def list_arguments(self) -> list[str]:
        return ["data", *(f"param{i}" for i in range(self.num_params))]

    def list_outputs(self) -> list[str]:
        return ["output"]

    def infer_shape(self, in_shape: list) -> tuple[list, list, list]:
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx: Any, shapes: list, dtypes: list) -> _SleepingLayer:
        return _SleepingLayer(self.forward_s, self.backward_s)


class EmulatedLayer(gluon.Block):
    """One profile layer: its tensors as Gluon parameters, its times as sleeps."""

    def __init__(self, forward_s: float, backward_s: float, sizes: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.forward_s = forward_s
        self.backward_s = backward_s
        with self.name_scope():
            self.weights = [self.params.get(f"w{i}", shape=(n,), init=mx.init.Zero()) for i, n in enumerate(sizes)]

    def forward(self, x: mx.nd.NDArray) -> mx.nd.NDArray:
        return mx.nd.Custom(x, *(w.data() for w in self.weights), op_type=OP_TYPE, forward_s=self.forward_s,
                            backward_s=self.backward_s, num_params=len(self.weights))


def emulated_model(profile: ModelProfile) -> gluon.nn.Sequential:
    """The profile's layers, in forward order, initialised."""
    net = gluon.nn.Sequential()
    with net.name_scope():
        for layer in profile.layers:
            net.add(EmulatedLayer(layer.forward, layer.backward, layer_sizes(layer)))
    net.initialize()
    return net
