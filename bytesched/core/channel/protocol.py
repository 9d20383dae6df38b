"""The rank-0 channel's protocol: frames, their codec and the messages' payloads, with no I/O.

Everything here is pure (bytes in, values out), so it is tested without sockets; the I/O
threads and ZeroMQ sockets are in :mod:`.transport`.

Wire format, one ZeroMQ frame per message (no pickle anywhere)::

    magic b"BSch" | version u8 | type u8 | sequence u64 | payload | MAC (16 bytes)

- MAC: keyed BLAKE2b of everything before it, keyed with the job token (``BYTESCHED_JOB_TOKEN``,
  or derived from the launcher's rendezvous, see :func:`~bytesched.core.config.launcher_job_token`).
  The token itself never travels. It keeps out whoever does not know it (stale processes, another
  job on the same port, scanners); it does not encrypt, and a derived token is no secret.
- sequence: per direction and peer, counting from 0, so a replayed, lost or reordered message is
  rejected.
- payload: HELLO ``rank, world_size`` (u32 each); WELCOME ``world_size``; ORDER a table of the
  distinct tensor names then three arrays (name index u16, instance u32, partition index u32),
  at most :data:`MAX_ORDER_KEYS` keys per message; BROADCAST and REPORT a kind (a short
  lower-case name) and a JSON object; HEARTBEAT, BYE and BYE_ACK nothing.

Anything else (another token, bad magic or version, truncated, out of sequence, unexpected,
malformed) raises :class:`Rejected`; the transport counts and logs it, and it never reaches a
subscriber nor stops the channel.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re
import struct
from typing import Any, Sequence

from ..policies.follow import SubTaskKey

MAGIC = b"BSch"
VERSION = 1
MAC_BYTES = 16
MAX_FRAME_BYTES = 1 << 20
"""Largest message accepted; ZeroMQ disconnects a peer that sends a bigger one."""
MAX_NAME_BYTES = 1024
"""Longest tensor name (UTF-8) in an order announcement."""
MAX_ORDER_KEYS = 512
"""Keys per ORDER message; a longer announcement is split (512 of the longest names fit a frame)."""

_HEADER = struct.Struct("<4sBBQ")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HELLO = struct.Struct("<II")
_KIND_RE = re.compile(r"[a-z][a-z0-9_.-]{0,63}\Z")
_ORDER_KIND = "_order"  # internal: user kinds match _KIND_RE, so they never start with "_"
_MAX_JSON_DEPTH = 32


class MessageType(enum.IntEnum):
    """The type byte of a frame."""

    HELLO = 1
    WELCOME = 2
    ORDER = 3
    BROADCAST = 4
    REPORT = 5
    HEARTBEAT = 6
    BYE = 7
    BYE_ACK = 8
    LOST = 9


_FROM_LEADER = frozenset({MessageType.ORDER, MessageType.BROADCAST, MessageType.HEARTBEAT, MessageType.BYE,
                          MessageType.BYE_ACK, MessageType.LOST})  # once the follower was welcomed
_FROM_FOLLOWER = frozenset({MessageType.REPORT, MessageType.HEARTBEAT, MessageType.BYE, MessageType.BYE_ACK})


class ChannelError(RuntimeError):
    """The rank-0 channel cannot do what was asked (peer missing or lost, bad set-up, misuse)."""


class PeerLost(ChannelError):
    """A rank of the job stopped answering: it died, hangs, or lost the network."""

    def __init__(self, lost_rank: int, message: str) -> None:
        super().__init__(message)
        self.lost_rank = lost_rank


class Rejected(ValueError):
    """A received frame is not a valid message of this job; the reason is logged, not raised."""


# ----------------------------------------------------------------------------------------------
# Frames and payloads.


class FrameCodec:
    """Seals frames with the job token and opens (validates) received ones."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ChannelError(
                "the rank-0 channel needs a job token shared by every rank: set BYTESCHED_JOB_TOKEN "
                "to the same value on all ranks, or start the job with horovodrun, torchrun or "
                "bytesched launch, whose rendezvous it is then derived from")
        self._key = hashlib.sha256(b"bytesched-channel\0" + token.encode()).digest()

    def _mac(self, data: bytes) -> bytes:
        return hashlib.blake2b(data, key=self._key, digest_size=MAC_BYTES).digest()

    def seal(self, mtype: MessageType, seq: int, payload: bytes = b"") -> bytes:
        """The frame carrying ``payload`` as message number ``seq`` of its direction."""
        data = _HEADER.pack(MAGIC, VERSION, mtype, seq) + payload
        return data + self._mac(data)

    def open(self, frame: bytes) -> tuple[MessageType, int, bytes]:
        """``(type, sequence, payload)`` of an authentic frame; :class:`Rejected` otherwise."""
        if len(frame) < _HEADER.size + MAC_BYTES:
            raise Rejected(f"a {len(frame)}-byte frame is shorter than any channel message")
        if len(frame) > MAX_FRAME_BYTES:
            raise Rejected(f"a {len(frame)}-byte frame exceeds {MAX_FRAME_BYTES} bytes")
        data, mac = frame[:-MAC_BYTES], frame[-MAC_BYTES:]
        magic, version, mtype, seq = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise Rejected("not a bytesched channel message (bad magic)")
        if version != VERSION:
            raise Rejected(f"channel protocol version {version}, this rank speaks {VERSION}")
        if not hmac.compare_digest(mac, self._mac(data)):
            raise Rejected("authentication failed: another job's token, or a corrupted message")
        try:
            return MessageType(mtype), seq, data[_HEADER.size:]
        except ValueError:
            raise Rejected(f"unknown message type {mtype}") from None


