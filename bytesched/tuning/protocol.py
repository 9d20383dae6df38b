"""The tuning protocol: what rank 0 broadcasts and what followers report back, and its checks.

Rank 0 sends one :class:`Switch` per trial after the first over the rank-0 channel (kind
``tuning.switch``): from step ``step`` on, use these sizes; the next switch comes at ``next_step``
(``None``: this is the final choice, there is no next). Trial 0, the configured sizes, every rank
applies by itself at its first step, so the first message is due only after training has carried
every rank past its start. Each follower blocks at the step it was told, until that step's switch
has arrived, then applies it and reports :class:`Applied` (kind ``tuning.applied``), for trial 0
too; rank 0 checks every report a few steps later. So correctness never depends on timing:

- a late switch makes followers wait for it and apply it at the agreed step, never at another;
- a lost switch (or a rank 0 that died) fails the follower after the channel timeout with an
  error naming the step, instead of ranks silently partitioning differently (with rank-0
  ordering, different partition keys would deadlock);
- a rank that applied something else, or nothing, fails rank 0 naming that rank.

Bodies are small JSON objects; the channel authenticates and frames them (no pickle anywhere).
:meth:`Switch.from_body` and :meth:`Applied.from_body` accept exactly the fields written by
:meth:`~Switch.to_body` with the right types and ranges, nothing else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..core.config import SchedulingParams

SWITCH = "tuning.switch"
APPLIED = "tuning.applied"
MAX_BYTES = 2**50
"""Largest partition or credit a message may carry (the Core's own limit: 1 PiB)."""
MAX_STEP = 2**62


class TuningProtocolError(RuntimeError):
    """The ranks disagree about tuning (a malformed, unexpected, late or lost message)."""


def _check_fields(kind: str, body: Any, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """``body`` is a JSON object with exactly ``names``, each an integer (``optional`` ones may be null)."""
    if not isinstance(body, dict):
        raise TuningProtocolError(f"a {kind!r} message must be a JSON object, got {type(body).__name__}")
    if set(body) != set(names):
        missing = sorted(set(names) - set(body))
        extra = sorted(set(body) - set(names))
        raise TuningProtocolError(f"a {kind!r} message has fields {sorted(body)}: missing {missing}, unknown {extra}")
    for name in names:
        value = body[name]
        if not (isinstance(value, int) and not isinstance(value, bool)) and not (value is None and name in optional):
            raise TuningProtocolError(f"a {kind!r} message has {name}={value!r}: expected an integer")


def _check_range(kind: str, name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise TuningProtocolError(f"a {kind!r} message has {name}={value}: expected {low}..{high}")


@dataclass(frozen=True)
class Switch:
    """From step ``step`` on, every rank uses ``partition``/``credit`` bytes and batches pieces
    under ``batch`` bytes (0: no batching) (trial ``trial``)."""

    trial: int
    step: int
    partition: int
    credit: int
    next_step: int | None
    """The step of the next switch; None when this is the final choice."""
    batch: int = 0

    @classmethod
    def of(cls, trial: int, step: int, params: SchedulingParams, next_step: int | None) -> "Switch":
        """Trial ``trial``'s switch to ``params`` (whose sizes are set) at ``step``."""
        return cls(trial, step, int(params.partition_bytes), int(params.credit_bytes),  # type: ignore[arg-type]  # set
                   next_step, int(params.batch_bytes))

    @property
    def final(self) -> bool:
        return self.next_step is None

    @property
    def params(self) -> SchedulingParams:
        return SchedulingParams(partition_bytes=self.partition, credit_bytes=self.credit, batch_bytes=self.batch)

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> "Switch":
        """The switch in a received body; TuningProtocolError naming the bad field otherwise."""
        _check_fields(SWITCH, body, tuple(f.name for f in fields(cls)), optional=("next_step",))
        _check_range(SWITCH, "trial", body["trial"], 0, MAX_STEP)
        _check_range(SWITCH, "step", body["step"], 0, MAX_STEP)
        _check_range(SWITCH, "partition", body["partition"], 1, MAX_BYTES)
        _check_range(SWITCH, "credit", body["credit"], 1, MAX_BYTES)
        _check_range(SWITCH, "batch", body["batch"], 0, MAX_BYTES)
        if body["next_step"] is not None:
            _check_range(SWITCH, "next_step", body["next_step"], body["step"] + 1, MAX_STEP)
        return cls(**body)


@dataclass(frozen=True)
class Applied:
    """A follower's report: at step ``step`` it switched to trial ``trial``'s sizes (and batching
    threshold)."""

    rank: int
    trial: int
    step: int
    partition: int
    credit: int
    batch: int = 0

    @classmethod
    def of(cls, rank: int, switch: Switch, step: int) -> "Applied":
        """``rank``'s report that it applied ``switch`` at ``step``."""
        return cls(rank, switch.trial, step, switch.partition, switch.credit, switch.batch)

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> "Applied":
        _check_fields(APPLIED, body, tuple(f.name for f in fields(cls)))
        for name in ("rank", "trial", "step"):
            _check_range(APPLIED, name, body[name], 0, MAX_STEP)
        return cls(**body)

    def agrees_with(self, switch: Switch) -> bool:
        return (self.trial, self.step, self.partition, self.credit, self.batch) == \
            (switch.trial, switch.step, switch.partition, switch.credit, switch.batch)
