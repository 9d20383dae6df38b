"""Worker of a 2-worker, 2-server MXNet ``dist_sync`` job: push worker-specific values, pull sums.

Run by tests/test_stack_ps.py through bytesched.launch.ps. Every value is an integer that float32
holds exactly, so the aggregate is checked with exact equality. Exits non-zero (with the reason)
on any mismatch; prints ``KVSTORE OK rank=<r>`` on success.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

# Key -> shape. Key 9 has 2**20 floats, above MXNet's default MXNET_KVSTORE_BIGARRAY_BOUND
# (1e6), so dist_sync splits it across both servers; the small keys each live on one server.
SHAPES: dict[int, tuple[int, ...]] = {3: (7,), 5: (64, 33), 9: (1 << 20,)}
ROUNDS = 2


def base(key: int) -> np.ndarray:
    """A key-specific array of distinct integers (exact in float32)."""
    size = int(np.prod(SHAPES[key]))
    return (np.arange(size, dtype=np.float32) % 1000 + key).reshape(SHAPES[key])


def main() -> int:
    world = int(os.environ["BYTESCHED_WORLD_SIZE"])
    kv = mx.kv.create("dist_sync")
    if kv.num_workers != world or world != 2:
        print(f"FAIL: kv.num_workers={kv.num_workers}, BYTESCHED_WORLD_SIZE={world}, want 2")
        return 1
    keys = sorted(SHAPES)
    kv.init(keys, [mx.nd.zeros(SHAPES[k]) for k in keys])
    factor_sum = sum(r + 1 for r in range(world))  # worker r pushes (r + 1) * round * base
    for rnd in range(1, ROUNDS + 1):
        kv.push(keys, [mx.nd.array(base(k) * (kv.rank + 1) * rnd) for k in keys])
        outs = [mx.nd.zeros(SHAPES[k]) for k in keys]
        kv.pull(keys, out=outs)
        for key, out in zip(keys, outs):
            want = base(key) * factor_sum * rnd
            got = out.asnumpy()
            if not np.array_equal(got, want):
                bad = int(np.count_nonzero(got != want))
                print(f"FAIL: round {rnd} key {key}: {bad} of {want.size} elements differ")
                return 1
    print(f"KVSTORE OK rank={kv.rank} launcher_rank={os.environ['BYTESCHED_RANK']} "
          f"keys={keys} rounds={ROUNDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
