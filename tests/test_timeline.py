"""BYTESCHED_TIMELINE: a Chrome trace with each sub-task's queued and in-flight spans, per rank."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import pytest

from bytesched.core import Config, ConfigError, Core, SchedulingParams, SubTask
from bytesched.core.timeline import (LOOP_TRACKS, FLUSH_EVERY, ChromeTimeline, open_timeline,
                                     timeline_path)

from coretools import BufferTask


def finish_later(sub: SubTask) -> None:
    """A backend: the communication completes a millisecond or two later, on another thread."""
    threading.Timer(0.001 + 0.001 * (sub.index % 2), sub.task.notify_finish, args=(sub,)).start()


class DoneTask(BufferTask):
    """Counts finished tasks, so a test can wait for all of them."""

    def __init__(self, *args: object, done: threading.Semaphore, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.done = done

    def on_finish(self) -> None:
        super().on_finish()
        self.done.release()


def finish_now(sub: SubTask) -> None:
    sub.task.notify_finish(sub)


def run_iterations(core: Core, sizes: list[int], iterations: int,
                   backend: Callable[[SubTask], None] = finish_later) -> list[DoneTask]:
    """Enqueue one task per size per iteration (last layer first, like backward), wait for all."""
    done = threading.Semaphore(0)
    tasks = []
    for _ in range(iterations):
        step = [DoneTask(f"layer{i}", i, n, on_start=backend, done=done) for i, n in enumerate(sizes)]
        for task in reversed(step):
            core.enqueue(task, ready=True)
        for _ in step:
            assert done.acquire(timeout=10), "a task did not finish"
        tasks += step
    return tasks


def spans_by_track(events: list[dict]) -> tuple[dict[int, str], dict[int, list[dict]]]:
    """Track names (tid -> thread_name) and the spans of each track in file order."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            spans[e["tid"]].append(e)
    return names, spans


def test_a_core_run_writes_queued_and_in_flight_spans_for_every_subtask(tmp_path: Path) -> None:
    config = Config(params=SchedulingParams(partition_bytes=1000, credit_bytes=2000),
                    timeline=str(tmp_path / "tl.json"))
    timeline = open_timeline(config, rank=0, world_size=1)
    assert timeline is not None and timeline.path == tmp_path / "tl.json"
    core = Core(config, timeline=timeline).start()
    wall_offset_us = (time.time() - time.monotonic()) * 1e6
    tasks = run_iterations(core, [2500, 1000, 3000, 400], iterations=2)
    core.shutdown(timeout=10)

    events = json.loads((tmp_path / "tl.json").read_text())  # complete, valid JSON after shutdown
    assert {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}} in events
    names, spans = spans_by_track(events)
    tid_of = {name: tid for tid, name in names.items()}
    subs = [sub for task in tasks for sub in task.started]
    assert len(subs) == 2 * (3 + 1 + 3 + 1)
    assert sum(len(s) for s in spans.values()) == 2 * len(subs)
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    for sub in subs:
        tid = tid_of[f"{sub.task.name} [{sub.index}]"]  # one track per partition of each tensor
        assert sort_index[tid] == sub.task.priority
        mine = [s for s in spans[tid] if s["args"]["instance"] == sub.task.instance]
        assert [s["name"] for s in mine] == ["queued", "in flight"]
        queued, flight = mine
        assert queued["args"] == {"tensor": sub.task.name, "instance": sub.task.instance,
                                  "partition": sub.index, "bytes": sub.nbytes}
        assert queued["ts"] == pytest.approx(sub.t_ready * 1e6 + wall_offset_us, abs=5e3)
        assert queued["ts"] + queued["dur"] == pytest.approx(flight["ts"], abs=1.0)
        assert queued["dur"] == pytest.approx((sub.t_start - sub.t_ready) * 1e6, abs=1.0)
        assert flight["dur"] == pytest.approx((sub.t_finish - sub.t_start) * 1e6, abs=1.0)
        assert flight["dur"] > 500  # the backend took about a millisecond
    for tid, track in spans.items():  # in time order, never overlapping, on every track
        for before, after in zip(track, track[1:]):
            assert after["ts"] >= before["ts"] + before["dur"] - 1.0, (names[tid], before, after)


