"""``BYTESCHED_TIMELINE``: a Chrome-trace JSON of every sub-task's wait and communication.

Open the file in https://ui.perfetto.dev or chrome://tracing. Each rank is a process (``pid`` =
rank, named "rank r"); each partition of each tensor is a track (a "thread" named
``tensor [index]``, sorted by the tensor's priority, so the most urgent layers come first). Every
finished sub-task draws two spans on its track: ``queued`` from ready to start (time spent waiting
for its priority turn or for credit) and ``in flight`` from start to finish (its communication).

A track per partition rather than per tensor because a tensor's partitions are all ready at the
same moment, so their spans overlap, and overlapping spans on one track are drawn wrongly (the
format wants them nested). Should two instances of one partition overlap (the next iteration's
gradient ready before the previous one's finished), the later one gets an extra track
``tensor [index] (2)``, so every track holds disjoint spans, in time order in the file.

A plugin also records, once, the order it ranks the parameters in (:meth:`ChromeTimeline.order`:
an instant event listing them, from the first forward pass or as the caller gave them) and, under
``tictac``, TicTac's order of the tasks.

A framework plugin adds what the training loop does (:meth:`ChromeTimeline.span`): each step's
marker, forward and backward compute, and each wait of the forward pass on a parameter's update,
on their own tracks above the partitions (sort index below 0). Every such span carries its
``step`` in ``args``; a forward wait also its ``tensor``. These come from the framework's threads,
so the file is written under a lock (taken once per finished sub-task by the Core thread, which is
nothing next to the sub-task's communication).

Timestamps are microseconds of the wall clock (``time.time()``), so the files of several ranks
line up as well as their clocks do. The timeline has no thread of its own: events go
to the file in chunks of :data:`FLUSH_EVERY`, so memory stays bounded, and :meth:`close` (called
when the Core stops) writes the rest and the closing bracket. Chrome and Perfetto also read a file
cut short by a crash, which ends without that bracket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

from .config import Config, ConfigError
from .task import SubTask

log = logging.getLogger("bytesched")

FLUSH_EVERY = 1024
"""Events buffered before they are written to the file."""

LOOP_TRACKS = ("step", "forward", "backward", "forward wait")
"""The plugin's span names, one track each, drawn in this order above the partitions."""
ORDERS = ("priority order", "tictac order")
"""The orders a plugin records once (:meth:`ChromeTimeline.order`): the parameters (or keys) by
priority, from the first forward pass or as given, and TicTac's order of the tasks."""


def timeline_path(path: str, rank: int, world_size: int) -> Path:
    """Where ``rank`` writes: ``path`` itself for a single rank, else ``path`` with ``.rank``
    before the extension (``tl.json`` -> ``tl.0.json``, ``tl.1.json``; ``trace`` -> ``trace.1``)."""
    p = Path(path)
    if world_size <= 1:
        return p
    return p.with_name(f"{p.stem}.{rank}{p.suffix}") if p.suffix else p.with_name(f"{p.name}.{rank}")


@dataclass
class _Lane:
    """One track of a partition: its thread id and when its last span ends."""

    tid: int
    free_from: float


