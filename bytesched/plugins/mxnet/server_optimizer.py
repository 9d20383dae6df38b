"""The optimizer a ScheduledKVStore installs on the parameter servers (or the local store).

With ``update_on_kvstore`` the parameter servers run the optimizer, once per server key. After
partitioning, a server key is one partition of a parameter, so this wrapper gives the user's
optimizer what it expects:

* the *plain index* of the parameter (the index the unpartitioned store would have used), so
  per-parameter settings (``lr_mult``, ``wd_mult``, ``idx2name``, ``param_dict``) apply exactly
  as before;
* a per-partition update count (swapped in around each update), so bias corrections such as
  Adam's see one update per step, not one per partition;
* a per-partition state, created by the user's optimizer for the partition's slice.

Re-partitioning without restarting the job: a store sends this wrapper again whenever its key
layout changes. Unpickled on a server, the new wrapper *adopts* the one installed before (a
module-level slot; one job per server process): it keeps the live optimizer object (learning-rate
schedule, update counts), the states of unchanged keys, and it builds each new partition's state
from the slices of the old partitions it covers. That carries momentum, Adam moments and
multi-precision master weights across a partition-size change, exactly.

This is elementwise maths only: optimizers whose update of one element depends on the whole
tensor (LAMB, LARS and LBSGD compute per-tensor norms) or on a global per-call schedule (Nadam)
do not give the unpartitioned result; :data:`NOT_ELEMENTWISE` names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

# A server unpickles this module while `import mxnet` is still running (ps-lite serves from
# inside that import), so only submodules are imported here, never attributes of the package.
from mxnet.ndarray import NDArray, concat

if TYPE_CHECKING:
    from mxnet.optimizer import Optimizer

NOT_ELEMENTWISE = frozenset({"lamb", "lars", "lbsgd", "nadam"})

_installed: "PartitionedOptimizer | None" = None  # the wrapper last unpickled in this process


@dataclass(frozen=True)
class Part:
    """Where a server key's elements live in its parameter."""

    plain_index: int | str
    start: int
    stop: int
    generation: int
    timing_only: bool = False
    """A key the start-up plan times the network with: the server keeps its value and updates
    nothing (a user's optimizer would otherwise see a parameter that does not exist)."""


