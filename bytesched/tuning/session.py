"""One rank's side of tuning, over the rank-0 channel: what a plugin calls once per step.

Every rank calls :meth:`TuningSession.on_step` at each step boundary, with the same step
numbers, and applies what it returns (``core.set_params(params)``, or the MXNet plugin's
re-partitioning for a parameter server)::

    session = make_session(config, rank=rank, world_size=size, channel=channel, arch="allreduce")
    ...
    params = session.on_step(step, samples=batch_size, now=time.monotonic())  # before step `step`
    if params is not None:
        core.set_params(params)  # before any CommTask of step `step` is enqueued

At its first step every rank applies the opening sizes (trial 0: the configured sizes on the
lattice) by itself. Rank 0 runs the :class:`~bytesched.tuning.tuner.Tuner` and broadcasts every
later trial's switch; a follower waits, at each step where a switch was agreed, until that switch
has arrived, then applies it and confirms (see :mod:`bytesched.tuning.protocol` for why this
never depends on timing). Rank 0 checks the confirmations, trial 0's included, ``lead`` steps
after each switch. A step boundary without a due switch costs a comparison.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Protocol, Sequence

from ..core.config import Config, SchedulingParams, format_size
from ..core.policies import partition_size
from .protocol import APPLIED, SWITCH, Applied, Switch, TuningProtocolError
from .space import Point, SearchSpace, space_for
from .tuner import ANNOUNCE_LEAD, Decider, FixedChoice, TrialPlan, Tuner

log = logging.getLogger("bytesched")


class LeaderChannel(Protocol):
    """What rank 0 needs from :class:`bytesched.core.channel.ChannelLeader`."""

    def broadcast(self, kind: str, body: dict[str, Any]) -> None: ...

    def gather(self, kind: str, timeout: float | None = None) -> dict[int, dict[str, Any]]: ...


class FollowerChannel(Protocol):
    """What a follower needs from :class:`bytesched.core.channel.ChannelFollower`."""

    def subscribe(self, kind: str, callback: Callable[[dict[str, Any]], None]) -> None: ...

    def report(self, kind: str, body: dict[str, Any]) -> None: ...


class WarmStart(Protocol):
    """Where the search's first points come from: predictions for ``space``, polled as the
    tuner's ``predictions`` are (None until ready; then the points, best first)."""

    def predictions(self, space: SearchSpace, policy: str) -> Callable[[], Sequence[Point] | None]: ...


