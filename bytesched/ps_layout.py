"""Server-key layout: which server keys hold which elements of which user key.

Used by the MXNet plugin's ScheduledKVStore and by the simulator, which places a scheduled PS
job's partitions with this same table; it follows MXNet's placement rule but imports no MXNet.
So it lives beside the simulator, below the plugins: not in :mod:`bytesched.core`, which knows no
framework's rules, nor in :mod:`bytesched.plugins.mxnet`, which the simulator may not import.

Each tensor the user stores under a key is split into contiguous element ranges, one server key
per range (zero-copy: the ranges are views of the flattened tensor). Every worker builds the same
table because every worker initialises the same keys in the same order with the same partition
size, so server keys are allocated deterministically by a counter; nothing is exchanged.

User keys may be ints (Gluon's Trainer) or strs (Module, and scripts using parameter names),
not both in one store (MXNet refuses the mix). Server keys are always ints, allocated here, so
that they can be placed on chosen servers and never collide across generations. Each user key
also has a *plain index*: the index under which the wrapped store's optimizer would have seen
that key without partitioning, which is what per-parameter optimizer settings are looked up by.
For an int key it is the key. For a str key it depends on the store, as in MXNet: a dist store
numbers str keys in init order and its servers' optimizer sees those numbers; a local store
hands its optimizer the str key itself.

A re-partition gives every user key fresh server keys (a new *generation*), so old and new keys
never collide and the servers can keep the old ones' state until it has been carried over.

Placement on servers follows MXNet's own rule, made stable across re-partitions: a tensor below
MXNet's big-array bound lives on one server (the least loaded so far, by bytes); a bigger one is
cut into one contiguous *stripe* per server. Partitions never cross a stripe and stay below the
bound (so MXNet does not split them again), and each server key is chosen so that MXNet's
key-to-server rule puts it on its stripe's server. Whatever the partition size, the elements of
a stripe therefore always live on the same server, which is what lets a server carry optimizer
state from old partitions to new ones by itself.

A striped tensor's partitions are listed round-robin over its stripes (first of stripe 0, first of
stripe 1, ..., second of stripe 0, ...), not in element order. The pieces of one tensor share a
priority, so the Core starts them in list order; in element order the first half of a tensor
striped over two servers would all go to server 0 while server 1 idled, and the partitions
would finish at half the rate the two servers' links allow.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from bytesched.core import split_elements

UserKey = int | str


@dataclass(frozen=True)
class KeyLayout:
    """One user key's partitioning into server keys."""

    user_key: UserKey
    plain_index: int | str
    shape: tuple[int, ...]
    dtype: str
    server_keys: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    generation: int

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def part_nbytes(self, index: int) -> int:
        start, stop = self.ranges[index]
        return (stop - start) * self.itemsize


def mxnet_server_of(key: int, num_servers: int) -> int:
    """The server MXNet's dist KVStore sends a small (below the big-array bound) key to
    (``EncodeDefaultKey`` in MXNet's kvstore_dist.h)."""
    return (key * 9973) % num_servers


