"""The rank-0 channel: rank 0 (the leader) tells the other ranks (the followers) what it decided.

Rank 0 decides the start order of sub-tasks and followers in ``rank0`` order mode start exactly
that order (paper §3.2, rank-0 ordering). The same channel carries small typed broadcasts from
rank 0 (the tuner's partition, credit and switch step) and reports from followers back to rank 0
(:meth:`ChannelFollower.report`, :meth:`ChannelLeader.gather`).

:mod:`.protocol` is the wire format (frames, codec, payloads; no I/O) and :mod:`.transport` the
ZeroMQ sockets, the I/O threads, liveness and goodbyes.
"""

from .protocol import (MAX_FRAME_BYTES, MAX_NAME_BYTES, MAX_ORDER_KEYS, ChannelError, FrameCodec, MessageType,
                       PeerLost, Rejected, check_kind, decode_order, decode_typed, encode_order, encode_typed)
from .transport import DEFAULT_PORT, ChannelFollower, ChannelLeader, open_channel

__all__ = [
    "ChannelError", "ChannelLeader", "ChannelFollower", "FrameCodec", "MessageType", "PeerLost", "Rejected",
    "open_channel", "DEFAULT_PORT", "encode_order", "decode_order", "encode_typed", "decode_typed", "check_kind",
    "MAX_FRAME_BYTES", "MAX_ORDER_KEYS", "MAX_NAME_BYTES",
]
