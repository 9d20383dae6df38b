"""Run under ``horovodrun -np 2 --gloo``: all-reduce torch tensors and MXNet NDArrays, check sums.

Every value is an integer that float32 holds exactly, so results are compared exactly. Prints
``HVD OK torch rank=<r> size=<n>`` and ``HVD OK mxnet rank=<r> size=<n>``; exits 1 on a mismatch.
"""

from __future__ import annotations

import sys

# torch must be imported before horovod.mxnet: with torch 2.13, mxnet 1.9.1 and horovod 0.28.1,
# `import horovod.mxnet; import torch` segfaults while loading torch._C.
import torch
import horovod.mxnet as hvd_mx
import horovod.torch as hvd
import mxnet as mx
import numpy as np

SIZES = {"small": 10, "fused": 3000, "large": 1 << 20}


def values(n: int, rank: int) -> np.ndarray:
    """Rank-specific integers: rank r contributes (r + 1) * (i % 1000)."""
    return (np.arange(n, dtype=np.float32) % 1000) * (rank + 1)


def expected(n: int, size: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 1000) * sum(r + 1 for r in range(size))


def check(what: str, got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape == want.shape and np.array_equal(got, want):
        return True
    print(f"FAIL {what}: shape {got.shape} vs {want.shape}, "
          f"{int(np.count_nonzero(got != want)) if got.shape == want.shape else '?'} differ")
    return False


def torch_allreduce(rank: int, size: int) -> bool:
    """Blocking and asynchronous (the DistributedOptimizer's path) sums, float and int."""
    ok = True
    for name, n in SIZES.items():
        t = torch.from_numpy(values(n, rank))
        ok &= check(f"torch {name}", hvd.allreduce(t, op=hvd.Sum, name=f"t.{name}").numpy(),
                    expected(n, size))
    handles = [(n, hvd.allreduce_async_(torch.from_numpy(values(n, rank)), op=hvd.Sum,
                                        name=f"ta.{name}"))
               for name, n in SIZES.items()]
    for n, handle in handles:
        ok &= check(f"torch async {n}", hvd.synchronize(handle).numpy(), expected(n, size))
    ints = torch.arange(5, dtype=torch.int64) * (rank + 1)
    ok &= check("torch int64", hvd.allreduce(ints, op=hvd.Sum, name="t.int").numpy(),
                np.arange(5, dtype=np.int64) * sum(r + 1 for r in range(size)))
    return ok


def mxnet_allreduce(rank: int, size: int) -> bool:
    """Out-of-place and in-place sums of NDArrays."""
    ok = True
    for name, n in SIZES.items():
        nd = mx.nd.array(values(n, rank), dtype="float32")
        out = hvd_mx.allreduce(nd, op=hvd_mx.Sum, name=f"m.{name}")
        ok &= check(f"mxnet {name}", out.asnumpy(), expected(n, size))
        hvd_mx.allreduce_(nd, op=hvd_mx.Sum, name=f"mi.{name}")
        ok &= check(f"mxnet in-place {name}", nd.asnumpy(), expected(n, size))
    return ok


def main() -> int:
    hvd.init()
    hvd_mx.init()
    rank, size = hvd.rank(), hvd.size()
    if size != 2 or (hvd_mx.rank(), hvd_mx.size()) != (rank, size):
        print(f"FAIL: torch rank/size {rank}/{size}, mxnet {hvd_mx.rank()}/{hvd_mx.size()}")
        return 1
    ok = True
    if torch_allreduce(rank, size):
        print(f"HVD OK torch rank={rank} size={size}", flush=True)
    else:
        ok = False
    if mxnet_allreduce(rank, size):
        print(f"HVD OK mxnet rank={rank} size={size}", flush=True)
    else:
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
