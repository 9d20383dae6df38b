"""The rank-0 channel: exact ordered delivery, broadcasts and reports, handshake, authentication,
junk from rogue peers, liveness, bounded close, and followers' Cores obeying rank 0's order."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
import multiprocessing.resource_tracker
import os
import random
import signal
import threading
import time
from typing import Any, Callable, Iterator

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bytesched.core import Config, Core, SchedulingParams, SubTask
from bytesched.core.channel import (MAX_ORDER_KEYS, ChannelError, ChannelFollower, ChannelLeader, FrameCodec,
                                    MessageType, Rejected, decode_order, decode_typed, encode_order,
                                    encode_typed, open_channel)
from bytesched.core.channel.protocol import (decode_hello, decode_lost, decode_welcome, encode_hello, encode_lost,
                                             encode_welcome)
from bytesched.launch.ports import free_port

from coretools import BufferTask

TOKEN = "test-job-token"
Key = tuple[str, int, int]


def make_config(port: int, timeout: float = 10.0, token: str = TOKEN, **kwargs: Any) -> Config:
    return Config(channel_port=port, channel_timeout_s=timeout, job_token=token, **kwargs)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@contextlib.contextmanager
def connected(world_size: int, config: Config, on_leader_failure: Callable[[ChannelError], None] | None = None,
              ) -> Iterator[tuple[ChannelLeader, list[ChannelFollower]]]:
    """Rank 0 and every follower of one job, connected (followers on threads), closed after."""
    followers: dict[int, ChannelFollower] = {}
    errors: list[BaseException] = []

    def join(rank: int) -> None:
        try:
            followers[rank] = open_channel(config, rank, world_size)  # type: ignore[assignment]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(1, world_size)]
    for t in threads:
        t.start()
    leader = open_channel(config, 0, world_size, on_failure=on_leader_failure)
    for t in threads:
        t.join(config.channel_timeout_s + 5)
    assert not errors, errors
    assert isinstance(leader, ChannelLeader)
    try:
        yield leader, [followers[r] for r in range(1, world_size)]
    finally:
        for end in [*followers.values(), leader]:
            end.close(timeout=0.5)


class Inbox:
    """What a follower's subscribers received, in arrival order."""

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.log: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def on_keys(self, keys: list[Key]) -> None:
        with self.lock:
            self.keys += keys
            self.log.append(("order", keys))

    def on(self, kind: str) -> Callable[[dict], None]:
        def receive(body: dict) -> None:
            with self.lock:
                self.log.append((kind, body))
        return receive


def order_keys(n: int, seed: int = 0) -> list[Key]:
    """Keys as the Core announces them, with repeated, long and non-ASCII tensor names."""
    rng = random.Random(seed)
    names = [f"layer{i}.weight" for i in range(300)] + ["é" * 200, "emb.\u4e2d\u6587", "x" * 1024]
    return [(rng.choice(names), rng.randrange(2**32), rng.randrange(2**32)) for _ in range(n)]


def batches(keys: list[Key], seed: int = 1) -> Iterator[list[Key]]:
    """Split like drain batches: mostly small, some longer than one ORDER message holds."""
    rng = random.Random(seed)
    i = 0
    while i < len(keys):
        size = rng.choice([1, 2, 7, 50, 200, MAX_ORDER_KEYS, MAX_ORDER_KEYS + 1, 1500])
        yield keys[i:i + size]
        i += size


# ---------------------------------------------------------------------------------------------
# Delivery, in one process (threads).


def test_order_stream_is_delivered_exactly_and_in_order_under_load() -> None:
    keys = order_keys(100_000)
    with connected(3, make_config(free_port())) as (leader, followers):
        inboxes = [Inbox() for _ in followers]
        for follower, inbox in zip(followers, inboxes):
            follower.subscribe_order(inbox.on_keys)
        for batch in batches(keys):
            leader.publish_order(batch)
        assert wait_until(lambda: all(len(i.keys) >= len(keys) for i in inboxes), 30)
        time.sleep(0.05)  # nothing more arrives
        for inbox in inboxes:
            assert inbox.keys == keys
        assert leader.rejected == 0 and all(f.rejected == 0 for f in followers)