class PartitionedOptimizer:
    """Runs ``optimizer`` per partition as if it ran per parameter (see the module docstring).

    Args:
        optimizer: the user's MXNet optimizer (shared, not copied: in a local store later
            changes such as ``set_learning_rate`` still apply).
        parts: every server key of the current layout, and of the previous one while its states
            may still be carried over.
        version: (store, optimizer) numbers, identical on every worker; the store bumps the
            second when the user installs another optimizer. A wrapper of another version
            starts afresh, as MXNet's own ``set_optimizer`` does.
        generation: the layout generation (bumped by each re-partition).
    """

    def __init__(self, optimizer: "Optimizer", parts: Mapping[int, Part], *,
                 version: tuple[int, int], generation: int) -> None:
        self.optimizer = optimizer
        self.parts = dict(parts)
        self.version = version
        self.generation = generation
        self._states: dict[int, Any] = {}
        self._counts: dict[int, int] = {}

    # -- what MXNet's Updater reads ---------------------------------------------------------
    @property
    def multi_precision(self) -> bool:
        return self.optimizer.multi_precision

    @property
    def aggregate_num(self) -> int:
        return 0  # one update call per server key; the plain-index mapping is per call

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class lacks (e.g. _set_current_context, allow_np_array).
        if name.startswith("__") or "optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    # -- pickling to the servers ------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "parts": self.parts, "version": self.version,
                "generation": self.generation}

    def __setstate__(self, state: dict[str, Any]) -> None:
        global _installed
        self.__dict__.update(state)
        self._states = {}
        self._counts = {}
        if _installed is not None:
            self.adopt(_installed)
        _installed = self

    def adopt(self, previous: "PartitionedOptimizer") -> None:
        """Continue from ``previous`` (the wrapper installed before this one in this process)."""
        if previous is self or previous.version != self.version:
            return
        self.optimizer = previous.optimizer  # its counts, num_update and lr schedule are live
        # keys of layouts older than the previous one are gone for good: drop their states
        self._states = {k: v for k, v in previous._states.items() if k in self.parts}
        self._counts = {k: v for k, v in previous._counts.items() if k in self.parts}

    # -- the Updater's calls ----------------------------------------------------------------
    def create_state_multi_precision(self, index: int, weight: NDArray) -> Any:
        """The partition's state: adopted, carried over from old partitions, or new."""
        if index in self._states:
            return self._states[index]
        part = self._part(index)
        if part.timing_only:
            return None
        sources = self._old_parts_covering(index, part)
        if sources:
            state = _carry_over(part, [(self.parts[k], self._states[k]) for k in sources])
            self._counts[index] = self._counts.get(sources[0], self.optimizer.begin_num_update)
        else:
            state = self.optimizer.create_state_multi_precision(part.plain_index, weight)
        self._states[index] = state
        return state

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """Update each server key as its parameter, with the partition's own update count."""
        if isinstance(index, (list, tuple)):
            for i, w, g, s in zip(index, weight, grad, state):
                self._update_one(i, w, g, s)
        else:
            self._update_one(index, weight, grad, state)

    def _update_one(self, key: int, weight: NDArray, grad: NDArray, state: Any) -> None:
        part = self._part(key)
        if part.timing_only:
            return
        plain = part.plain_index
        counts = self.optimizer._index_update_count
        saved = counts.pop(plain, None)
        if key in self._counts:
            counts[plain] = self._counts[key]
        try:
            self.optimizer.update_multi_precision(plain, weight, grad, state)
            self._counts[key] = counts[plain]
        finally:
            counts.pop(plain, None)
            if saved is not None:
                counts[plain] = saved

    def _part(self, key: int) -> Part:
        try:
            return self.parts[key]
        except KeyError:
            raise KeyError(f"server key {key} is not in the bytesched layout sent to this store "
                           "(was the key initialised through the ScheduledKVStore?)") from None

    def _old_parts_covering(self, key: int, part: Part) -> list[int]:
        """Older-generation keys of the same parameter whose states overlap ``part``."""
        if "_older" not in self.__dict__:  # built once per layout: thousands of keys stay linear
            self._older: dict[int | str, list[tuple[int, int]]] = {}
            for k, p in sorted(self.parts.items(), key=lambda item: item[1].start):
                if p.generation < self.generation:
                    self._older.setdefault(p.plain_index, []).append((k, p.generation))
        return [k for k, _ in self._older.get(part.plain_index, [])
                if k in self._states and self.parts[k].start < part.stop and part.start < self.parts[k].stop]


def _carry_over(part: Part, sources: list[tuple[Part, Any]]) -> Any:
    """Build ``part``'s state from the overlapping slices of older partitions' states."""
    first = sources[0][1]
    if first is None:
        return None
    if isinstance(first, (tuple, list)):
        items = [_carry_over(part, [(p, s[i]) for p, s in sources]) for i in range(len(first))]
        return type(first)(items)
    if isinstance(first, NDArray):
        pieces = []
        for old, state in sources:
            if state.size != old.stop - old.start:
                raise ValueError(f"optimizer state of shape {state.shape} is not elementwise "
                                 f"(partition of {old.stop - old.start} elements): this "
                                 "optimizer cannot be re-partitioned")
            lo, hi = max(part.start, old.start) - old.start, min(part.stop, old.stop) - old.start
            pieces.append(state.reshape(-1)[lo:hi])
        return concat(*pieces, dim=0) if len(pieces) > 1 else pieces[0].copy()
    return first  # a scalar kept per parameter: the same in every old partition
