"""This process's Core, its timeline (``BYTESCHED_TIMELINE``) and, in multi-rank jobs, its
rank-0 channel, for any plugin: the plugin hands over its :class:`Workers` (its :class:`Ranks`
where they share collectives), nothing else.

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

Stopping has one path, :func:`shutdown`: it runs at the end of a :func:`running` block, or at
interpreter exit, from the one exit hook the runtime registers when a plugin first starts a Core
(after the backend's own start-up, so that the hook runs before the backend's exit handler:
``atexit`` runs hooks in reverse). It stops in a fixed order, whatever the order in which things
were made: the plugins' objects finish their pending work (:data:`PLUGIN`), at exit the
framework's engine lets go of what bytesched holds in it (:data:`ENGINE`), the Core stops, the
channel closes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import time
import weakref
from typing import Callable, Iterator, Protocol, runtime_checkable

from bytesched.core import Config, Core, get_core, init
from bytesched.core import shutdown as shutdown_core
from bytesched.core.channel import ChannelError, ChannelFollower, ChannelLeader, PeerLost, open_channel
from bytesched.core.core import EXIT_GRACE_S, exit_later
from bytesched.core.policies import Policy, make_policy, order_mode
from bytesched.core.timeline import open_timeline

log = logging.getLogger("bytesched")

_channel: ChannelLeader | ChannelFollower | None = None
_channel_core: "weakref.ref[Core] | None" = None
_generation = 0  # bumped when a channel is opened or closed; failures of older ones are moot
_failure_listeners: list[Callable[[BaseException], None]] = []
_exit_hook_registered = False
CORE_STOP_S = 5.0
"""How long :func:`shutdown` lets the Core finish: by then every tracked object has waited for
its own communication, so what is still in flight is stuck."""

PLUGIN, ENGINE = 0, 1
"""When a tracked object closes: a plugin's optimizer or store (:data:`PLUGIN`) at every
:func:`shutdown`, where it waits for its pending communication; what a framework's engine holds
for bytesched for the life of the process (:data:`ENGINE`: the MXNet proxies, which once released
stay released) at interpreter exit only, after the plugins' objects and before the Core."""
_tracked: dict[int, "tuple[int, weakref.ref[Closeable]]"] = {}  # by id, in the order tracked
_failure: BaseException | None = None  # what stopped the Core or the channel, kept past shutdown()


class Closeable(Protocol):
    """What :func:`track` closes at shutdown."""

    def close(self, timeout: float) -> None:
        """Finish or give up pending work within ``timeout`` seconds, then let go of resources."""


class Workers(Protocol):
    """What the runtime needs from a plugin's communication library to start the Core.

    Attributes:
        rank, size: this process's rank and the number of ranks.
        order: what the library needs of the order of collectives (``rank0``: every rank must
            issue them in one order; ``immediate``: the library orders them itself; ``ps``: a
            synchronous parameter server's, :func:`~bytesched.core.policies.ps_order`).
    """

    rank: int
    size: int
    order: str

    def barrier(self) -> None:
        """Block until every rank got here."""


@runtime_checkable
class MakesCore(Protocol):
    """Workers whose backend makes the Core itself (the PyTorch plugin's torch.distributed backend
    makes a native one where it can)."""

    def make_core(self, config: Config, **kwargs: object) -> Core:
        """A Core for ``config``, made as :class:`Core` is (``kwargs``: rank, order, channel, ...)."""


