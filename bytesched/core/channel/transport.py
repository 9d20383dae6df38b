"""The rank-0 channel's transport: one ZeroMQ socket and one I/O thread per end.

Rank 0 binds one ZeroMQ ROUTER socket to ``BYTESCHED_CHANNEL_HOST:PORT`` (that
interface only); each follower connects a DEALER to it and says hello. When the port is not set,
rank 0 binds a free port and :func:`open_channel` hands it to the followers through the caller's
``share_port`` collective (the plugin's backend broadcast), so two jobs on one host never collide;
callers without a collective fall back to :data:`DEFAULT_PORT`. ZeroMQ keeps one queue per
peer and the leader publishes nothing before every follower said hello, so no announcement is
lost to a late joiner (PUB/SUB's slow-joiner problem). Each end has one I/O thread that owns its
socket and sleeps in a blocking poll; other threads hand it messages through a queue and a
wake-up socket. Sends never block: queues have no high-water mark and a stuck peer is caught by
the liveness check below, not by back-pressure on the Core thread.

A rejected message (:class:`~.protocol.Rejected`) is counted in ``rejected`` and logged: the
first one, then at most one summary every :data:`REJECT_LOG_INTERVAL_S`. Oversized messages do not
even arrive: ZeroMQ's MAXMSGSIZE disconnects their sender.

Liveness: both ends send a heartbeat every :data:`HEARTBEAT_S` (at most a quarter of the
timeout); a peer silent for ``BYTESCHED_FAULT_TIMEOUT_S`` or ``BYTESCHED_CHANNEL_TIMEOUT_S``,
whichever is shorter, is lost: the channel fails with :class:`PeerLost` naming the rank,
``on_failure(error)`` is called on the I/O thread and every later call raises that error. Only
rank 0 hears every follower, so when it loses one it first sends LOST (``rank u32``, a UTF-8
reason) to the others: every surviving rank learns which rank was lost, not just that rank 0
went quiet (docs/reliability.md). Closing says goodbye (BYE,
answered with BYE_ACK once everything sent before it has arrived) for at most ``timeout``
seconds, then drops whatever is left (LINGER 0): :meth:`close` never hangs.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import zmq

from ..config import Config
from ..policies.follow import SubTaskKey
from .protocol import (_FROM_FOLLOWER, _FROM_LEADER, _ORDER_KIND, MAX_FRAME_BYTES, ChannelError, FrameCodec,
                       MessageType, PeerLost, Rejected, check_kind, decode_hello, decode_lost, decode_order,
                       decode_typed, decode_welcome, encode_hello, encode_lost, encode_order, encode_typed,
                       encode_welcome)

log = logging.getLogger("bytesched")

MAX_BACKLOG = 100_000
"""Messages held for a kind nobody subscribed to yet (or reports not gathered yet)."""
HEARTBEAT_S = 1.0
DEFAULT_PORT = 29517
"""Rank 0's port when BYTESCHED_CHANNEL_PORT is unset and the caller cannot share a free one."""
CLOSE_TIMEOUT_S = 2.0
REJECT_LOG_INTERVAL_S = 10.0


