"""Tensor fusion for MXNet over Horovod: small gradients of one update call share one CommTask.

Every scheduled all-reduce pays a fixed cost besides its bytes (four engine operations, the
Core's events, a Horovod negotiation), which on small tensors fusion all but removes
(docs/experiments/per-tensor-cost.md, "Figures behind the MXNet plugin's posting rules"). The parameter
server cannot fuse safely: Gluon pushes one key per call and nothing marks the last call of a
step. The Horovod path can, because :class:`~bytesched.plugins.mxnet.ScheduledOptimizer` declares
aggregation, so Gluon's Updater hands it every gradient of one dtype in one ``update`` call. Runs
of that call's gradients consecutive in the forward order (the order the first forward pass reads
their parameters, :mod:`.trace`) holding at most ``fusion_bytes`` together
(:func:`bytesched.core.fusion_runs`, the PyTorch plugin's rule) form a :class:`Bucket`: engine
copies put their gradients into the bucket's flat buffer, the buffer is partitioned and
all-reduced like any gradient, and copies put it back into the gradients before the optimizer
reads them. Copies are exact, so the per-element arithmetic is the unfused all-reduce's. Every
rank uses rank 0's forward order (broadcast once) and its Trainer lists the same parameters, so
the buckets, and the names Horovod matches them by, agree.

Pack and unpack are one engine operation each (:class:`~.proxies.Copies`, the proxy library's
memory copies), not MXNet's ``concat`` and ``identity``. Those two take one of MXNet's shared
temp-space variables (``MXNET_CPU_TEMP_COPY``, four by default, handed out round-robin). A pack
is posted before backward writes its gradients, and an unpack before the all-reduce. Each would
hold its variable until then, and every later operation drawing the same variable (later buckets,
the model's own layers) would wait behind it. ``NDArray.copyto`` per gradient draws none, but
costs Python per gradient and step where one operation costs one call (the figures:
docs/experiments/per-tensor-cost.md, "Figures behind the MXNet plugin's posting rules").
"""

from __future__ import annotations

from typing import Sequence

import mxnet as mx
import numpy as np

from .proxies import Copies, ProxyLibrary


def task_name(indices: Sequence[int]) -> str:
    """The name of the all-reduce of these Trainer indices (a bucket's, or one gradient's),
    identical on every rank: the first one, with ``+N`` for N others."""
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}+{len(indices) - 1}"


class Bucket:
    """Gradients consecutive in the forward order all-reduced through one flat buffer.

    Built for the very gradient arrays it packs (Gluon passes the same ones every step), so the
    flat views of them and the buffer's slices are made once: creating an NDArray view per step
    and tensor cost more in MXNet's Python than fusion saved.

    Attributes:
        indices: the members' Trainer indices, in the order they lie in the buffer.
        name: the CommTask's and Horovod's name (:func:`task_name`).
        buffer: 1-D, the members' elements end to end (allocated once, reused every step).
    """

    def __init__(self, indices: Sequence[int], grads: Sequence[mx.nd.NDArray], library: ProxyLibrary) -> None:
        self.indices = tuple(indices)
        self.name = task_name(self.indices)
        self._grads = list(grads)
        flats = [g.reshape(-1) for g in grads]
        stops = np.cumsum([g.size for g in grads])
        self.buffer = mx.nd.zeros((int(stops[-1]),), ctx=grads[0].context, dtype=grads[0].dtype)
        self.buffer.wait_to_read()  # allocated: the copies take its address now
        slices = [self.buffer[int(start):int(stop)] for start, stop in zip([0, *stops[:-1]], stops)]
        self._pack = Copies(library, list(zip(flats, slices)), reads=flats, writes=[self.buffer],
                            name="bytesched_fusion_pack")
        self._unpack = Copies(library, list(zip(slices, flats)), reads=[self.buffer], writes=flats,
                              name="bytesched_fusion_unpack")

    def matches(self, indices: Sequence[int], grads: Sequence[mx.nd.NDArray]) -> bool:
        """Built for these indices and these very arrays (else a new bucket is made)."""
        return (tuple(indices) == self.indices and len(grads) == len(self._grads)
                and all(a is b for a, b in zip(grads, self._grads)))

    def pack(self) -> None:
        """Post the copy of the gradients into the buffer (after whatever last wrote them)."""
        self._pack.post()

    def unpack(self) -> None:
        """Post the copy of the reduced buffer back into the gradients (after the all-reduce)."""
        self._unpack.post()
