"""``BYTESCHED_CHECK=N``: every N steps, check that every rank holds the same parameters.

Data-parallel ranks must stay bit-identical; a scheduling bug (an update applied twice, a partition
reduced out of order, a gradient read before its all-reduce finished) shows up as ranks drifting
apart, silently, long before the loss says so. This check catches it where it happens: each rank
reduces every parameter to an exact integer digest (a position-weighted sum of its bytes, so it is
independent of summation order and of floating-point rounding), the digests of all ranks are
all-gathered with the job's own backend, and the first parameter whose digests differ is named
with the ranks that disagree with rank 0.

Before any of that, every multi-rank ScheduledOptimizer checks once, at construction, that every
rank has the same trainable parameters (names, shapes, dtypes): bytesched names each all-reduce
after its parameter, so a parameter that exists on one rank only would leave the others waiting
for a collective that never comes (a hang, not an error). Registration order and forward order may
differ between ranks: all-reduces are matched by name, so both are compared in name order.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch

from .backend import Backend
from .slots import ParamSlot

_WEIGHT_PERIOD = 251  # byte i weighs (i mod 251) + 1: a swap of two bytes changes the digest


class ParameterDivergence(RuntimeError):
    """Ranks hold different values of a parameter that data parallelism keeps identical."""


class ModelMismatch(ValueError):
    """Ranks built models whose trainable parameters differ (a name, shape or dtype)."""


def describe_parameters(slots: list[ParamSlot]) -> dict[str, str]:
    """``{name: "shape dtype"}`` of the trainable parameters: what must match on every rank."""
    return {slot.name: f"{tuple(slot.param.shape)} {str(slot.param.dtype).removeprefix('torch.')}"
            for slot in slots}


def _encode(described: dict[str, str]) -> bytes:
    return "\n".join(f"{name}\t{kind}" for name, kind in sorted(described.items())).encode()


def _decode(raw: bytes) -> dict[str, str]:
    return dict(line.split("\t", 1) for line in raw.decode().split("\n") if line)


def first_mismatch(ranks: list[dict[str, str]]) -> str | None:
    """The first parameter (in name order) whose presence, shape or dtype differs from rank 0's,
    with the ranks concerned; None when every rank matches rank 0."""
    for name in sorted(set().union(*ranks)):
        kinds = [described.get(name) for described in ranks]
        if len(set(kinds)) == 1:
            continue
        if kinds[0] is None:
            having = [r for r, kind in enumerate(kinds) if kind is not None]
            return f"parameter {name!r} {kinds[having[0]]} exists on rank(s) {_ranks(having)} but not on rank 0"
        missing = [r for r, kind in enumerate(kinds) if kind is None]
        if missing:
            return f"parameter {name!r} {kinds[0]} exists on rank 0 but not on rank(s) {_ranks(missing)}"
        other = [r for r, kind in enumerate(kinds) if kind != kinds[0]]
        return (f"parameter {name!r} is {kinds[0]} on rank 0 but {kinds[other[0]]} on rank(s) "
                f"{_ranks(other)}")
    return None


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def check_same_parameters(backend: Backend, slots: list[ParamSlot]) -> None:
    """Raise :class:`ModelMismatch` on every rank unless all ranks have the same trainable
    parameters. One all-gather of three integers (a fingerprint); only on a mismatch a second one
    gathers every rank's list, so that the error names the parameter and the ranks. A collective
    when there are several ranks; nothing to compare on one."""
    if backend.size < 2:
        return
    raw = _encode(describe_parameters(slots))
    fingerprint = int.from_bytes(hashlib.sha256(raw).digest()[:8], "little", signed=True)
    summary = backend.all_gather(torch.tensor([len(slots), len(raw), fingerprint], dtype=torch.int64))
    if bool((summary == summary[0]).all()):
        return
    longest = int(summary[:, 1].max())
    padded = torch.zeros(longest + 1, dtype=torch.int64)  # +1: a rank without parameters sends 0 bytes
    padded[:len(raw)] = torch.tensor(list(raw), dtype=torch.int64)
    every_rank = backend.all_gather(padded)
    lists = [_decode(bytes(row[:int(length)].tolist())) for row, length in zip(every_rank, summary[:, 1])]
    raise ModelMismatch(
        f"the model differs between ranks: {first_mismatch(lists)}. Every rank must build the same model "
        f"(the same trainable parameters, names, shapes and dtypes; their order may differ): bytesched "
        f"all-reduces each gradient under its parameter's name, so the ranks would wait for each other "
        f"forever. Build the model identically on every rank (no rank-dependent layers or shapes)")


def digest(tensor: torch.Tensor) -> int:
    """An exact, order-independent fingerprint of ``tensor``'s bytes (any dtype)."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(raw.numel(), dtype=torch.int64) % _WEIGHT_PERIOD + 1
    return int((raw * weights).sum())


class ConsistencyCheck:
    """Compares parameter digests across ranks every ``every`` steps (one small all-gather)."""

    def __init__(self, every: int, backend: Backend, slots: list[ParamSlot],
                 wait_applied: Callable[[], object]) -> None:
        self.every = every
        self._backend = backend
        self._slots = sorted(slots, key=lambda slot: slot.name)  # ranks may register them in other orders
        self._wait_applied = wait_applied
        self._steps = 0

    def after_step(self) -> None:
        """Count a step; on every ``every``-th, wait for its updates and compare (collective: every
        rank calls it at the same step)."""
        self._steps += 1
        if self._steps % self.every:
            return
        self._wait_applied()
        local = torch.tensor([digest(slot.param) for slot in self._slots], dtype=torch.int64)
        every_rank = self._backend.all_gather(local)
        differs = (every_rank != every_rank[0]).any(dim=0).nonzero()
        if len(differs):
            index = int(differs[0])
            ranks = [r for r in range(every_rank.shape[0]) if every_rank[r, index] != every_rank[0, index]]
            raise ParameterDivergence(
                f"BYTESCHED_CHECK: after step {self._steps}, parameter {self._slots[index].name!r} differs between "
                f"rank 0 and rank(s) {', '.join(map(str, ranks))} ({len(differs)} of {len(self._slots)} parameters "
                f"differ). Data-parallel ranks must hold identical parameters: something changed one rank's "
                f"weights (code run on one rank only, a non-deterministic update) or a scheduling bug; rerun with "
                f"BYTESCHED_POLICY=fifo and the same seed to tell which, and report it with this message")


def make_check(every: int, backend: Backend, slots: list[ParamSlot],
               wait_applied: Callable[[], object]) -> ConsistencyCheck | None:
    """The check for ``BYTESCHED_CHECK=every`` (None when 0 or a single rank: nothing to compare)."""
    if backend.size < 2 or every <= 0:
        return None
    return ConsistencyCheck(every, backend, slots, wait_applied)