@runtime_checkable
class Ranks(Workers, Protocol):
    """Workers with collectives among them (Horovod, torch.distributed): rank 0's channel listens
    on a free port and tells the others through :meth:`broadcast_int`. Without them (a parameter
    server's workers talk to servers only) it listens on ``BYTESCHED_CHANNEL_PORT`` or the default
    port."""

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (a collective every rank calls)."""


def start_core(config: Config, backend: Workers, *, policy: Policy | None = None, resized: bool = False) -> Core:
    """The running Core if it fits ``config`` and the order mode, else a new one.

    ``policy`` replaces the one ``config`` names (a store without a network releases on
    readiness); ``resized``: a start-up plan or tuning may set a credit later, which a parameter
    server's order mode must allow for (:func:`~bytesched.core.policies.ps_order`).
    """
    order = order_mode(make_policy(config.policy, config.params), need=backend.order, setting=config.order,
                       world_size=backend.size, tuning=resized)
    _register_exit_hook()
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
    core = init(config, make=backend.make_core if isinstance(backend, MakesCore) else None, rank=backend.rank,
                order=order, channel=channel, policy=policy,
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


def track(part: Closeable, stage: int = PLUGIN) -> None:
    """Close ``part`` in :func:`shutdown`'s ``stage`` unless it was closed (and :func:`untrack`ed)
    before; held weakly, so tracking keeps nothing alive."""
    _tracked[id(part)] = (stage, weakref.ref(part))
    _register_exit_hook()


def untrack(part: Closeable) -> None:
    """``part`` was closed: :func:`shutdown` leaves it alone."""
    _tracked.pop(id(part), None)


def shutdown(timeout: float = 30.0) -> None:
    """Stop bytesched in this process: every tracked plugin object closes (newest first, each
    within ``timeout`` seconds), then the Core stops and the channel closes.

    Idempotent; a plugin object made afterwards starts a new Core. Runs at interpreter exit for
    whatever is still open, where the engine's part (:data:`ENGINE`) is released too.
    """
    _stop(timeout, (PLUGIN,))


@contextlib.contextmanager
def running(timeout: float = 30.0) -> Iterator[None]:
    """``with bytesched.runtime.running(): train()`` ends with :func:`shutdown`, also when the
    block raises: pending communication lands, the Core stops and the channel closes there,
    rather than at interpreter exit."""
    try:
        yield
    finally:
        shutdown(timeout)


def _stop(timeout: float, stages: tuple[int, ...]) -> None:
    global _failure
    core = _channel_core() if _channel_core is not None else None
    for stage in stages:
        for key, (stage_of, ref) in reversed(list(_tracked.items())):
            if stage_of != stage:
                continue
            del _tracked[key]
            part = ref()
            if part is not None:
                try:
                    part.close(timeout)
                except Exception:  # one part that fails to close must not keep the others open
                    log.exception("bytesched: closing %r at shutdown failed", part)
    failure = core.failure if core is not None else None
    if failure is None:
        failure = getattr(_channel, "failure", None)
    if failure is not None:
        _failure = failure
    shutdown_core(min(timeout, CORE_STOP_S))
    # A rank that failed leaves without a goodbye: its peers then find it lost (heartbeats), as
    # they must, since the job cannot go on; a goodbye would read as a rank that finished.
    _close_channel(goodbye=failure is None)


def _register_exit_hook() -> None:
    # Registered when a plugin first starts a Core or tracks an object, which is after hvd.init()
    # / init_process_group() / the KVStore's creation, so the hook runs before their exit handlers.
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_at_exit)
        _exit_hook_registered = True


def _open(config: Config, backend: Workers) -> ChannelLeader | ChannelFollower:
    global _channel, _generation
    _generation += 1
    generation = _generation
    share_port = backend.broadcast_int if isinstance(backend, Ranks) else None
    _channel = open_channel(config, backend.rank, backend.size, share_port=share_port,
                            on_failure=lambda error: _channel_failed(error, generation))
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


def _close_channel(goodbye: bool = True) -> bool:
    """Close the channel of a Core that is no longer running (``goodbye``: saying it to the peers
    first); True if there was one."""
    global _channel, _channel_core
    if _channel is None:
        return False
    core = _channel_core() if _channel_core is not None else None
    if core is not None and core.running:
        raise RuntimeError("the rank-0 channel still serves a running Core")
    global _generation
    _generation += 1
    if goodbye:
        _channel.close()
    else:
        _channel.close(timeout=0)  # 0: no goodbye
    _channel = _channel_core = None
    return True


def _at_exit() -> None:
    _stop(30.0, (PLUGIN, ENGINE))
    failure = _failure
    if failure is not None:
        # Next in line is the backend's own exit handler, which would wait for the lost or stuck
        # peer; and once the interpreter finalizes, exit_later's thread can no longer run. So a
        # failed rank ends here, while Python still runs (docs/reliability.md, "exit").
        sys.stdout.flush()
        sys.stderr.flush()
        exit_later(f"of an earlier failure ({failure}); skipping the backend's exit handler", grace_s=0.0)
        time.sleep(EXIT_GRACE_S)  # exit_later's thread ends the process meanwhile