def test_broadcasts_and_orders_arrive_in_one_ordered_stream_and_late_subscribers_get_the_backlog() -> None:
    with connected(2, make_config(free_port())) as (leader, [follower]):
        inbox = Inbox()
        follower.subscribe_order(inbox.on_keys)
        follower.subscribe("params", inbox.on("params"))
        sent: list[tuple[str, Any]] = []
        for step in range(50):
            body = {"partition_bytes": 4_000_000 + step, "credit_bytes": float("inf"), "switch_step": step,
                    "note": "é", "nested": [None, True, 1.5, {"a": []}]}
            leader.broadcast("params", body)
            keys = [(f"w{step}", 0, i) for i in range(3)]
            leader.publish_order(keys)
            sent += [("params", body), ("order", keys)]
            leader.broadcast("checksum", {"step": step})
        assert wait_until(lambda: len(inbox.log) == len(sent))
        assert inbox.log == sent
        late = Inbox()
        follower.subscribe("checksum", late.on("checksum"))  # sent before anyone subscribed
        assert late.log == [("checksum", {"step": s}) for s in range(50)]


def test_gather_takes_one_report_per_follower_and_names_the_missing_rank() -> None:
    with connected(3, make_config(free_port())) as (leader, followers):
        for round_ in range(3):
            for follower in followers:
                follower.report("step-time", {"rank": follower.rank, "round": round_})
        for round_ in range(3):
            assert leader.gather("step-time") == {1: {"rank": 1, "round": round_}, 2: {"rank": 2, "round": round_}}
        followers[0].report("checksum", {"value": 1})
        with pytest.raises(ChannelError, match=r"no 'checksum' report from rank\(s\) 2 within 0.3 s"):
            leader.gather("checksum", timeout=0.3)


def test_messages_are_validated_before_they_are_sent() -> None:
    with connected(2, make_config(free_port())) as (leader, [follower]):
        with pytest.raises(ValueError, match=r"body of 'params'\['sizes'\]\[1\] is a tuple"):
            leader.broadcast("params", {"sizes": [1, (2, 3)]})
        with pytest.raises(ValueError, match="has the key 1"):
            leader.broadcast("params", {"a": {1: 2}})
        with pytest.raises(ValueError, match="must be a dict"):
            leader.broadcast("params", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="message kind 'Params!'"):
            leader.broadcast("Params!", {})
        with pytest.raises(ValueError, match="the channel carries at most"):
            follower.report("blob", {"data": "x" * (2 << 20)})
        with pytest.raises(ValueError, match="tensor name 'yyyy"):
            leader.publish_order([("y" * 2000, 0, 0)])
        with pytest.raises(ValueError, match="not in 0..2\\*\\*32-1"):
            leader.publish_order([("w", -1, 0)])
        with pytest.raises(ChannelError, match="only rank 0 publishes"):
            follower.publish_order([("w", 0, 0)])
        with pytest.raises(ChannelError, match="rank 0 decides the order"):
            leader.subscribe_order(print)


def test_set_up_errors_name_the_culprit() -> None:
    port = free_port()
    with pytest.raises(ChannelError, match="BYTESCHED_JOB_TOKEN"):
        ChannelLeader(make_config(port, token=""), 2)
    with pytest.raises(ValueError, match="BYTESCHED_CHANNEL_PORT=0"):
        ChannelLeader(make_config(0), 2)
    with pytest.raises(ValueError, match="world_size=1"):
        open_channel(make_config(port), 0, 1)
    with pytest.raises(ValueError, match=r"rank=2 is not in 0..1"):
        open_channel(make_config(port), 2, 2)
    leader = ChannelLeader(make_config(port), 2)
    try:
        with pytest.raises(ChannelError, match="cannot send before every follower said hello"):
            leader.publish_order([("w", 0, 0)])
        with pytest.raises(ChannelError, match=f"cannot listen on tcp://127.0.0.1:{port}.*BYTESCHED_CHANNEL_PORT"):
            ChannelLeader(make_config(port), 2)
    finally:
        leader.close()


