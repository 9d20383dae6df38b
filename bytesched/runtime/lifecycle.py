"""This process's Core, its timeline (``BYTESCHED_TIMELINE``) and, in multi-rank jobs, its
rank-0 channel, for any plugin: the plugin hands over its :class:`Ranks`, nothing else.

One Core serves every scheduled optimizer of the process (a GAN's two optimizers share it). The
Core's order mode is what the backend needs (``immediate`` for Horovod, ``rank0`` for
torch.distributed) unless ``BYTESCHED_ORDER`` says otherwise
(:func:`~bytesched.core.policies.order_mode`), and the rank-0 channel is opened (see
:func:`needs_channel`): the ``rank0`` mode needs it for the start order, tuning for each trial's
sizes (:mod:`bytesched.tuning.session`), and fault detection for its heartbeats
(``BYTESCHED_FAULT_TIMEOUT_S``, on by default). Unless ``BYTESCHED_CHANNEL_PORT`` is set, rank 0
listens on a free port and announces it through the backend (:meth:`Backend.broadcast_int`). The
channel belongs to the Core it was opened for: when a later optimizer needs a Core with another
configuration (after :func:`bytesched.core.shutdown`), the old channel is closed and, after a
barrier so that no rank connects to the old one, a new one is opened.
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
import weakref
from typing import Callable, Protocol

from bytesched.core import Config, Core, get_core, init
from bytesched.core import shutdown as shutdown_core
from bytesched.core.channel import ChannelError, ChannelFollower, ChannelLeader, PeerLost, open_channel
from bytesched.core.core import EXIT_GRACE_S, exit_later
from bytesched.core.policies import make_policy, order_mode
from bytesched.core.timeline import open_timeline

log = logging.getLogger("bytesched")

_channel: ChannelLeader | ChannelFollower | None = None
_channel_core: "weakref.ref[Core] | None" = None
_generation = 0  # bumped when a channel is opened or closed; failures of older ones are moot
_failure_listeners: list[Callable[[BaseException], None]] = []
_atexit_registered = False


class Ranks(Protocol):
    """What the runtime needs from a plugin's communication library.

    Attributes:
        rank, size: this process's rank and the number of ranks.
        order: what the library needs of the order of collectives (``rank0``: every rank must
            issue them in one order; ``immediate``: the library orders them itself).
    """

    rank: int
    size: int
    order: str

    def barrier(self) -> None:
        """Block until every rank got here."""

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (a collective every rank calls)."""


def start_core(config: Config, backend: Ranks) -> Core:
    """The running Core if it fits ``config`` and the order mode, else a new one."""
    order = order_mode(make_policy(config.policy, config.params), need=backend.order, setting=config.order,
                       world_size=backend.size)
    try:
        running: Core | None = get_core()
    except RuntimeError:
        running = None
    if running is not None and running.running:
        if running.config != config or running.order != order:
            raise RuntimeError(f"a bytesched Core is already running with another configuration or order "
                               f"mode ({running.order}); call bytesched.core.shutdown() first")
        if running.start_order == "sequence":
            raise RuntimeError("the running bytesched Core starts its tasks in a sequence agreed for the "
                               "ScheduledOptimizer that is training (the start-up plan stays out of the way): "
                               "create every ScheduledOptimizer before the first step, close that one first, "
                               "or set BYTESCHED_PLAN=0")
        return running
    channel = None
    if needs_channel(config, order, backend.size):
        if _close_channel():
            backend.barrier()  # every rank closed its old channel before rank 0 listens again
        channel = _open(config, backend)
    core = init(config, rank=backend.rank, order=order, channel=channel,
                timeline=open_timeline(config, rank=backend.rank, world_size=backend.size))
    if channel is not None:
        global _channel_core
        _channel_core = weakref.ref(core)
    return core


def needs_channel(config: Config, order: str, world_size: int) -> bool:
    """Followers obey rank 0's order, rank 0 broadcasts tuning switches, or the ranks watch each
    other's heartbeats (``BYTESCHED_FAULT_TIMEOUT_S`` > 0, the default: docs/reliability.md)."""
    return world_size > 1 and (order == "rank0" or config.tuning or bool(config.tuning_load)
                               or config.fault_timeout_s > 0)


def channel_of(core: Core) -> ChannelLeader | ChannelFollower | None:
    """The rank-0 channel opened for ``core``, or None if it runs without one."""
    owner = _channel_core() if _channel_core is not None else None
    return _channel if owner is core else None


def on_channel_failure(listener: Callable[[BaseException], None]) -> Callable[[], None]:
    """Call ``listener(error)`` if the rank-0 channel loses a peer; returns the way to stop."""
    _failure_listeners.append(listener)
    return lambda: _failure_listeners.remove(listener) if listener in _failure_listeners else None


def _open(config: Config, backend: Ranks) -> ChannelLeader | ChannelFollower:
    global _channel, _atexit_registered, _generation
    _generation += 1
    generation = _generation
    _channel = open_channel(config, backend.rank, backend.size, share_port=backend.broadcast_int,
                            on_failure=lambda error: _channel_failed(error, generation))
    if not _atexit_registered:
        # Registered after hvd.init() / init_process_group() and before the optimizers' own
        # close-at-exit, so at exit: optimizers flush, then the Core stops, then the channel.
        atexit.register(_shutdown)
        _atexit_registered = True
    return _channel


def _channel_failed(error: ChannelError, generation: int) -> None:
    core = _channel_core() if _channel_core is not None else None
    if generation != _generation or core is None:
        return  # the channel of a Core that was shut down (peers leave at their own pace)
    lost = f"rank {error.lost_rank} was lost" if isinstance(error, PeerLost) else "the rank-0 channel failed"
    waiting = core.describe_waiting() if core.running else "nothing (its Core has stopped)"
    log.error("bytesched: %s; rank %d was waiting for %s. Stopping this rank: %s", lost, core.rank, waiting, error)
    for listener in list(_failure_listeners):
        listener(error)
    exit_later(f"{lost} (the training loop did not exit by itself)")


def _close_channel() -> bool:
    """Close the channel of a Core that is no longer running; True if there was one."""
    global _channel, _channel_core
    if _channel is None:
        return False
    core = _channel_core() if _channel_core is not None else None
    if core is not None and core.running:
        raise RuntimeError("the rank-0 channel still serves a running Core")
    global _generation
    _generation += 1
    _channel.close()
    _channel = _channel_core = None
    return True


def _shutdown() -> None:
    core = _channel_core() if _channel_core is not None else None
    failure = core.failure if core is not None and core.failure is not None else getattr(_channel, "failure", None)
    shutdown_core(5.0)
    _close_channel()
    if failure is not None:
        # Next in line is the backend's own exit handler, which would wait for the lost or stuck
        # peer; and once the interpreter finalizes, exit_later's thread can no longer run. So a
        # failed rank ends here, while Python still runs (docs/reliability.md, "exit").
        sys.stdout.flush()
        sys.stderr.flush()
        exit_later(f"of an earlier failure ({failure}); skipping the backend's exit handler", grace_s=0.0)
        time.sleep(EXIT_GRACE_S)  # exit_later's thread ends the process meanwhile