class ChromeTimeline:
    """Streams the spans of finished sub-tasks (the Core's TimelineSink) and of the training loop
    (:meth:`span`, from a plugin) to a Chrome-trace JSON file. Thread-safe."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.rank = rank
        try:
            self._file: TextIO | None = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"BYTESCHED_TIMELINE: cannot write the timeline of rank {rank} to {str(path)!r}: "
                              f"{exc.strerror}") from None
        # Monotonic seconds (the Core's clock) -> wall-clock microseconds.
        self._offset_us = (time.time() - time.monotonic()) * 1e6
        self._pending: list[str] = ["[\n"]
        self._first = True
        self._lanes: dict[tuple[str, int], list[_Lane]] = {}  # by (tensor name, partition index)
        self._json_names: dict[str, str] = {}
        self._next_tid = 1
        self._lock = threading.Lock()
        self._emit(_meta("process_name", rank, 0, name=f"rank {rank}"))
        self._emit(_meta("process_sort_index", rank, 0, sort_index=rank))
        self._compute_tids: dict[str, int] = {}  # made on first use: a Core-only run has none

    def span(self, name: str, begin: float, end: float, step: int, tensor: str | None = None) -> None:
        """A span of the training loop on the track ``name`` (one of :data:`LOOP_TRACKS`),
        from ``begin`` to ``end`` in seconds of ``time.monotonic()``; ``tensor`` names what a
        forward wait waited for."""
        if name not in LOOP_TRACKS:
            raise ValueError(f"timeline span {name!r}: expected one of {', '.join(LOOP_TRACKS)}")
        ts = begin * 1e6 + self._offset_us
        extra = "" if tensor is None else f',"tensor":{json.dumps(tensor)}'
        with self._lock:
            if self._file is None:  # closed, or abandoned after a failed write
                return
            tid = self._compute_tids.get(name)
            if tid is None:
                tid = self._compute_tids[name] = self._new_tid()
                self._emit(_meta("thread_name", self.rank, tid, name=name))
                self._emit(_meta("thread_sort_index", self.rank, tid,
                                 sort_index=LOOP_TRACKS.index(name) - len(LOOP_TRACKS)))
            self._emit(f'{{"name":"{name}","ph":"X","pid":{self.rank},"tid":{tid},"ts":{ts:.3f},'
                       f'"dur":{(end - begin) * 1e6:.3f},"args":{{"step":{step}{extra}}}}}')

    def order(self, name: str, names: Sequence[str], source: str) -> None:
        """An instant event ``name`` (one of :data:`ORDERS`) now, whose ``args`` list ``names``
        most urgent first and say where the order came from (``source``)."""
        if name not in ORDERS:
            raise ValueError(f"timeline order {name!r}: expected one of {', '.join(ORDERS)}")
        ts = time.time() * 1e6
        with self._lock:
            if self._file is None:
                return
            self._emit(json.dumps({"name": name, "ph": "i", "s": "p", "pid": self.rank, "tid": 0, "ts": round(ts, 3),
                                   "args": {"source": source, "order": list(names)}}, separators=(",", ":")))

    def record(self, sub: SubTask) -> None:
        """``sub`` finished: write its queued and in-flight spans on its track."""
        with self._lock:
            self._record(sub)

    def _record(self, sub: SubTask) -> None:
        if self._file is None:
            return
        task = sub.task
        tid, name = self._track(sub)
        ready = sub.t_ready * 1e6 + self._offset_us
        start = sub.t_start * 1e6 + self._offset_us
        finish = sub.t_finish * 1e6 + self._offset_us
        args = f'"args":{{"tensor":{name},"instance":{task.instance},"partition":{sub.index},"bytes":{sub.nbytes}}}}}'
        where = f'"pid":{self.rank},"tid":{tid}'
        self._emit(f'{{"name":"queued","ph":"X",{where},"ts":{ready:.3f},"dur":{start - ready:.3f},{args}')
        self._emit(f'{{"name":"in flight","ph":"X",{where},"ts":{start:.3f},"dur":{finish - start:.3f},{args}')

    def _track(self, sub: SubTask) -> tuple[int, str]:
        """The track of ``sub`` (its partition's first lane free since it became ready) and the
        tensor's name as JSON."""
        task = sub.task
        name = self._json_names.get(task.name)
        if name is None:
            name = self._json_names[task.name] = json.dumps(task.name)
        lanes = self._lanes.setdefault((task.name, sub.index), [])
        for lane in lanes:
            if lane.free_from <= sub.t_ready:
                lane.free_from = sub.t_finish
                return lane.tid, name
        tid = self._new_tid()
        lanes.append(_Lane(tid, sub.t_finish))
        label = f"{task.name} [{sub.index}]" + (f" ({len(lanes)})" if len(lanes) > 1 else "")
        self._emit(_meta("thread_name", self.rank, tid, name=label))
        self._emit(_meta("thread_sort_index", self.rank, tid, sort_index=task.priority))
        return tid, name

    def _new_tid(self) -> int:
        tid = self._next_tid
        self._next_tid += 1
        return tid

    def _emit(self, event: str) -> None:
        self._pending.append(event if self._first else ",\n" + event)
        self._first = False
        if len(self._pending) >= FLUSH_EVERY:
            self._write()

    def _write(self) -> None:
        if self._file is None:
            return
        try:
            self._file.write("".join(self._pending))
        except OSError as exc:  # a full disk must not stop the Core: stop the timeline instead
            log.error("timeline %s: write failed (%s); no more events are recorded", self.path, exc.strerror)
            self._abandon()
        self._pending.clear()

    def _abandon(self) -> None:
        file, self._file = self._file, None
        with contextlib.suppress(OSError):  # flushing what is left fails the same way
            file.close()  # type: ignore[union-attr]  # called while the file is open

    def close(self) -> None:
        """Write what is buffered and the closing bracket; idempotent."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file is None:
            return
        self._pending.append("\n]\n")
        self._write()
        if self._file is None:
            return
        try:
            self._file.close()
        except OSError as exc:
            log.error("timeline %s: closing failed (%s); the file may be incomplete", self.path, exc.strerror)
        self._file = None


def _meta(kind: str, pid: int, tid: int, **args: object) -> str:
    return json.dumps({"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}, separators=(",", ":"))


def open_timeline(config: Config, *, rank: int, world_size: int) -> ChromeTimeline | None:
    """The timeline of ``rank`` if ``BYTESCHED_TIMELINE`` is set (None otherwise), opened now so
    that a bad path fails at start-up with a :class:`ConfigError` naming the variable."""
    if config.timeline is None:
        return None
    return ChromeTimeline(timeline_path(config.timeline, rank, world_size), rank)


__all__ = ["LOOP_TRACKS", "ORDERS", "ChromeTimeline", "FLUSH_EVERY", "open_timeline", "timeline_path"]