class _RejectLog:
    """Counts rejected frames; logs the first, then at most one summary per interval."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0
        self._unlogged = 0
        self._last_log = -math.inf

    def note(self, reason: str, peer: str) -> None:
        self.count += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= REJECT_LOG_INTERVAL_S:
            log.warning("%s rejected %d message(s) (%d in all); the latest from %s: %s",
                        self.where, self._unlogged, self.count, peer, reason)
            self._unlogged = 0
            self._last_log = now


class _PeerState(enum.Enum):
    """Where a joined peer is in saying goodbye."""

    JOINED = "joined"
    LEAVING = "leaving"  # we said BYE, waiting for BYE_ACK
    GONE = "gone"  # it said BYE or acknowledged ours


@dataclass
class _Peer:
    """The other end of one connection, as seen by the I/O thread."""

    rank: int
    route: bytes  # the ROUTER's identity of the connection (the leader's side only)
    last_seen: float
    state: _PeerState = _PeerState.JOINED
    next_in: int = 0
    next_out: int = 0


def _check_config(config: Config, world_size: int, rank: int) -> None:
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size={world_size!r}: the rank-0 channel connects 2 or more ranks")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is not in 0..{world_size - 1}")
    if config.channel_port is None:
        if rank != 0:
            raise ValueError(f"rank {rank} needs rank 0's port: set BYTESCHED_CHANNEL_PORT or open the channel "
                             f"with open_channel(share_port=...)")
    elif not isinstance(config.channel_port, int) or not 1 <= config.channel_port <= 65535:
        raise ValueError(f"BYTESCHED_CHANNEL_PORT={config.channel_port!r} is not a TCP port (1..65535)")
    if not config.channel_host:
        raise ValueError("BYTESCHED_CHANNEL_HOST is empty: give the address rank 0 listens on")
    if not (0 < config.channel_timeout_s < math.inf):
        raise ValueError(f"BYTESCHED_CHANNEL_TIMEOUT_S={config.channel_timeout_s!r} must be a positive "
                         f"finite number of seconds")


class _Endpoint(ABC):
    """What both ends share: the socket, its I/O thread, the outbox, liveness and goodbye."""

    def __init__(self, config: Config, rank: int, world_size: int, socket_type: int,
                 on_failure: Callable[[ChannelError], None] | None) -> None:
        _check_config(config, world_size, rank)
        self._codec = FrameCodec(config.job_token)
        self.rank = rank
        self.world_size = world_size
        host = config.channel_host
        port = "*" if config.channel_port is None else config.channel_port  # "*": a free port
        self.address = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self.timeout = config.channel_timeout_s
        self.liveness_timeout = min(config.channel_timeout_s, config.fault_timeout_s or math.inf)
        self._liveness_variable = ("BYTESCHED_FAULT_TIMEOUT_S" if self.liveness_timeout == config.fault_timeout_s
                                   else "BYTESCHED_CHANNEL_TIMEOUT_S")
        self._heartbeat_s = min(HEARTBEAT_S, self.liveness_timeout / 4)
        self._final_linger_ms = 0  # how long closing the socket may still send (LOST needs a moment)
        self._on_failure = on_failure
        self.failure: ChannelError | None = None
        self._rejects = _RejectLog(f"rank {rank}'s channel")
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # peers joined or left, reports, failure
        self._outbox: list[tuple[MessageType, bytes]] = []
        self._woken = False
        self._stopping = False
        self._closed = False
        self._goodbye_until = -math.inf
        self._io_done = False
        self._context = zmq.Context()
        self._socket = self._context.socket(socket_type)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._socket.setsockopt(zmq.SNDHWM, 0)  # sends never block or drop; liveness catches a stuck peer
        self._socket.setsockopt(zmq.RCVHWM, 0)
        if ":" in host:
            self._socket.setsockopt(zmq.IPV6, 1)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=f"bytesched-channel-{rank}", daemon=True)

    def _discard(self) -> None:
        """Release everything of an end whose I/O thread never started."""
        self._socket.close(linger=0)
        self._context.term()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def rejected(self) -> int:
        """How many received frames were rejected so far."""
        return self._rejects.count

    # -- any thread ---------------------------------------------------------------------------
    def _post(self, mtype: MessageType, payload: bytes = b"") -> None:
        """Queue a message to every peer for the I/O thread."""
        with self._lock:
            self._check_sendable()
            self._outbox.append((mtype, payload))
            self._wake()

    def _wake(self) -> None:
        """Wake the I/O thread (lock held; at most one wake-up byte is ever outstanding)."""
        if not self._woken and not self._io_done:
            self._woken = True
            self._wake_w.send(b"\0")

    def _check_sendable(self) -> None:
        """Raise if the channel can no longer send (lock held)."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise ChannelError(f"rank {self.rank}'s channel to {self.address} was closed")

    def _wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait (lock held) until ``predicate`` holds or the channel failed; False on timeout."""
        return self._changed.wait_for(lambda: self.failure is not None or predicate(), timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Say goodbye for at most ``timeout`` s (0: abort without one), then stop the I/O thread
        and drop whatever is left. Idempotent; never blocks much longer than ``timeout``. May be
        called from a subscriber's callback or the on_failure hook (it then returns at once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if timeout > 0 and self.failure is None and not self._io_done and self._greeted():
                self._outbox.append((MessageType.BYE, b""))
                self._goodbye_until = time.monotonic() + timeout
            self._stopping = True
            self._wake()
        if threading.current_thread() is self._thread:  # the thread finishes as it returns
            return
        self._thread.join(timeout=timeout + 1.0)
        if self._thread.is_alive():
            log.warning("rank %d's channel thread did not stop within %.1f s (a subscriber's callback "
                        "blocks?); leaving it behind", self.rank, timeout + 1.0)
        else:
            self._context.term()

    # -- the I/O thread -----------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        # A peer that dies closes its connection at once: check every peer then, rather than
        # waiting out the timeout (rank 0's ROUTER_MANDATORY send names the one that is gone).
        monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller.register(monitor, zmq.POLLIN)
        next_heartbeat = time.monotonic()
        try:
            while True:
                wait_s = self._heartbeat_s
                if self._stopping:  # saying goodbye: wake up when its time is up
                    wait_s = max(0.0, min(wait_s, self._goodbye_until - time.monotonic()))
                ready = dict(poller.poll(int(wait_s * 1000)))
                if wake_fd in ready:
                    self._drain_wake()
                if self._socket in ready:
                    self._receive_some()
                if monitor in ready:
                    while monitor.poll(0):
                        monitor.recv_multipart()
                    next_heartbeat = time.monotonic()
                with self._lock:
                    outbox, self._outbox = self._outbox, []
                    self._woken = False
                    stopping = self._stopping
                for mtype, payload in outbox:
                    self._send_out(mtype, payload)
                now = time.monotonic()
                if self.failure is not None or (stopping and self._goodbye_done(now)):
                    return
                if now >= next_heartbeat:
                    self._heartbeat(now)
                    next_heartbeat = now + self._heartbeat_s
        except Exception as exc:  # a bug: fail loudly rather than leave peers waiting
            log.exception("rank %d's channel thread failed", self.rank)
            self._fail(ChannelError(f"rank {self.rank}'s channel thread failed: {exc!r}"))
        finally:
            self._socket.disable_monitor()
            monitor.close(linger=0)
            self._socket.close(linger=self._final_linger_ms)
            with self._lock:
                self._io_done = True
                self._wake_r.close()
                self._wake_w.close()

    def _goodbye_done(self, now: float) -> bool:
        """Closing: every peer answered our BYE (or left), or the time for goodbyes is up."""
        with self._lock:
            waiting = self._greeted()
        if waiting and now < self._goodbye_until:
            return False
        if waiting:
            log.warning("rank %d's channel: no goodbye from rank(s) %s in time; closing anyway",
                        self.rank, ", ".join(str(p.rank) for p in waiting))
        return True

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _receive_some(self, limit: int = 1000) -> None:
        """Handle up to ``limit`` waiting messages (then the outbox gets its turn)."""
        for _ in range(limit):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                peer_address = str(frames[-1].get("Peer-Address"))
            except zmq.ZMQError:
                peer_address = "an unknown address"
            try:
                self._on_frames([f.bytes for f in frames], peer_address)
            except Rejected as why:
                self._rejects.note(str(why), peer_address)

    def _send(self, peer: _Peer, mtype: MessageType, payload: bytes = b"") -> None:
        frame = self._codec.seal(mtype, peer.next_out, payload)
        peer.next_out += 1
        try:
            self._socket.send_multipart([peer.route, frame] if peer.route else [frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            error = PeerLost(peer.rank, f"rank {self.rank} cannot reach rank {peer.rank} over {self.address}: "
                                        f"{exc.strerror} (it exited or lost its connection)")
            if self.failure is None:
                self._tell_others(error)
            self._fail(error)

    def _accept(self, peer: _Peer, seq: int, now: float) -> None:
        """Check that ``seq`` is the next message from ``peer``, which is alive."""
        if seq != peer.next_in:
            raise Rejected(f"message {seq} from rank {peer.rank}, expected {peer.next_in} "
                           f"(replayed, lost or reordered)")
        peer.next_in += 1
        peer.last_seen = now

    def _on_goodbye(self, peer: _Peer, mtype: MessageType) -> None:
        """BYE or BYE_ACK from ``peer``: it is gone (a BYE is acknowledged, once that is so)."""
        with self._lock:
            peer.state = _PeerState.GONE
            self._changed.notify_all()
        if mtype == MessageType.BYE:
            self._send(peer, MessageType.BYE_ACK)

    def _say_bye(self, peer: _Peer) -> None:
        if peer.state == _PeerState.JOINED:
            self._send(peer, MessageType.BYE)
            peer.state = _PeerState.LEAVING

    def _check_alive(self, peers: Iterable[_Peer], now: float) -> None:
        for peer in peers:
            if peer.state != _PeerState.GONE and now - peer.last_seen > self.liveness_timeout:
                error = PeerLost(peer.rank, f"rank {peer.rank} has sent nothing to rank {self.rank} over "
                                            f"{self.address} for {now - peer.last_seen:.0f} s "
                                            f"({self._liveness_variable}={self.liveness_timeout:g}): it died, hangs "
                                            "or lost the network")
                self._tell_others(error)
                self._fail(error)
                return

    def _tell_others(self, error: PeerLost) -> None:
        """Rank 0 tells the surviving followers which rank was lost (followers hear only rank 0)."""

    def _fail(self, error: ChannelError) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = error
            self._changed.notify_all()
        log.error("%s", error)
        if self._on_failure is not None:
            try:
                self._on_failure(error)
            except Exception:
                log.exception("the on_failure hook of rank %d's channel raised", self.rank)

    # -- what differs between the ends --------------------------------------------------------
    @abstractmethod
    def _on_frames(self, frames: list[bytes], peer_address: str) -> None:
        """Handle one received message (I/O thread); :class:`Rejected` if it is not valid."""

    @abstractmethod
    def _send_out(self, mtype: MessageType, payload: bytes) -> None:
        """Send a message from the outbox to every peer still joined (I/O thread)."""

    @abstractmethod
    def _heartbeat(self, now: float) -> None:
        """Tell peers this end is alive and check that they are (I/O thread)."""

    @abstractmethod
    def _greeted(self) -> list[_Peer]:
        """Peers that joined and did not leave yet (lock held)."""


class ChannelLeader(_Endpoint):
    """Rank 0's end: waits for every follower, then publishes orders and broadcasts; gathers
    reports. :func:`open_channel` creates it and waits for the followers."""

    def __init__(self, config: Config, world_size: int, *,
                 on_failure: Callable[[ChannelError], None] | None = None) -> None:
        super().__init__(config, 0, world_size, zmq.ROUTER, on_failure)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unreachable follower is an error, not a drop
        try:
            self._socket.bind(self.address)
        except zmq.ZMQError as exc:
            self._discard()
            port = " unset: a free port" if config.channel_port is None else f"={config.channel_port}"
            raise ChannelError(f"rank 0 cannot listen on {self.address} (BYTESCHED_CHANNEL_HOST="
                               f"{config.channel_host}, BYTESCHED_CHANNEL_PORT{port}): "
                               f"{exc.strerror}") from None
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)  # the real port if it was "*"
        self.port = int(self.address.rsplit(":", 1)[1])
        self._by_route: dict[bytes, _Peer] = {}
        self._peers: dict[int, _Peer] = {}
        self._reports: dict[str, dict[int, deque[dict[str, Any]]]] = {}
        self._thread.start()

    @property
    def followers(self) -> list[int]:
        """Ranks that said hello."""
        with self._lock:
            return sorted(self._peers)

    def _missing(self) -> list[int]:
        return [r for r in range(1, self.world_size) if r not in self._peers]

    def wait_for_followers(self, timeout: float | None = None) -> None:
        """Block until every follower said hello; ChannelError naming the missing ranks after
        ``timeout`` (default ``BYTESCHED_CHANNEL_TIMEOUT_S``)."""
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            if self._wait(lambda: not self._missing(), timeout):
                self._check_sendable()
                return
            missing = self._missing()
        hint = (f"; {self.rejected} message(s) were rejected, e.g. for another BYTESCHED_JOB_TOKEN"
                if self.rejected else "")
        raise ChannelError(f"rank 0's channel on {self.address}: rank(s) {', '.join(map(str, missing))} "
                           f"did not say hello within {timeout:g} s (are they running, with the same "
                           f"BYTESCHED_CHANNEL_HOST/PORT and job token?){hint}")

    def publish_order(self, keys: list[SubTaskKey]) -> None:
        """Tell every follower that these sub-tasks were started, in this order."""
        for payload in encode_order(keys):
            self._post(MessageType.ORDER, payload)

    def subscribe_order(self, on_keys: Callable[[list[SubTaskKey]], None]) -> None:
        """Not for rank 0, which decides the order (part of the Core's OrderChannel protocol)."""
        raise ChannelError("rank 0 decides the order; only followers subscribe to it")

    def broadcast(self, kind: str, body: dict[str, Any]) -> None:
        """Send ``body`` (a small JSON object) to every follower's subscribers of ``kind``."""
        self._post(MessageType.BROADCAST, encode_typed(kind, body))

    def gather(self, kind: str, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        """The next report of ``kind`` from every follower, by rank. Waits up to ``timeout``
        (default ``BYTESCHED_CHANNEL_TIMEOUT_S``), then ChannelError naming the ranks missing."""
        check_kind(kind)
        timeout = self.timeout if timeout is None else timeout
        ranks = range(1, self.world_size)
        with self._lock:
            queues = self._reports.setdefault(kind, {})
            arrived = self._wait(lambda: all(queues.get(r) for r in ranks), timeout)
            if self.failure is not None:
                raise self.failure
            if not arrived:
                missing = ", ".join(str(r) for r in ranks if not queues.get(r))
                raise ChannelError(f"rank 0 gathered no {kind!r} report from rank(s) {missing} within {timeout:g} s")
            return {r: queues[r].popleft() for r in ranks}

    def _check_sendable(self) -> None:
        super()._check_sendable()
        if self._missing():
            raise ChannelError(f"rank 0 cannot send before every follower said hello (missing: "
                               f"{', '.join(map(str, self._missing()))}); call wait_for_followers() "
                               f"first (open_channel does)")

    # -- the I/O thread -----------------------------------------------------------------------
    def _on_frames(self, frames: list[bytes], peer_address: str) -> None:
        if len(frames) != 2:
            raise Rejected(f"{len(frames) - 1} frame(s) in one message, expected 1")
        route, frame = frames
        mtype, seq, payload = self._codec.open(frame)
        now = time.monotonic()
        peer = self._by_route.get(route)
        if peer is None:
            self._on_hello(route, mtype, seq, payload, now, peer_address)
            return
        if mtype not in _FROM_FOLLOWER:
            raise Rejected(f"rank {peer.rank} sent a {mtype.name}, which followers do not send")
        self._accept(peer, seq, now)
        if mtype == MessageType.REPORT:
            kind, body = decode_typed(payload)
            with self._lock:
                queue = self._reports.setdefault(kind, {}).setdefault(peer.rank, deque())
                if len(queue) >= MAX_BACKLOG:
                    raise Rejected(f"{MAX_BACKLOG} {kind!r} reports from rank {peer.rank} are not gathered yet")
                queue.append(body)
                self._changed.notify_all()
        elif mtype in (MessageType.BYE, MessageType.BYE_ACK):
            self._on_goodbye(peer, mtype)

    def _on_hello(self, route: bytes, mtype: MessageType, seq: int, payload: bytes, now: float,
                  peer_address: str) -> None:
        if mtype != MessageType.HELLO or seq != 0:
            raise Rejected(f"a new connection must start with HELLO #0, got {mtype.name} #{seq}")
        rank, world_size = decode_hello(payload)
        peer = _Peer(rank, route, now, next_in=1)
        if world_size != self.world_size:  # answered, so that it fails with a clear error
            log.error("rank %d at %s was started for a job of %d ranks; rank 0 runs %d",
                      rank, peer_address, world_size, self.world_size)
            self._send(peer, MessageType.WELCOME, encode_welcome(self.world_size))
            return
        if not 1 <= rank < self.world_size:
            raise Rejected(f"hello from rank {rank}, not in 1..{self.world_size - 1}")
        with self._lock:
            if rank in self._peers:
                raise Rejected(f"a second hello from rank {rank} (two processes with one rank?)")
            self._peers[rank] = self._by_route[route] = peer
            self._changed.notify_all()
        self._send(peer, MessageType.WELCOME, encode_welcome(self.world_size))
        log.debug("rank 0's channel: rank %d joined from %s", rank, peer_address)

    def _send_out(self, mtype: MessageType, payload: bytes) -> None:
        for peer in list(self._peers.values()):
            if mtype == MessageType.BYE:
                self._say_bye(peer)
            elif peer.state == _PeerState.JOINED:
                self._send(peer, mtype, payload)

    def _heartbeat(self, now: float) -> None:
        peers = list(self._peers.values())
        for peer in peers:
            if peer.state == _PeerState.JOINED:
                self._send(peer, MessageType.HEARTBEAT)
        self._check_alive(peers, now)

    def _greeted(self) -> list[_Peer]:
        return [p for _, p in sorted(self._peers.items()) if p.state != _PeerState.GONE]

    def _tell_others(self, error: PeerLost) -> None:
        payload = encode_lost(error.lost_rank, str(error))
        for peer in list(self._peers.values()):
            if peer.rank != error.lost_rank and peer.state == _PeerState.JOINED:
                self._send(peer, MessageType.LOST, payload)
        self._final_linger_ms = 1000


class ChannelFollower(_Endpoint):
    """A follower's end: says hello to rank 0, then delivers its announcements to subscribers,
    in order, on the channel's thread. :func:`open_channel` creates it and waits for the welcome.

    Messages of a kind nobody subscribed to yet are kept (up to :data:`MAX_BACKLOG`) and handed to
    its first subscriber, so subscribing after connecting loses nothing.
    """

    def __init__(self, config: Config, rank: int, world_size: int, *,
                 on_failure: Callable[[ChannelError], None] | None = None) -> None:
        if rank == 0:
            raise ValueError("rank 0 leads the channel: use ChannelLeader (or open_channel)")
        super().__init__(config, rank, world_size, zmq.DEALER, on_failure)
        self._leader = _Peer(0, b"", time.monotonic())
        self._welcomed = False
        self._deliveries = threading.RLock()  # held while callbacks run: keeps them in order
        self._subscribers: dict[str, list[Callable[[Any], None]]] = {}
        self._backlog: dict[str, deque[Any]] = {}
        try:
            self._socket.connect(self.address)
        except zmq.ZMQError as exc:
            self._discard()
            raise ChannelError(f"rank {rank} cannot connect to {self.address} (BYTESCHED_CHANNEL_HOST/PORT): "
                               f"{exc.strerror}") from None
        self._thread.start()
        self._post(MessageType.HELLO, encode_hello(rank, world_size))  # queued until connected

    def wait_for_leader(self, timeout: float | None = None) -> None:
        """Block until rank 0 welcomed this rank; ChannelError after ``timeout`` (default
        ``BYTESCHED_CHANNEL_TIMEOUT_S``)."""
        timeout = self.timeout if timeout is None else timeout
        with self._lock:
            if self._wait(lambda: self._welcomed, timeout):
                self._check_sendable()
                return
        hint = f"; {self.rejected} message(s) from it were rejected" if self.rejected else ""
        raise ChannelError(f"rank {self.rank}: no welcome from rank 0 at {self.address} within {timeout:g} s "
                           f"(is rank 0 running, with the same BYTESCHED_CHANNEL_HOST/PORT and job token?){hint}")

    def subscribe_order(self, on_keys: Callable[[list[SubTaskKey]], None]) -> None:
        """Call ``on_keys`` with each order announcement, in order (on the channel's thread)."""
        self._subscribe(_ORDER_KIND, on_keys)

    def publish_order(self, keys: list[SubTaskKey]) -> None:
        """Not for followers (part of the Core's OrderChannel protocol)."""
        raise ChannelError(f"rank {self.rank} follows rank 0's order; only rank 0 publishes it")

    def subscribe(self, kind: str, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback(body)`` for each broadcast of ``kind``, in order, on the channel's
        thread (keep it short: later messages wait for it)."""
        check_kind(kind)
        self._subscribe(kind, callback)

    def report(self, kind: str, body: dict[str, Any]) -> None:
        """Send ``body`` (a small JSON object) to rank 0, which collects it with ``gather(kind)``."""
        payload = encode_typed(kind, body)
        with self._lock:
            self._check_sendable()
            if self._leader.state != _PeerState.JOINED:
                raise ChannelError(f"rank {self.rank} cannot report {kind!r}: rank 0 closed the channel")
        self._post(MessageType.REPORT, payload)

    def _subscribe(self, kind: str, callback: Callable[[Any], None]) -> None:
        with self._deliveries:
            self._subscribers.setdefault(kind, []).append(callback)
            for value in self._backlog.pop(kind, ()):
                self._call(callback, kind, value)

    def _deliver(self, kind: str, value: Any) -> None:
        with self._deliveries:
            callbacks = self._subscribers.get(kind)
            if callbacks is None:
                backlog = self._backlog.setdefault(kind, deque())
                if len(backlog) >= MAX_BACKLOG:
                    raise Rejected(f"{MAX_BACKLOG} {kind.lstrip('_')!r} messages wait and nobody subscribed")
                backlog.append(value)
                return
            for callback in callbacks:
                self._call(callback, kind, value)

    def _call(self, callback: Callable[[Any], None], kind: str, value: Any) -> None:
        try:
            callback(value)
        except Exception:  # the subscriber's bug: it must not stop later deliveries
            log.exception("rank %d: a subscriber of %r raised", self.rank, kind.lstrip("_"))

    # -- the I/O thread -----------------------------------------------------------------------
    def _on_frames(self, frames: list[bytes], peer_address: str) -> None:
        if len(frames) != 1:
            raise Rejected(f"{len(frames)} frames in one message, expected 1")
        mtype, seq, payload = self._codec.open(frames[0])
        if mtype not in (_FROM_LEADER if self._welcomed else (MessageType.WELCOME,)):
            raise Rejected(f"an unexpected {mtype.name} #{seq} "
                           f"{'from rank 0' if self._welcomed else 'before the welcome'}")
        leader = self._leader
        self._accept(leader, seq, time.monotonic())
        if mtype == MessageType.ORDER:
            self._deliver(_ORDER_KIND, decode_order(payload))
        elif mtype == MessageType.BROADCAST:
            self._deliver(*decode_typed(payload))
        elif mtype == MessageType.WELCOME:
            self._on_welcome(payload)
        elif mtype == MessageType.LOST:
            lost, reason = decode_lost(payload)
            self._fail(PeerLost(lost, f"rank {lost} was lost (rank 0 noticed: {reason})"))
        elif mtype in (MessageType.BYE, MessageType.BYE_ACK):
            self._on_goodbye(leader, mtype)

    def _on_welcome(self, payload: bytes) -> None:
        world_size = decode_welcome(payload)
        if world_size != self.world_size:
            self._fail(ChannelError(f"rank 0 at {self.address} runs a job of {world_size} ranks, but rank "
                                    f"{self.rank} was started with world size {self.world_size}"))
            return
        with self._lock:
            self._welcomed = True
            self._changed.notify_all()

    def _send_out(self, mtype: MessageType, payload: bytes) -> None:
        if mtype == MessageType.BYE:
            self._say_bye(self._leader)
        elif self._leader.state == _PeerState.JOINED:
            self._send(self._leader, mtype, payload)

    def _heartbeat(self, now: float) -> None:
        if not self._welcomed:  # the handshake has its own timeout (wait_for_leader)
            self._leader.last_seen = now
            return
        if self._leader.state == _PeerState.JOINED:
            self._send(self._leader, MessageType.HEARTBEAT)
        self._check_alive([self._leader], now)

    def _greeted(self) -> list[_Peer]:
        return [self._leader] if self._welcomed and self._leader.state != _PeerState.GONE else []


def open_channel(config: Config, rank: int, world_size: int, *,
                 on_failure: Callable[[ChannelError], None] | None = None,
                 share_port: Callable[[int], int] | None = None) -> ChannelLeader | ChannelFollower:
    """This rank's end of the rank-0 channel, once every rank is connected.

    Rank 0 listens and waits for every follower's hello; a follower connects and waits for rank
    0's welcome; both up to ``BYTESCHED_CHANNEL_TIMEOUT_S``, then ChannelError naming who is
    missing. ``on_failure(error)`` is called (on the channel's thread) if a peer is later lost.

    ``share_port(port) -> port`` is a collective every rank calls (a broadcast of one int from rank
    0, e.g. over Horovod): with it and no ``BYTESCHED_CHANNEL_PORT``, rank 0 listens on a free port
    and the followers learn it, so jobs sharing a host do not collide. Rank 0 takes part even when
    it cannot listen (it shares 0), so the followers fail with a message instead of waiting.
    """
    if config.channel_port is None and share_port is None:
        config = dataclasses.replace(config, channel_port=DEFAULT_PORT)
    end: ChannelLeader | ChannelFollower
    if rank == 0:
        if config.channel_port is not None or share_port is None:  # (no share_port: the port is set)
            end = ChannelLeader(config, world_size, on_failure=on_failure)
        else:
            end = _lead_on_free_port(config, world_size, on_failure, share_port)
    else:
        if config.channel_port is None and share_port is not None:  # (no share_port: the port is set)
            port = share_port(0)
            if port == 0:
                raise ChannelError(f"rank {rank}: rank 0 could not open the channel on a free port of "
                                   f"{config.channel_host} (its log says why)")
            config = dataclasses.replace(config, channel_port=port)
        end = ChannelFollower(config, rank, world_size, on_failure=on_failure)
    try:
        end.wait_for_followers() if isinstance(end, ChannelLeader) else end.wait_for_leader()
    except BaseException:
        end.close(timeout=0)
        raise
    return end


def _lead_on_free_port(config: Config, world_size: int, on_failure: Callable[[ChannelError], None] | None,
                       share_port: Callable[[int], int]) -> ChannelLeader:
    """Rank 0 listens on a free port and shares it; it shares 0 if it cannot listen, so the
    followers, who wait in the same collective, fail too instead of hanging."""
    try:
        leader = ChannelLeader(config, world_size, on_failure=on_failure)
    except BaseException:
        share_port(0)
        raise
    try:
        share_port(leader.port)
    except BaseException:
        leader.close(timeout=0)
        raise
    return leader