class ThreadSum:
    """A one-shot sum over threads, standing in for the backend's collective (``share_port``)."""

    def __init__(self, parties: int) -> None:
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(parties, timeout=10)
        self.total = 0

    def __call__(self, value: int) -> int:
        with self._lock:
            self.total += value
        self._barrier.wait()
        return self.total


def open_job(config: Config, world_size: int) -> tuple[list[Any], list[BaseException]]:
    """Open every rank's end on threads with a shared ``share_port``; ends by rank, errors."""
    share = ThreadSum(world_size)
    ends: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            ends[rank] = open_channel(config, rank, world_size, share_port=share)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(config.channel_timeout_s + 5)
    return ends, errors


def test_unset_port_gives_each_job_a_free_port_shared_with_its_followers() -> None:
    """Two jobs on one host without BYTESCHED_CHANNEL_PORT: no collision, each job's followers
    reach their own rank 0 (the heartbeat channel is open for every job)."""
    config = make_config(None)  # type: ignore[arg-type]
    jobs = [open_job(config, 2), open_job(config, 3)]
    try:
        for _ends, errors in jobs:
            assert not errors, errors
        ports = [ends[0].port for ends, _ in jobs]
        assert len(set(ports)) == 2 and all(ports), ports
        for (ends, _), port in zip(jobs, ports):
            assert ends[0].followers == list(range(1, len(ends)))
            assert all(end.address == f"tcp://127.0.0.1:{port}" for end in ends)
    finally:
        for ends, _ in jobs:
            for end in ends:
                if end is not None:
                    end.close(timeout=0.5)


def test_rank0_that_cannot_listen_on_a_free_port_fails_its_followers_too() -> None:
    """Rank 0 still takes part in the collective, so followers fail at once instead of waiting
    for a port that never comes."""
    config = make_config(None, channel_host="192.0.2.1")  # type: ignore[arg-type]  # TEST-NET: not ours
    ends, errors = open_job(config, 2)
    messages = sorted(str(e) for e in errors)
    assert len(errors) == 2 and ends == [None, None], (ends, messages)
    assert "rank 0 cannot listen on tcp://192.0.2.1:* (BYTESCHED_CHANNEL_HOST=192.0.2.1, " \
           "BYTESCHED_CHANNEL_PORT unset: a free port)" in messages[0], messages
    assert "rank 1: rank 0 could not open the channel on a free port of 192.0.2.1" in messages[1], messages
    with pytest.raises(ValueError, match="rank 1 needs rank 0's port: set BYTESCHED_CHANNEL_PORT"):
        ChannelFollower(config, 1, 2)


def test_handshake_timeout_names_the_missing_rank() -> None:
    config = make_config(free_port(), timeout=1.0)
    follower_box: list[ChannelFollower] = []
    joiner = threading.Thread(target=lambda: follower_box.append(open_channel(config, 1, 3)))  # type: ignore[arg-type]
    joiner.start()
    t0 = time.monotonic()
    with pytest.raises(ChannelError, match=r"rank\(s\) 2 did not say hello within 1 s") as error:
        open_channel(config, 0, 3)
    assert time.monotonic() - t0 < 3
    assert "1," not in str(error.value)
    joiner.join(5)
    for follower in follower_box:
        follower.close(timeout=0)


