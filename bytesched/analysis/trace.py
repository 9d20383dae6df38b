"""Reading ``BYTESCHED_TIMELINE`` files back into sub-task records.

The writer (:mod:`bytesched.core.timeline`) draws each finished sub-task as two spans on its
track, ``queued`` (ready to start) and ``in flight`` (start to finish), with the sub-task's key in
``args``. This module pairs them again into one :class:`SubTaskRecord` per sub-task and rank,
and reads the training loop's spans a plugin added (step markers, forward and backward compute,
forward waits) into :class:`LoopSpan` records; traces of older versions have none. A
file cut short by a crash has no closing bracket and may end inside an event; it is read line by
line (the writer puts one event per line) and the broken last line is dropped with a note, so the
tool still explains the run that crashed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bytesched.core.timeline import LOOP_TRACKS


class TraceError(ValueError):
    """A timeline file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class SubTaskRecord:
    """One sub-task as one rank saw it; times in seconds of the wall clock."""

    rank: int
    tensor: str
    step: int  # the task's instance: the n-th time this tensor's gradient was communicated
    partition: int
    nbytes: int
    priority: int  # the track's sort index: 0 is needed first by the next forward pass
    ready: float
    start: float
    finish: float

    @property
    def key(self) -> tuple[str, int, int]:
        """The same on every rank: (tensor, step, partition)."""
        return self.tensor, self.step, self.partition

    @property
    def queued(self) -> float:
        return self.start - self.ready

    @property
    def in_flight(self) -> float:
        return self.finish - self.start


@dataclass(frozen=True)
class LoopSpan:
    """A span of the training loop on one rank: ``kind`` is ``step``, ``forward``, ``backward``
    or ``forward wait`` (then ``tensor`` is what it waited for); times in seconds."""

    rank: int
    kind: str
    step: int
    begin: float
    end: float
    tensor: str | None = None

    @property
    def length(self) -> float:
        return self.end - self.begin


@dataclass
class Trace:
    """Every sub-task and training-loop span of the files read, and what was odd about them."""

    records: list[SubTaskRecord]
    notes: list[str]
    loop: list[LoopSpan] = field(default_factory=list)

    def kinds(self, rank: int) -> set[str]:
        """Which kinds of training-loop span ``rank`` recorded."""
        return {s.kind for s in self.loop if s.rank == rank}

    @property
    def ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})


def expand_paths(paths: list[str]) -> list[Path]:
    """The files to read. A path that does not exist but names what ``BYTESCHED_TIMELINE`` was set
    to stands for the per-rank files the writer made from it (``tl.json`` -> ``tl.0.json``, ...)."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.exists():
            files.append(path)
            continue
        pattern = f"{path.stem}.*{path.suffix}" if path.suffix else f"{path.name}.*"
        per_rank = sorted(p for p in path.parent.glob(pattern)
                          if p.name[len(path.stem) + 1:].split(".")[0].isdigit())
        if not per_rank:
            raise TraceError(f"{text}: no such file, and no per-rank files {path.parent / pattern}")
        files += per_rank
    return files


def _events(path: Path, notes: list[str]) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it: {exc.strerror}") from None
    try:
        data = json.loads(text)
        return data["traceEvents"] if isinstance(data, dict) else data
    except (json.JSONDecodeError, KeyError):
        pass
    # Not valid JSON as a whole: the job stopped before the closing bracket, perhaps mid-event.
    events = []
    lines = [line.strip().rstrip(",") for line in text.splitlines()]
    lines = [line for line in lines if line not in ("", "[", "]")]
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines):
                raise TraceError(f"{path}: event {number} is not JSON: {line[:80]!r}") from None
            notes.append(f"{path}: cut short mid-event (a crash?); the incomplete last event was dropped")
            return events
    notes.append(f"{path}: has no closing bracket (the job did not shut bytesched down cleanly)")
    return events


def read_trace(paths: list[str]) -> Trace:
    """Read every file (one per rank, or several ranks in one) into sub-task records."""
    notes: list[str] = []
    records: list[SubTaskRecord] = []
    loop: list[LoopSpan] = []
    for path in expand_paths(paths):
        events = _events(path, notes)
        priority = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in events
                    if e.get("ph") == "M" and e.get("name") == "thread_sort_index"}
        queued: dict[tuple[int, tuple[str, int, int]], dict] = {}
        for e in events:
            if e.get("ph") != "X":
                continue
            try:
                args = e["args"]
                if e["name"] in LOOP_TRACKS:
                    begin = e["ts"] / 1e6
                    loop.append(LoopSpan(e["pid"], e["name"], args["step"], begin, begin + e["dur"] / 1e6,
                                         args.get("tensor")))
                    continue
                if e["name"] not in ("queued", "in flight"):
                    continue
                rank, key = e["pid"], (args["tensor"], args["instance"], args["partition"])
                if e["name"] == "queued":
                    queued[rank, key] = e
                    continue
                wait = queued.pop((rank, key), None)
                if wait is None:
                    raise TraceError(f"{path}: the 'in flight' span of {key} on rank {rank} has no 'queued' span "
                                     "before it (not a BYTESCHED_TIMELINE file?)")
                records.append(SubTaskRecord(
                    rank=rank, tensor=key[0], step=key[1], partition=key[2], nbytes=args["bytes"],
                    priority=priority.get((rank, e["tid"]), 0), ready=wait["ts"] / 1e6,
                    start=e["ts"] / 1e6, finish=(e["ts"] + e["dur"]) / 1e6))
            except KeyError as missing:
                raise TraceError(f"{path}: a {e.get('name')!r} event lacks {missing} (not a BYTESCHED_TIMELINE "
                                 f"file?): {json.dumps(e)[:120]}") from None
    if not records:
        raise TraceError(f"{', '.join(paths)}: no sub-task spans (did the job run any step with "
                         "BYTESCHED_TIMELINE set?)")
    return Trace(records, notes, loop)


__all__ = ["LoopSpan", "SubTaskRecord", "Trace", "TraceError", "expand_paths", "read_trace"]