def encode_order(keys: Sequence[SubTaskKey]) -> list[bytes]:
    """ORDER payloads for ``keys`` (in order), split every :data:`MAX_ORDER_KEYS` keys."""
    return [_encode_order_chunk(keys[i:i + MAX_ORDER_KEYS]) for i in range(0, len(keys), MAX_ORDER_KEYS)]


def _encode_order_chunk(keys: Sequence[SubTaskKey]) -> bytes:
    table: dict[str, int] = {}
    name_index = [table.setdefault(name, len(table)) for name, _, _ in keys]
    parts = [_U16.pack(len(table))]
    for name in table:
        raw = name.encode()
        if not 0 < len(raw) <= MAX_NAME_BYTES:
            raise ValueError(f"tensor name {name[:80]!r}... is {len(raw)} bytes in UTF-8; the rank-0 "
                             f"channel carries names of 1 to {MAX_NAME_BYTES} bytes")
        parts += (_U16.pack(len(raw)), raw)
    n = len(keys)
    try:
        parts += (_U32.pack(n), struct.pack(f"<{n}H", *name_index),
                  struct.pack(f"<{n}I", *[k[1] for k in keys]), struct.pack(f"<{n}I", *[k[2] for k in keys]))
    except struct.error:
        raise ValueError(f"an instance or partition index in {keys[:3]}... is not in 0..2**32-1") from None
    return b"".join(parts)


def decode_order(payload: bytes) -> list[SubTaskKey]:
    """The keys of an ORDER payload; :class:`Rejected` if it is malformed."""
    try:
        (n_names,) = _U16.unpack_from(payload, 0)
        offset = _U16.size
        names = []
        for _ in range(n_names):
            (length,) = _U16.unpack_from(payload, offset)
            offset += _U16.size
            if not 0 < length <= MAX_NAME_BYTES or offset + length > len(payload):
                raise Rejected(f"order: a name of {length} bytes does not fit")
            names.append(payload[offset:offset + length].decode("utf-8"))
            offset += length
        (n,) = _U32.unpack_from(payload, offset)
        offset += _U32.size
        if not 0 < n <= MAX_ORDER_KEYS or len(payload) - offset != 10 * n:
            raise Rejected(f"order: {n} keys do not match a {len(payload)}-byte payload")
        name_index = struct.unpack_from(f"<{n}H", payload, offset)
        instances = struct.unpack_from(f"<{n}I", payload, offset + 2 * n)
        indices = struct.unpack_from(f"<{n}I", payload, offset + 6 * n)
    except (struct.error, UnicodeDecodeError) as exc:
        raise Rejected(f"order: malformed payload ({exc})") from None
    if max(name_index) >= n_names:
        raise Rejected(f"order: name index {max(name_index)} out of a table of {n_names}")
    return list(zip([names[i] for i in name_index], instances, indices))