def test_a_follower_with_another_token_is_rejected_and_both_sides_say_why(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    errors: list[ChannelError] = []

    def join() -> None:
        try:
            open_channel(make_config(port, timeout=1.0, token="another job"), 1, 2)
        except ChannelError as exc:
            errors.append(exc)

    joiner = threading.Thread(target=join)
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        joiner.start()
        with pytest.raises(ChannelError, match=r"rank\(s\) 1 did not say hello.*rejected"):
            open_channel(make_config(port, timeout=1.0), 0, 2)
        joiner.join(5)
    assert len(errors) == 1 and "no welcome from rank 0" in str(errors[0])
    assert "authentication failed" in caplog.text


def test_a_follower_started_for_another_world_size_is_told_so() -> None:
    config = make_config(free_port(), timeout=2.0)
    leader = ChannelLeader(config, 2)
    try:
        with pytest.raises(ChannelError, match="rank 0 at .* runs a job of 2 ranks, but rank 1 was started "
                                               "with world size 3"):
            open_channel(config, 1, 3)
        assert leader.followers == []  # it did not take rank 1's place
    finally:
        leader.close()


# ---------------------------------------------------------------------------------------------
# Junk: random bytes, truncated and tampered frames, replays. Nothing gets through, nothing breaks.

CODEC = FrameCodec(TOKEN)
GENUINE = [
    CODEC.seal(MessageType.HELLO, 0, (1).to_bytes(4, "little") + (2).to_bytes(4, "little")),
    CODEC.seal(MessageType.ORDER, 1, encode_order([("w", 0, 0), ("v", 1, 2)])[0]),
    CODEC.seal(MessageType.BROADCAST, 1, encode_typed("params", {"credit_bytes": 1})),
    CODEC.seal(MessageType.HEARTBEAT, 7),
]
frames = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda g, cut: g[:cut], st.sampled_from(GENUINE), st.integers(0, 200)),  # truncated
    st.builds(lambda g, i, b: g[:i % len(g)] + bytes([b]) + g[i % len(g) + 1:],  # one byte changed
              st.sampled_from(GENUINE), st.integers(0, 10**6), st.integers(0, 255)).filter(lambda f: f not in GENUINE),
    st.builds(lambda g: FrameCodec("another token").seal(*CODEC.open(g)), st.sampled_from(GENUINE)),
    st.sampled_from(GENUINE),  # replays: out of sequence, or a second hello for a joined rank
)
messages = st.one_of(frames.map(lambda f: [f]), st.lists(frames, min_size=2, max_size=3))


@settings(deadline=None)  # timing is not what is tested; a loaded machine must not fail it
@given(st.binary(max_size=2000))
def test_codec_and_decoders_reject_garbage_with_rejected_only(data: bytes) -> None:
    for parse in (CODEC.open, decode_order, decode_typed, decode_hello, decode_welcome, decode_lost):
        try:
            parse(data)
        except Rejected:
            pass


@settings(deadline=None)
@given(frames)
def test_no_tampered_frame_opens(frame: bytes) -> None:
    if frame in GENUINE:
        CODEC.open(frame)
    else:
        with pytest.raises(Rejected):
            CODEC.open(frame)


NAMES = st.one_of(st.sampled_from(["conv1.weight", "fc.bias", "é" * 300]), st.text(min_size=1, max_size=20))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(NAMES, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=MAX_ORDER_KEYS + 40))
def test_order_encoding_round_trips(keys: list[Key]) -> None:
    decoded = [key for payload in encode_order(keys) for key in decode_order(payload)]
    assert decoded == keys


def test_handshake_and_lost_payloads_round_trip_without_sockets() -> None:
    assert decode_hello(encode_hello(3, 8)) == (3, 8)
    assert decode_welcome(encode_welcome(8)) == 8
    assert decode_lost(encode_lost(2, "silent for 60 s")) == (2, "silent for 60 s")
    assert len(encode_lost(1, "x" * 5000)) == 4 + 1024  # the reason is cut to MAX_NAME_BYTES
    for decode, short in ((decode_hello, b"\0" * 7), (decode_welcome, b"\0" * 3), (decode_lost, b"\0")):
        with pytest.raises(Rejected, match="malformed"):
            decode(short)


def check_junk_rejected_and_logged_once(end: ChannelLeader | ChannelFollower, sent: int, before: int,
                                        caplog: pytest.LogCaptureFixture) -> None:
    assert wait_until(lambda: end.rejected == before + sent), (end.rejected, before, sent)
    warnings = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]  # rate-limited
    assert end.failure is None