def test_overlapping_instances_of_one_partition_get_their_own_lane(tmp_path: Path) -> None:
    timeline = ChromeTimeline(tmp_path / "tl.json", rank=3)
    task0, task1 = BufferTask("w", 0, 8), BufferTask("w", 0, 8)
    task1.instance = 1
    [early], [late] = SubTask.of(task0, [(None, 8)]), SubTask.of(task1, [(None, 8)])
    task0.t_ready, early.t_start, early.t_finish = 1.0, 2.0, 9.0
    task1.t_ready, late.t_start, late.t_finish = 3.0, 4.0, 5.0  # inside the other's span
    timeline.record(late)  # the Core records in finish order
    timeline.record(early)
    timeline.close()
    events = json.loads((tmp_path / "tl.json").read_text())
    names, spans = spans_by_track(events)
    assert sorted(names.values()) == ["w [0]", "w [0] (2)"]  # no training-loop track unless used
    assert all(e["pid"] == 3 for e in events)
    for track in spans.values():
        assert len(track) == 2 and track[0]["ts"] + track[0]["dur"] == pytest.approx(track[1]["ts"])


def test_each_rank_writes_its_own_file_when_several_run() -> None:
    assert timeline_path("tl.json", 0, 1) == Path("tl.json")
    assert timeline_path("tl.json", 0, 2) == Path("tl.0.json")
    assert timeline_path("out/tl.json", 1, 2) == Path("out/tl.1.json")
    assert timeline_path("out/run.trace.json", 3, 4) == Path("out/run.trace.3.json")
    assert timeline_path("trace", 1, 2) == Path("trace.1")
    assert open_timeline(Config(), rank=0, world_size=2) is None


def test_a_timeline_that_cannot_be_opened_fails_at_init_naming_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "no-such-dir" / "tl.json"
    with pytest.raises(ConfigError, match="BYTESCHED_TIMELINE") as error:
        open_timeline(Config(timeline=str(path)), rank=1, world_size=2)
    assert "tl.1.json" in str(error.value) and "rank 1" in str(error.value)


def test_events_are_streamed_in_chunks_and_a_full_disk_stops_only_the_timeline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tl.json"
    config = Config(params=SchedulingParams(partition_bytes=1000), timeline=str(path))
    core = Core(config, timeline=open_timeline(config, rank=0, world_size=1)).start()
    run_iterations(core, [1000] * FLUSH_EVERY, iterations=1, backend=finish_now)  # 2 spans per sub-task
    assert path.stat().st_size > 100 * FLUSH_EVERY  # written while running, not held until the end
    core.shutdown(timeout=10)
    assert len(json.loads(path.read_text())) > 2 * FLUSH_EVERY

    full = Config(params=SchedulingParams(partition_bytes=1000), timeline="/dev/full")  # ENOSPC on write
    core = Core(full, timeline=open_timeline(full, rank=0, world_size=1)).start()
    with caplog.at_level(logging.ERROR, logger="bytesched"):
        tasks = run_iterations(core, [1000] * FLUSH_EVERY, iterations=1, backend=finish_now)
        core.shutdown(timeout=10)
    assert core.failure is None and all(t.finished_callbacks == 1 for t in tasks)
    assert "timeline /dev/full: write failed" in caplog.text


def test_training_loop_spans_get_their_own_tracks_above_the_partitions_from_any_thread(tmp_path: Path) -> None:
    config = Config(timeline=str(tmp_path / "tl.json"))
    timeline = open_timeline(config, rank=1, world_size=2)
    assert timeline is not None
    offset_us = (time.time() - time.monotonic()) * 1e6
    threads = [threading.Thread(target=lambda i=i: [timeline.span(name, 10.0 + i, 10.5 + i, step=i, tensor=None)
                                                    for name in ("step", "forward", "backward")])
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    timeline.span("forward wait", 20.0, 20.25, step=3, tensor='fc "1".weight')
    with pytest.raises(ValueError, match="timeline span 'optimizer'"):
        timeline.span("optimizer", 1.0, 2.0, step=0)
    timeline.close()
    timeline.span("step", 30.0, 31.0, step=9)  # after close: ignored, not an error

    events = json.loads((tmp_path / "tl.1.json").read_text())
    names, spans = spans_by_track(events)
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"}
    assert sorted(names.values()) == sorted(LOOP_TRACKS)
    assert [sort_index[tid] for tid in sorted(names, key=lambda t: sort_index[t])] == [-4, -3, -2, -1]
    assert [names[tid] for tid in sorted(names, key=lambda t: sort_index[t])] == list(LOOP_TRACKS)
    for tid, track in spans.items():
        assert {e["name"] for e in track} == {names[tid]} and all(e["pid"] == 1 for e in track)
    wait = spans[next(t for t, n in names.items() if n == "forward wait")]
    assert len(wait) == 1 and wait[0]["args"] == {"step": 3, "tensor": 'fc "1".weight'}
    assert wait[0]["ts"] == pytest.approx(20.0 * 1e6 + offset_us, abs=5e3) and wait[0]["dur"] == pytest.approx(2.5e5)
    steps = spans[next(t for t, n in names.items() if n == "step")]
    assert sorted(e["args"]["step"] for e in steps) == list(range(8))