class TuningSession:
    """Call :meth:`on_step` at every step boundary on every rank; apply what it returns.

    Build it with :func:`make_session`. ``decider`` is rank 0's (a :class:`Tuner`, or a
    :class:`FixedChoice` for a loaded configuration); followers have none and obey rank 0.
    ``opening`` is what every rank uses from its first step (None: nothing changes then), and
    ``first_wait`` how many steps later rank 0's first switch is due. ``timeout`` bounds every
    wait (for a switch, for confirmations).
    """

    def __init__(self, rank: int, world_size: int, *, channel: LeaderChannel | FollowerChannel | None,
                 decider: Decider | None, timeout: float, opening: SchedulingParams | None, first_wait: int,
                 lead: int = ANNOUNCE_LEAD) -> None:
        if (rank == 0) != (decider is not None):
            raise ValueError("rank 0, and only rank 0, decides (give it a Tuner or FixedChoice)")
        if world_size > 1 and channel is None:
            raise ValueError(f"tuning with {world_size} ranks needs the rank-0 channel")
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.opening = opening
        self.first_wait = first_wait
        self.lead = lead
        self.final: SchedulingParams | None = None
        """The sizes kept once tuning is over (the same on every rank)."""
        self.current: Switch | None = None
        self._channel = channel
        self._decider = decider
        # rank 0: announced but not yet applied, then applied but not yet confirmed
        self._announced: deque[Switch] = deque()
        self._unconfirmed: deque[Switch] = deque()
        # followers: switches received from rank 0 (or the error that a bad one raised)
        self._inbox: deque[Switch | TuningProtocolError] = deque()
        self._arrived = threading.Condition()
        self._due: int | None = None  # None until the first step; then (followers) when a switch is due
        if rank != 0 and channel is not None:
            channel.subscribe(SWITCH, self._receive)  # type: ignore[union-attr]  # a follower's

    @property
    def done(self) -> bool:
        """Tuning is over on this rank: the final sizes apply and on_step does nothing."""
        return self.final is not None and not self._unconfirmed

    def on_step(self, step: int, samples: float = 1.0, now: float | None = None) -> SchedulingParams | None:
        """Step ``step`` is about to begin; ``samples`` were processed by step ``step - 1``,
        which ended at ``now`` (``time.monotonic()`` by default). Returns the sizes to switch to
        before this step, or None. Raises TuningProtocolError if the ranks cannot agree."""
        if self.done:
            return None
        opening = self._open(step) if self._due is None else None
        if self.rank == 0:
            switched = self._lead(step, samples, time.monotonic() if now is None else now)
        else:
            switched = self._follow(step)
        return switched or opening

    def _open(self, step: int) -> SchedulingParams | None:
        """The first step: apply the opening sizes, which every rank computed alike, and confirm."""
        self._due = step + self.first_wait
        if self.opening is None:
            return None
        switch = Switch.of(0, step, self.opening, self._due)
        self._apply(switch)
        if self.rank == 0 and self._channel is not None:
            self._unconfirmed.append(switch)
        elif self.rank != 0:
            self._confirm(switch, step)
        return switch.params

    # -- rank 0 -------------------------------------------------------------------------------
    def _lead(self, step: int, samples: float, now: float) -> SchedulingParams | None:
        switch = self._decider.on_step(step, samples, now)  # type: ignore[union-attr]  # rank 0 has one
        if switch is not None:
            if self._channel is not None:
                self._channel.broadcast(SWITCH, switch.to_body())  # type: ignore[union-attr]  # rank 0's: a leader
            self._announced.append(switch)
        applied = None
        while self._announced and self._announced[0].step <= step:
            applied = self._announced.popleft()
            self._apply(applied)
            if self._channel is not None:
                self._unconfirmed.append(applied)
        while self._unconfirmed and step >= self._unconfirmed[0].step + self.lead:
            self._check_confirmations(self._unconfirmed.popleft())
        return applied.params if applied is not None else None

    def _check_confirmations(self, switch: Switch) -> None:
        """Every follower applied ``switch`` at its step, with its sizes; else fail naming them."""
        try:
            reports = self._channel.gather(APPLIED, timeout=self.timeout)  # type: ignore[union-attr]  # rank 0's
        except Exception as exc:  # ChannelError: a follower is missing or the channel failed
            raise TuningProtocolError(f"rank 0 did not get every rank's confirmation of tuning trial "
                                      f"{switch.trial} (step {switch.step}): {exc}") from exc
        for rank, body in sorted(reports.items()):
            applied = Applied.from_body(body)
            if applied.rank != rank or not applied.agrees_with(switch):
                raise TuningProtocolError(
                    f"rank {rank} applied trial {applied.trial} at step {applied.step} with partition "
                    f"{applied.partition}, credit {applied.credit} and batching threshold {applied.batch}, but "
                    f"rank 0 switched to trial {switch.trial} at step {switch.step} with partition "
                    f"{switch.partition}, credit {switch.credit} and batching threshold {switch.batch}: "
                    f"the ranks diverged")

    # -- followers ----------------------------------------------------------------------------
    def _receive(self, body: dict[str, Any]) -> None:
        """On the channel's thread: queue a switch from rank 0 (or the reason it is invalid)."""
        try:
            item: Switch | TuningProtocolError = Switch.from_body(body)
        except TuningProtocolError as exc:
            item = exc
        with self._arrived:
            self._inbox.append(item)
            self._arrived.notify_all()

    def _follow(self, step: int) -> SchedulingParams | None:
        if self._due is None or step < self._due:
            return None
        switch = self._wait_for_switch(step)
        if switch.step != self._due:
            raise TuningProtocolError(
                f"rank 0 announced a tuning switch for step {switch.step}, but rank {self.rank} expected one "
                f"at step {self._due}: do all ranks create the tuning session at the same step, count "
                f"steps alike and have the same BYTESCHED_TUNING_* settings?")
        self._apply(switch)
        self._confirm(switch, step)
        self._due = switch.next_step
        return switch.params

    def _confirm(self, switch: Switch, step: int) -> None:
        self._channel.report(APPLIED, Applied.of(self.rank, switch, step).to_body())  # type: ignore[union-attr]  # a follower's

    def _wait_for_switch(self, step: int) -> Switch:
        with self._arrived:
            if not self._arrived.wait_for(lambda: bool(self._inbox), timeout=self.timeout):
                raise TuningProtocolError(
                    f"rank {self.rank} reached step {step}, where the ranks agreed to switch tuning "
                    f"parameters, but rank 0's switch for step {self._due} did not arrive within "
                    f"{self.timeout:g} s (BYTESCHED_CHANNEL_TIMEOUT_S): it was lost or rank 0 stopped. "
                    f"Failing instead of letting the ranks use different partitions")
            item = self._inbox.popleft()
        if isinstance(item, TuningProtocolError):
            raise TuningProtocolError(f"rank {self.rank} received an invalid tuning message from rank 0: {item}")
        return item

    # -- both ---------------------------------------------------------------------------------
    def _apply(self, switch: Switch) -> None:
        self.current = switch
        if switch.final:
            self.final = switch.params
            log.info("bytesched tuning: rank %d keeps partition %s, credit %s%s from step %d", self.rank,
                     format_size(switch.partition), format_size(switch.credit), _batching(switch.batch), switch.step)