class ServerKeyTable:
    """The layouts of every initialised user key, and the server-key allocator.

    Args:
        num_servers: parameter servers of the job (1 for a local store).
        bigarray_bound: MXNet's ``MXNET_KVSTORE_BIGARRAY_BOUND`` (elements): keys at least this
            big are split over all servers by MXNet itself.
        str_index_is_name: the optimizer sees a str key itself (local store), not its init
            order (dist store); see the module doc.
    """

    def __init__(self, num_servers: int = 1, bigarray_bound: int = 1_000_000, *,
                 str_index_is_name: bool = False) -> None:
        if num_servers < 1 or bigarray_bound < 2:
            raise ValueError(f"num_servers={num_servers} and bigarray_bound={bigarray_bound} must be "
                             ">= 1 and >= 2")
        self.num_servers = num_servers
        self.bigarray_bound = bigarray_bound
        self._layouts: dict[UserKey, KeyLayout] = {}
        self._stripes: dict[UserKey, list[tuple[int, int, int]]] = {}  # (start, stop, server)
        self._load = [0] * num_servers
        residue = {mxnet_server_of(r, num_servers): r for r in range(num_servers)}
        if len(residue) != num_servers:
            raise ValueError(f"cannot place keys on {num_servers} servers with MXNet's key rule")
        self._next_on = [residue[s] for s in range(num_servers)]  # next key landing on server s
        self._str_keys = 0
        self._str_index_is_name = str_index_is_name
        self.generation = 0

    def __len__(self) -> int:
        return len(self._layouts)

    def __contains__(self, user_key: UserKey) -> bool:
        return user_key in self._layouts

    def __getitem__(self, user_key: UserKey) -> KeyLayout:
        try:
            return self._layouts[user_key]
        except KeyError:
            raise KeyError(f"key {user_key!r} was not initialised in the ScheduledKVStore "
                           "(call init() or broadcast() first)") from None

    def layouts(self) -> list[KeyLayout]:
        """Every layout, in initialisation order."""
        return list(self._layouts.values())

    def add(self, user_key: UserKey, shape: Iterable[int], dtype: Any, partition_bytes: float) -> KeyLayout:
        """Lay out a newly initialised user key."""
        if not isinstance(user_key, (int, str)) or isinstance(user_key, bool):
            raise TypeError(f"KVStore keys must be int or str, got {user_key!r}")
        if user_key in self._layouts:
            raise ValueError(f"key {user_key!r} was already initialised in the ScheduledKVStore")
        if self._layouts and isinstance(user_key, str) != isinstance(next(iter(self._layouts)), str):
            raise TypeError(f"key {user_key!r}: do not mix int and str keys in one KVStore (MXNet refuses it)")
        plain: int | str = user_key
        if isinstance(user_key, str) and not self._str_index_is_name:
            plain = self._str_keys
            self._str_keys += 1
        shape = tuple(int(d) for d in shape)
        self._stripes[user_key] = self._place(math.prod(shape) * np.dtype(dtype).itemsize, math.prod(shape))
        layout = self._lay_out(user_key, plain, shape, np.dtype(dtype).name, partition_bytes)
        self._layouts[user_key] = layout
        return layout

    def _place(self, nbytes: int, numel: int) -> list[tuple[int, int, int]]:
        """Stripes of a new tensor: one per server if MXNet would split it, else one on the
        least-loaded server."""
        if numel < self.bigarray_bound or self.num_servers == 1:
            server = min(range(self.num_servers), key=lambda s: (self._load[s], s))
            self._load[server] += nbytes
            return [(0, numel, server)]
        stripes = [(a, b, s) for s, (a, b) in enumerate(split_elements(numel, 1, -(-numel // self.num_servers)))]
        for a, b, s in stripes:
            self._load[s] += nbytes * (b - a) // numel
        return stripes

    def reserve(self) -> int:
        """A fresh server key outside every layout, for communication of bytesched's own (the
        start-up plan's timing); every worker reserves the same keys in the same order. MXNet
        places it by its own rule: on the least-loaded server if small, striped if big."""
        server = min(range(self.num_servers), key=lambda s: (self._load[s], s))
        key = self._next_on[server]
        self._next_on[server] += self.num_servers
        return key

    def repartition(self, partition_bytes: float) -> list[tuple[KeyLayout, KeyLayout]]:
        """Give every user key fresh server keys at ``partition_bytes``; returns (old, new) pairs."""
        self.generation += 1
        pairs = []
        for key, old in self._layouts.items():
            new = self._lay_out(key, old.plain_index, old.shape, old.dtype, partition_bytes)
            self._layouts[key] = new
            pairs.append((old, new))
        return pairs

    def _lay_out(self, user_key: UserKey, plain: int | str, shape: tuple[int, ...], dtype: str,
                 partition_bytes: float) -> KeyLayout:
        itemsize = np.dtype(dtype).itemsize
        size = min(partition_bytes, (self.bigarray_bound - 1) * itemsize)
        ranges: list[tuple[int, int]] = []
        keys: list[int] = []
        stripes = [[(start + a, start + b, server) for a, b in split_elements(stop - start, itemsize, size)]
                   for start, stop, server in self._stripes[user_key]]
        for piece in itertools.chain.from_iterable(itertools.zip_longest(*stripes)):
            if piece is None:
                continue
            start, stop, server = piece
            ranges.append((start, stop))
            keys.append(self._next_on[server])
            self._next_on[server] += self.num_servers
        if max(self._next_on) >= 2**31:
            raise OverflowError("more than 2^31 server keys allocated: use a larger partition size")
        return KeyLayout(user_key, plain, shape, dtype, tuple(keys), tuple(ranges), self.generation)