def check_kind(kind: str) -> None:
    """A broadcast or report kind is a short lower-case name (``params``, ``checksum.step``...)."""
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ValueError(f"message kind {kind!r} must match {_KIND_RE.pattern} (a short lower-case name)")


def _check_json(value: Any, where: str, depth: int = 0) -> None:
    """``value`` round-trips through JSON unchanged: a receiver gets exactly what was sent."""
    if depth > _MAX_JSON_DEPTH:
        raise ValueError(f"{where} nests deeper than {_MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has the key {key!r}: JSON object keys must be str")
            _check_json(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)
    elif value is not None and not isinstance(value, (str, int, float)):  # bool is an int
        raise ValueError(f"{where} is a {type(value).__name__}: use JSON types (dict, list, str, "
                         f"int, float, bool, None)")


def encode_typed(kind: str, body: dict[str, Any]) -> bytes:
    """BROADCAST/REPORT payload; ValueError naming the culprit if it is not a small JSON object."""
    check_kind(kind)
    if not isinstance(body, dict):
        raise ValueError(f"the body of a {kind!r} message must be a dict, got {type(body).__name__}")
    _check_json(body, f"body of {kind!r}")
    data = json.dumps(body, separators=(",", ":")).encode()
    payload = bytes([len(kind)]) + kind.encode() + data
    if len(payload) > MAX_FRAME_BYTES - _HEADER.size - MAC_BYTES:
        raise ValueError(f"the {kind!r} message is {len(payload)} bytes; the channel carries at most "
                         f"{MAX_FRAME_BYTES - _HEADER.size - MAC_BYTES} (send small messages)")
    return payload


def decode_typed(payload: bytes) -> tuple[str, dict[str, Any]]:
    """``(kind, body)`` of a BROADCAST/REPORT payload; :class:`Rejected` if malformed."""
    if not payload or len(payload) < 1 + payload[0]:
        raise Rejected("typed message: truncated kind")
    try:
        kind = payload[1:1 + payload[0]].decode("ascii")
        check_kind(kind)
        body = json.loads(payload[1 + payload[0]:])
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Rejected(f"typed message: {exc}") from None
    if not isinstance(body, dict):
        raise Rejected(f"typed message {kind!r}: the body is not a JSON object")
    return kind, body


# ----------------------------------------------------------------------------------------------
# The two ends.


def encode_hello(rank: int, world_size: int) -> bytes:
    """HELLO: the follower's rank and the world size it was started with."""
    return _HELLO.pack(rank, world_size)


def decode_hello(payload: bytes) -> tuple[int, int]:
    if len(payload) != _HELLO.size:
        raise Rejected("malformed HELLO")
    rank, world_size = _HELLO.unpack(payload)
    return rank, world_size


def encode_welcome(world_size: int) -> bytes:
    """WELCOME: rank 0's world size (a follower started for another job size fails on it)."""
    return _U32.pack(world_size)


def decode_welcome(payload: bytes) -> int:
    if len(payload) != _U32.size:
        raise Rejected("malformed WELCOME")
    return int(_U32.unpack(payload)[0])


def encode_lost(rank: int, reason: str) -> bytes:
    """LOST: which rank rank 0 lost, and why (UTF-8, cut to :data:`MAX_NAME_BYTES`)."""
    return _U32.pack(rank) + reason.encode()[:MAX_NAME_BYTES]


def decode_lost(payload: bytes) -> tuple[int, str]:
    if len(payload) < _U32.size:
        raise Rejected("malformed LOST")
    return int(_U32.unpack_from(payload)[0]), payload[_U32.size:].decode("utf-8", "replace")