def test_the_leader_survives_a_rogue_peer_sending_junk(caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(free_port())
    with connected(2, config) as (leader, [follower]), caplog.at_level(logging.WARNING, logger="bytesched"):
        inbox = Inbox()
        follower.subscribe_order(inbox.on_keys)
        context = zmq.Context()
        rogue = context.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(f"tcp://127.0.0.1:{config.channel_port}")
        sent = [0]

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(messages)
        def send_junk(parts: list[bytes]) -> None:
            rogue.send_multipart(parts)
            sent[0] += 1

        try:
            send_junk()
            check_junk_rejected_and_logged_once(leader, sent[0], 0, caplog)
            keys = order_keys(1000, seed=5)
            leader.publish_order(keys)  # the job goes on, untouched
            assert wait_until(lambda: len(inbox.keys) == len(keys)) and inbox.keys == keys
            assert leader.followers == [1]
        finally:
            rogue.close()
            context.term()


def test_a_follower_survives_a_rogue_leader_sending_junk(caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(free_port())
    context = zmq.Context()
    rogue = context.socket(zmq.ROUTER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.bind(f"tcp://127.0.0.1:{config.channel_port}")
    follower = ChannelFollower(config, 1, 2)
    inbox = Inbox()
    follower.subscribe_order(inbox.on_keys)
    follower.subscribe("params", inbox.on("params"))
    try:
        with caplog.at_level(logging.WARNING, logger="bytesched"):
            route, hello = rogue.recv_multipart()
            assert CODEC.open(hello) == (MessageType.HELLO, 0, (1).to_bytes(4, "little") + (2).to_bytes(4, "little"))
            sent = [0]

            @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
            @given(messages)
            def send_junk(parts: list[bytes]) -> None:
                rogue.send_multipart([route, *parts])
                sent[0] += 1

            send_junk()
            check_junk_rejected_and_logged_once(follower, sent[0], 0, caplog)
        assert inbox.log == []  # nothing got through to a subscriber
        # Not confused either: a genuine welcome and order (sequence 0, 1) are taken as usual.
        rogue.send_multipart([route, CODEC.seal(MessageType.WELCOME, 0, (2).to_bytes(4, "little"))])
        rogue.send_multipart([route, CODEC.seal(MessageType.ORDER, 1, encode_order([("w", 3, 4)])[0])])
        follower.wait_for_leader(timeout=5)
        assert wait_until(lambda: inbox.keys == [("w", 3, 4)])
    finally:
        follower.close(timeout=0)
        rogue.close()
        context.term()


# ---------------------------------------------------------------------------------------------
# Liveness and closing.


def test_a_silent_leader_is_reported_through_the_hook_not_a_hang() -> None:
    """A leader that welcomed this rank and then went quiet (hung): the follower's on_failure
    fires after the timeout, and later calls raise the same error."""
    config = make_config(free_port(), timeout=1.0)
    context = zmq.Context()
    hung = context.socket(zmq.ROUTER)
    hung.setsockopt(zmq.LINGER, 0)
    hung.bind(f"tcp://127.0.0.1:{config.channel_port}")
    failures: list[ChannelError] = []
    follower = ChannelFollower(config, 1, 2, on_failure=failures.append)
    try:
        route, _hello = hung.recv_multipart()
        hung.send_multipart([route, CODEC.seal(MessageType.WELCOME, 0, (2).to_bytes(4, "little"))])
        follower.wait_for_leader()
        t0 = time.monotonic()
        assert wait_until(lambda: failures, 5)
        assert 0.9 < time.monotonic() - t0 < 3.5
        assert "rank 0 has sent nothing to rank 1" in str(failures[0])
        with pytest.raises(ChannelError, match="rank 0 has sent nothing"):
            follower.report("checksum", {})
    finally:
        follower.close()
        hung.close()
        context.term()


def test_an_aborted_follower_fails_the_leader_and_close_never_hangs() -> None:
    config = make_config(free_port(), timeout=1.0)
    failures: list[ChannelError] = []
    with connected(3, config, on_leader_failure=failures.append) as (leader, followers):
        followers[1].close(timeout=0)  # vanishes without a goodbye
        assert wait_until(lambda: failures, 5)
        assert "rank 2" in str(failures[0])
        with pytest.raises(ChannelError, match="rank 2"):
            leader.publish_order([("w", 0, 0)])
        t0 = time.monotonic()
        leader.close(timeout=1.0)
        followers[0].close(timeout=1.0)
        assert time.monotonic() - t0 < 3


def test_closing_says_goodbye_and_never_hangs(caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(free_port(), timeout=5.0)
    with connected(2, config) as (leader, [follower]):
        inbox = Inbox()
        follower.subscribe_order(inbox.on_keys)
        keys = order_keys(5000)
        leader.publish_order(keys)
        t0 = time.monotonic()
        leader.close()  # BYE is answered once everything before it arrived
        assert time.monotonic() - t0 < 1.0
        assert inbox.keys == keys
        with pytest.raises(ChannelError, match="rank 0 closed the channel"):
            follower.report("checksum", {})
    lonely = ChannelFollower(make_config(free_port()), 1, 2)  # its leader never comes
    t0 = time.monotonic()
    lonely.close()
    lonely.close()
    assert time.monotonic() - t0 < 1.5

    with caplog.at_level(logging.WARNING, logger="bytesched"):
        with connected(2, make_config(free_port())) as (leader, [follower]):  # closed from its own callback
            closed = threading.Event()
            follower.subscribe("stop", lambda body: (follower.close(), closed.set()))
            leader.broadcast("stop", {})
            assert closed.wait(5)
            with pytest.raises(ChannelError, match="rank 1's channel .* was closed"):
                follower.report("checksum", {})
    assert "goodbye" not in caplog.text  # both sides took their leave properly


# ---------------------------------------------------------------------------------------------
# Real separate processes.

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module", autouse=True)
def resource_tracker() -> Iterator[None]:
    """Run multiprocessing's resource tracker for this module's tests only.

    Spawning a process starts the tracker on first use, and it would live as long as pytest: the
    first multi-process test would count it as a process it left behind, and every later test of
    the session would find a stray child of pytest (the Ctrl-C test in test_reliability_faults.py
    once did). So it starts before the first test here and stops after the last one (closing its
    pipe ends it; ``_stop`` is the only way the standard library offers, and it waits for it).
    """
    multiprocessing.resource_tracker.ensure_running()
    yield
    multiprocessing.resource_tracker._resource_tracker._stop()


@contextlib.contextmanager
def processes(*targets: tuple[Callable[..., None], tuple]) -> Iterator[list[Any]]:
    """Start each ``(function, args)`` in a spawned process with a result pipe; kill leftovers."""
    procs, pipes = [], []
    try:
        for fn, args in targets:
            here, there = SPAWN.Pipe(duplex=False)
            proc = SPAWN.Process(target=fn, args=(*args, there), daemon=True)
            proc.start()
            there.close()
            procs.append(proc)
            pipes.append(here)
        yield [(proc, pipe) for proc, pipe in zip(procs, pipes)]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in pipes:
            pipe.close()


def receive(pipe: Any, timeout: float = 60.0) -> Any:
    assert pipe.poll(timeout), "the process sent no result in time"
    result = pipe.recv()
    if isinstance(result, BaseException):
        raise result
    return result


def follower_digest(config: Config, rank: int, world_size: int, count: int, result: Any) -> None:
    """Child: receive ``count`` order keys and send back their number and digest."""
    try:
        follower = open_channel(config, rank, world_size)
        inbox = Inbox()
        follower.subscribe_order(inbox.on_keys)
        wait_until(lambda: len(inbox.keys) >= count, 60)
        result.send((len(inbox.keys), hashlib.sha256(repr(inbox.keys).encode()).hexdigest()))
        follower.close()
    except BaseException as exc:
        result.send(exc)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_order_stream_across_processes() -> None:
    config = make_config(free_port(), timeout=30.0)
    keys = order_keys(100_000, seed=9)
    with processes(*[(follower_digest, (config, r, 3, len(keys))) for r in (1, 2)]) as children:
        leader = open_channel(config, 0, 3)
        try:
            for batch in batches(keys):
                leader.publish_order(batch)
            expected = (len(keys), hashlib.sha256(repr(keys).encode()).hexdigest())
            assert [receive(pipe) for _, pipe in children] == [expected, expected]
        finally:
            leader.close()


def leader_then_hang(config: Config, result: Any) -> None:
    """Child: lead a 2-rank channel, report that the follower joined, then wait to be stopped."""
    try:
        leader = open_channel(config, 0, 2)
        result.send("joined")
        time.sleep(120)
        leader.close()
    except BaseException as exc:
        result.send(exc)


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_a_stopped_leader_process_is_reported_to_the_follower() -> None:
    config = make_config(free_port(), timeout=1.5)
    with processes((leader_then_hang, (config,))) as [(proc, pipe)]:
        failures: list[ChannelError] = []
        follower = ChannelFollower(config, 1, 2, on_failure=failures.append)
        try:
            follower.wait_for_leader(timeout=30)  # a spawned process takes a while to start
            assert receive(pipe) == "joined"
            os.kill(proc.pid, signal.SIGSTOP)  # hung: its connection stays open, it just says nothing
            assert wait_until(lambda: failures, 6), "the follower did not notice its leader stopped"
            assert "rank 0 has sent nothing to rank 1" in str(failures[0])
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            follower.close()


# -- the integration: a follower's Core starts sub-tasks exactly in rank 0's order -------------

SIZES = [1200, 4000, 300, 2600, 1000, 3900, 800, 2000]  # bytes per tensor; priority = index


class RecordingTask(BufferTask):
    """Records each start; a backend finishes it 1-3 ms later on a timer thread."""

    def __init__(self, name: str, priority: int, nbytes: int, starts: list[Key], done: threading.Semaphore) -> None:
        super().__init__(name, priority, nbytes)
        self.starts = starts
        self.done = done

    def start(self, sub: SubTask) -> None:
        self.starts.append(sub.key)
        threading.Timer(0.001 * (1 + sub.index % 3), self.notify_finish, args=(sub,)).start()

    def on_finish(self) -> None:
        self.done.release()


def run_rank(config: Config, rank: int, iterations: int, result: Any) -> None:
    """Child: one rank's Core (rank0 order mode) running ``iterations`` backward passes whose
    tensors become ready in a rank-specific order; sends back (start order, readiness order)."""
    try:
        channel = open_channel(config, rank, 2)
        core = Core(config, rank=rank, order="rank0", channel=channel).start()
        starts: list[Key] = []
        readiness: list[Key] = []
        done = threading.Semaphore(0)
        rng = random.Random(rank)
        for _ in range(iterations):
            tasks = [RecordingTask(f"layer{i}", i, n, starts, done) for i, n in enumerate(SIZES)]
            for task in tasks:
                core.enqueue(task)
            ready_order = list(reversed(tasks)) if rank == 0 else rng.sample(tasks, len(tasks))
            time.sleep(0.05)  # all enqueued (instance numbers assigned) before readiness is read
            for task in ready_order:
                readiness += [s.key for s in task.subtasks]
                task.notify_ready()
                time.sleep(0.002 * rng.random())
            for _ in tasks:
                if not done.acquire(timeout=30):
                    raise TimeoutError(f"rank {rank}: a task did not finish; Core failure {core.failure!r}")
        core.shutdown(timeout=10)
        channel.close()
        result.send((starts, readiness))
    except BaseException as exc:
        result.send(exc)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_follower_core_starts_subtasks_exactly_in_the_leaders_order() -> None:
    config = make_config(free_port(), timeout=30.0,
                         params=SchedulingParams(partition_bytes=1000, credit_bytes=2500), order="rank0")
    with processes((run_rank, (config, 0, 5)), (run_rank, (config, 1, 5))) as [(_, leader), (_, follower)]:
        leader_starts, leader_ready = receive(leader)
        follower_starts, follower_ready = receive(follower)
    subtasks_per_iteration = sum(-(-n // 1000) for n in SIZES)  # ceil: partitions of at most 1000 B
    assert len(leader_starts) == 5 * subtasks_per_iteration
    assert follower_starts == leader_starts
    assert sorted(follower_ready) == sorted(leader_starts)
    assert follower_ready != leader_starts  # left alone, the follower would have started another order
    assert leader_starts != leader_ready  # rank 0 reordered by priority under the credit window
