"""A job's :class:`~.lifecycle.Ranks` over the rank-0 channel, for a backend without collectives
of its own to lend (a parameter server: workers talk to servers, never to each other).

Rank 0's value reaches every follower as a typed broadcast, and every follower confirms it, so
rank 0 returns only once every rank holds the same value: what the start-up plan needs before
anyone re-partitions. A follower that hears nothing within the channel's timeout
(``BYTESCHED_CHANNEL_TIMEOUT_S``), or a rank 0 that misses a confirmation, raises a
:class:`~bytesched.core.channel.ChannelError` naming who is missing: ranks that cannot hear each
other cannot agree on anything, so the error stops the job instead of letting the ranks diverge.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any, Callable

from bytesched.core.channel import ChannelError, ChannelFollower, ChannelLeader
from bytesched.core.waiting import get_within

VALUE = "ranks.broadcast"
"""The broadcast that carries rank 0's value."""
RECEIVED = "ranks.received"
"""A follower's confirmation, gathered by rank 0."""


@dataclass
class ChannelRanks:
    """Ranks whose ``broadcast_int`` travels over the rank-0 channel (see the module doc).

    Attributes:
        rank, size: this process's rank and the number of ranks.
        order: what the backend needs of the cross-rank order (:data:`~.lifecycle.Ranks.order`).
        channel: the job's rank-0 channel (rank 0's leader or this rank's follower).
        backend_barrier: the backend's own barrier.
        timeout: seconds a follower waits for a value, and rank 0 for the confirmations.
    """

    rank: int
    size: int
    order: str
    channel: ChannelLeader | ChannelFollower
    backend_barrier: Callable[[], None]
    timeout: float
    _sent: int = field(default=0, init=False)  # broadcasts so far: every rank counts them alike
    _values: "queue.SimpleQueue[dict[str, Any]]" = field(default_factory=queue.SimpleQueue, init=False)

    def __post_init__(self) -> None:
        if self.rank != 0:
            self.channel.subscribe(VALUE, self._values.put)  # type: ignore[union-attr]  # a follower's

    def barrier(self) -> None:
        self.backend_barrier()

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank; on rank 0, once every follower confirmed it."""
        self._sent += 1
        if self.rank == 0:
            leader: ChannelLeader = self.channel  # type: ignore[assignment]  # rank 0's is the leader
            leader.broadcast(VALUE, {"n": self._sent, "value": int(value)})
            reports = leader.gather(RECEIVED, timeout=self.timeout)
            wrong = sorted(rank for rank, body in reports.items() if body.get("n") != self._sent)
            if wrong:
                raise ChannelError(f"rank(s) {', '.join(map(str, wrong))} confirmed another broadcast than "
                                   f"rank 0's number {self._sent}: the ranks broadcast in different orders")
            return int(value)
        try:
            body = get_within(self._values, self.timeout)
        except queue.Empty:
            raise ChannelError(f"rank {self.rank} received no value from rank 0 within {self.timeout:g} s "
                               f"(broadcast number {self._sent})") from None
        if body.get("n") != self._sent or not isinstance(body.get("value"), int):
            raise ChannelError(f"rank {self.rank} expected rank 0's broadcast number {self._sent}, got {body!r}")
        self.channel.report(RECEIVED, {"n": self._sent})  # type: ignore[union-attr]  # a follower's
        return body["value"]