def _batching(batch: int) -> str:
    """``, batching under 1MB`` for a log line (nothing when batching is off)."""
    return f", batching under {format_size(batch)}" if batch else ""


def make_session(config: Config, *, rank: int, world_size: int,
                 channel: LeaderChannel | FollowerChannel | None, arch: str,
                 model_bytes: int | None = None, warm_start: WarmStart | None = None,
                 batches: bool = False, fuses_submitted: bool = True) -> TuningSession | None:
    """The tuning session this rank's plugin drives, or None when neither ``BYTESCHED_TUNING``
    nor ``BYTESCHED_TUNING_LOAD`` is set (the fixed sizes of ``config.params`` then apply).

    ``arch`` (``allreduce`` or ``ps``) picks the search space, which a small model's gradient
    bytes ``model_bytes`` move down (:func:`~bytesched.tuning.space.space_for`; every rank
    passes the same); where the backend ``batches``, the batching threshold is searched too.
    ``fuses_submitted``: the all-reduce backend fuses what is submitted together (Horovod), as
    the warm start's simulated cluster then does. ``warm_start``: where the search's first points come from when
    ``BYTESCHED_TUNING_PROFILE`` is not set (the job's own observed step,
    :class:`~bytesched.runtime.tuning_warm_start.TuningWarmStart`). Bad settings raise ConfigError
    here, on every rank.
    """
    if not (config.tuning or config.tuning_load):
        return None
    plan = TrialPlan(config.tuning_steps_per_trial, config.tuning_warmup_steps)
    space = space_for(arch, config.tuning_floor, model_bytes, batches)
    # Trial 0: the configured sizes on the lattice, which every rank computes alike from its own
    # settings (rank 0 checks that through the confirmations). Loading only: rank 0's message.
    default_partition = partition_size(config.policy, config.params)
    opening = space.nearest(config.params, default_partition) if config.tuning else None
    decider: Decider | None = None
    if rank == 0:
        decider = _leader_decider(config, plan, space, opening, world_size, warm_start, fuses_submitted)
    return TuningSession(rank, world_size, channel=channel, decider=decider, timeout=config.channel_timeout_s,
                         opening=None if opening is None else space.params(opening),
                         first_wait=plan.steps_per_trial if config.tuning else plan.lead, lead=plan.lead)


def _leader_decider(config: Config, plan: TrialPlan, space: SearchSpace, opening: Point | None,
                    world_size: int, warm_start: WarmStart | None, fuses_submitted: bool) -> Decider:
    from .log import TuningLog, load_best

    loaded = load_best(config.tuning_load) if config.tuning_load else None
    if opening is None:
        assert loaded is not None
        return FixedChoice(loaded, plan.lead)
    from .search import BayesianSearch  # scikit-learn is imported only when tuning is on

    search = BayesianSearch(space, seed=config.tuning_seed, xi=config.tuning_xi)
    if loaded is not None:
        search.suggest(space.nearest(loaded, loaded.partition_bytes), "loaded")  # type: ignore[arg-type]  # set
    predictions = None
    if config.tuning_profile or config.tuning_bandwidth:
        predictions = background_predictions(config, space, world_size, fuses_submitted)
    elif warm_start is not None:
        predictions = warm_start.predictions(space, config.policy)
    tuning_log = TuningLog(config.tuning_log) if config.tuning_log else None
    return Tuner(search, plan, opening=opening, max_trials=config.tuning_max_trials, tuning_log=tuning_log,
                 predictions=predictions)


def background_predictions(config: Config, space: SearchSpace, world_size: int, fuses_submitted: bool = True,
                           ) -> Callable[[], Sequence[Point] | None]:
    """The simulator's warm-start points, computed on a background thread (it takes seconds).

    The settings are validated now (ConfigError naming the variable). The returned function
    answers None until the points are ready, then the points (an empty list if the simulation
    failed, which is logged): the tuner polls it at each decision."""
    from .predicted_points import predict_points, warm_start_inputs

    profile, cluster = warm_start_inputs(config, space.arch, world_size, fuses_submitted)
    return predicted_in_background(lambda: predict_points(profile, cluster, space, policy=config.policy))


def predicted_in_background(predict: Callable[[], list[Point]]) -> Callable[[], Sequence[Point] | None]:
    """Run ``predict`` on a background thread; the returned function answers None until it is
    done, then its points (an empty list if it failed, which is logged)."""
    future: Future[list[Point]] = Future()

    def work() -> None:
        try:
            future.set_result(predict())
        except Exception as exc:  # a simulator failure costs the warm start, not the job
            future.set_exception(exc)

    threading.Thread(target=work, name="bytesched-tuning-warm-start", daemon=True).start()

    def poll() -> Sequence[Point] | None:
        if not future.done():
            return None
        if future.exception() is not None:
            log.warning("bytesched tuning: the simulator's warm start failed (%s); tuning without it",
                        future.exception())
            return ()
        return future.result()

    return poll


__all__ = ["TuningSession", "make_session", "TuningProtocolError"]
