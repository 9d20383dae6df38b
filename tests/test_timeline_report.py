"""`bytesched timeline` on traces written by two real Cores with the real timeline writer.

Two Cores (ranks 0 and 1) run in this process over an all-reduce-like backend: a sub-task
finishes on both ranks only once both have started it. Rank 1 produces one gradient late in one
step, so rank 0's copy of it must be reported as stalled, waiting for rank 1.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from bytesched.analysis.stalls import find_stalls
from bytesched.analysis.steps import overlap, summarise_rank, union_length
from bytesched.analysis.timeline_command import analyse
from bytesched.analysis.trace import TraceError, read_trace
from bytesched.core import Config, Core, SchedulingParams, SubTask
from bytesched.cli import main
from bytesched.core.timeline import ChromeTimeline, open_timeline

from coretools import BufferTask

LAYERS = [("conv1", 4000), ("conv2", 8000), ("fc", 16000)]  # forward order = priority
STEPS = 4
LATE_STEP, LATE_S = 2, 0.5  # long enough to stand out even on a heavily loaded machine


class AllReduce:
    """Finishes a key on every rank once all ranks started it (after a short transfer)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.started: dict[tuple[str, int, int], list[SubTask]] = {}
        self.lock = threading.Lock()

    def start(self, sub: SubTask) -> None:
        with self.lock:
            peers = self.started.setdefault(sub.key, [])
            peers.append(sub)
            if len(peers) < self.ranks:
                return
        for peer in peers:
            threading.Timer(0.002, peer.task.notify_finish, args=(peer,)).start()


def train(rank: int, core: Core, backend: AllReduce, tasks: list[BufferTask], steps_done: threading.Barrier) -> None:
    """Backward produces the last layer's gradient first; rank 1 is late with conv2 in LATE_STEP."""
    for step in range(STEPS):
        step_tasks = []
        for priority, (name, nbytes) in reversed(list(enumerate(LAYERS))):
            time.sleep(0.003)  # backward compute of this layer
            if rank == 1 and step == LATE_STEP and name == "conv2":
                time.sleep(LATE_S)
            task = BufferTask(name, priority, nbytes, on_start=backend.start)
            core.enqueue(task, ready=True)
            step_tasks.append(task)
        deadline = time.monotonic() + 10
        while not all(t.finished_callbacks for t in step_tasks):  # barrier mode: wait for updates
            assert time.monotonic() < deadline, "a step did not finish"
            time.sleep(0.001)
        tasks += step_tasks
        steps_done.wait(timeout=10)
        time.sleep(0.005)  # forward compute


@pytest.fixture(scope="module")
def two_rank_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[BufferTask]]]:
    out = tmp_path_factory.mktemp("timeline")
    config = Config(params=SchedulingParams(partition_bytes=4000, credit_bytes=64000), timeline=str(out / "tl.json"))
    backend = AllReduce(2)
    cores = {r: Core(config, rank=r, order="immediate", timeline=open_timeline(config, rank=r, world_size=2)).start()
             for r in (0, 1)}
    tasks: dict[int, list[BufferTask]] = {0: [], 1: []}
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=train, args=(r, cores[r], backend, tasks[r], barrier)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for core in cores.values():
        core.shutdown(timeout=10)
    assert not any(t.is_alive() for t in threads)
    return out, tasks


def test_steps_periods_and_communication_come_from_the_recorded_subtasks(two_rank_trace) -> None:
    out, tasks = two_rank_trace
    trace = read_trace([str(out / "tl.json")])  # the BYTESCHED_TIMELINE value stands for both files
    assert trace.ranks == [0, 1] and trace.notes == []
    assert len(trace.records) == 2 * STEPS * (1 + 2 + 4)
    report = analyse(trace)
    for rank in (0, 1):
        steps = [s for s in report.steps if s.rank == rank]
        assert [s.step for s in steps] == list(range(STEPS))
        subs = [sub for task in tasks[rank] for sub in task.started]
        first_ready = [min(s.t_ready for s in subs if s.task.instance == n) for n in range(STEPS)]
        for n, summary in enumerate(steps[:-1]):
            assert summary.iteration_s == pytest.approx(first_ready[n + 1] - first_ready[n], abs=1e-4)
            flights = [s.t_finish - s.t_start for s in subs if s.task.instance == n]
            assert max(flights) - 1e-4 <= summary.comm_s <= sum(flights) + 1e-4
            assert 0 <= summary.comm_free_s <= summary.iteration_s
        assert steps[-1].iteration_s is None and steps[-1].comm_free_s is None
        assert all(s.alpha is None for s in steps)  # no computation time given
    late = [s for s in report.steps if s.step == LATE_STEP]
    assert all(s.iteration_s > LATE_S for s in late)
    # Rank 0 finished backward long before conv2 (and then conv1) came back: forward waited for them.
    rank0 = next(s for s in late if s.rank == 0)
    assert rank0.forward_waits[0].tensor in ("conv1", "conv2") and rank0.forward_waits[0].wait_s > LATE_S / 2
    assert not rank0.forward_waits[0].measured  # a Core-only trace has no forward events: a bound


def test_the_late_rank_is_named_for_the_stalled_tensor(two_rank_trace) -> None:
    out, _ = two_rank_trace
    trace = read_trace([str(out / "tl.0.json"), str(out / "tl.1.json")])
    threshold, stalls = find_stalls(trace.records)  # 5x the median in flight: load-dependent
    waited = {(s.tensor, s.step, s.rank, s.waited_for) for s in stalls if s.waited_for is not None}
    assert ("conv2", LATE_STEP, 0, 1) in waited, stalls
    conv2 = next(s for s in stalls if s.tensor == "conv2" and s.rank == 0 and s.step == LATE_STEP)
    assert conv2.lateness_s == pytest.approx(LATE_S, abs=LATE_S / 3) and conv2.in_flight_s >= conv2.lateness_s
    assert all(s.in_flight_s >= threshold for s in stalls)


def test_overlap_coefficient_and_utilisation_follow_tictac() -> None:
    assert overlap(1.0, 1.0, 1.0) == pytest.approx((1.0, 1.0, 1.0))  # full overlap
    assert overlap(1.0, 1.0, 2.0) == pytest.approx((0.0, 1.0, 0.5))  # none: T = N + C
    alpha, rho, util = overlap(0.5, 2.0, 2.25)  # half the communication hidden
    assert (alpha, rho) == pytest.approx((0.5, 0.25)) and util == pytest.approx(2.0 / 2.25)
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="C=0"):
        overlap(1.0, 0.0, 1.0)


def test_a_trace_cut_short_by_a_crash_is_still_read(two_rank_trace, tmp_path: Path) -> None:
    out, _ = two_rank_trace
    text = (out / "tl.1.json").read_text()
    cut = tmp_path / "crashed.json"
    cut.write_text(text[: len(text) // 2])
    trace = read_trace([str(cut)])
    assert 0 < len(trace.records) < STEPS * 7
    assert len(trace.notes) == 1 and "crashed.json" in trace.notes[0]
    with pytest.raises(TraceError, match="no-such.json: no such file"):
        read_trace([str(tmp_path / "no-such.json")])
    (tmp_path / "other.json").write_text('[{"name": "queued", "ph": "X", "pid": 0, "tid": 1, "ts": 1}]')
    with pytest.raises(TraceError, match="other.json: a 'queued' event lacks 'args'"):
        read_trace([str(tmp_path / "other.json")])
    lone = {"name": "in flight", "ph": "X", "pid": 0, "tid": 1, "ts": 1, "dur": 2,
            "args": {"tensor": "w", "instance": 0, "partition": 0, "bytes": 4}}
    (tmp_path / "lone.json").write_text(json.dumps([lone]))
    with pytest.raises(TraceError, match=r"lone.json: the 'in flight' span of \('w', 0, 0\) on rank 0 has no 'queued'"):
        read_trace([str(tmp_path / "lone.json")])


def test_the_command_prints_json_and_draws_a_gantt_chart_per_rank(two_rank_trace, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = two_rank_trace
    argv = ["timeline", str(out / "tl.json"), "--compute-ms", "20", "--plot", str(tmp_path / "gantt.png")]
    assert main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["steps"]) == 2 * STEPS and report["steps"][0]["alpha"] is not None
    assert any(s["waited_for"] == 1 and s["tensor"] == "conv2" for s in report["stalls"])
    for rank in (0, 1):
        assert (tmp_path / f"gantt.{rank}.png").read_bytes()[:4] == b"\x89PNG"
    assert main(argv[:2]) == 0
    text = capsys.readouterr().out
    assert "rank 1" in text and "waited for rank 1" in text and "not in the timeline: compute spans" in text
    assert main(argv[:2] + ["--compute-ms", "0"]) == 2
    assert "--compute-ms must be > 0" in capsys.readouterr().err


def test_alpha_and_forward_waits_come_from_the_recorded_loop_on_a_synthetic_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Written by the real writer, read back and analysed; every figure computed by hand (equal up
    to the file's resolution: wall-clock microseconds, about 1e-7 s as a double)."""
    timeline = ChromeTimeline(tmp_path / "tl.json", rank=0)
    for n, (begin, end) in enumerate([(1.000, 1.060), (1.100, 1.150), (1.180, 1.190)]):
        timeline.span("step", begin, end, n)
    timeline.span("forward", 1.000, 1.020, 0)
    timeline.span("backward", 1.025, 1.055, 0)
    timeline.span("forward", 1.100, 1.130, 1)
    timeline.span("forward wait", 1.105, 1.117, 1, tensor="w1")  # w2 of step 0 was still in flight
    timeline.span("backward", 1.135, 1.145, 1)
    timeline.span("forward", 1.180, 1.185, 2)
    for name, instance, flight in [("w1", 0, (1.030, 1.070)), ("w2", 0, (1.050, 1.117)), ("w1", 1, (1.140, 1.160)),
                                   ("w2", 1, (1.142, 1.150))]:
        task = BufferTask(name, int(name[1]), 8)
        task.instance = instance
        [sub] = SubTask.of(task, [(None, 8)])
        task.t_ready, (sub.t_start, sub.t_finish) = flight[0], flight
        timeline.record(sub)
    timeline.close()

    trace = read_trace([str(tmp_path / "tl.json")])
    step0, step1, step2 = summarise_rank(trace.records, trace.loop)
    # Step 0: T = 100 ms; in flight 1.030-1.100 (w2 runs on into step 1) = 70 ms; C = 20 + 30 ms.
    assert (step0.iteration_s, step0.comm_s, step0.compute_s) == pytest.approx((0.100, 0.070, 0.050), abs=1e-6)
    assert (step0.alpha, step0.rho, step0.utilisation) == pytest.approx((20 / 50, 70 / 50, 50 / 100), abs=1e-4)
    assert step0.forward_waits == [] and step0.forward_wait_s == 0
    # Step 1: T = 80 ms; in flight 1.100-1.117 and 1.140-1.160 = 37 ms; C = 30 - 12 + 10 = 28 ms.
    assert (step1.iteration_s, step1.comm_s, step1.compute_s) == pytest.approx((0.080, 0.037, 0.028), abs=1e-6)
    assert (step1.alpha, step1.utilisation) == pytest.approx(((37 + 28 - 80) / 28, 28 / 80), abs=1e-4)
    assert [(w.tensor, w.measured) for w in step1.forward_waits] == [("w1", True)]
    assert step1.forward_waits[0].wait_s == pytest.approx(0.012, abs=1e-6)
    assert step1.comm_free_s == pytest.approx(0.080 - 0.037, abs=1e-6) and step1.subtasks == 2
    assert step2.iteration_s is None and step2.alpha is None and step2.subtasks == 0

    assert main(["timeline", str(tmp_path / "tl.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["not_recorded"] == [] and report["steps"][1]["forward_waits"] == [
        {"tensor": "w1", "wait_s": pytest.approx(0.012, abs=1e-6), "measured": True}]
    # --compute-ms overrides the measured C (for traces of older versions it is the only C).
    assert main(["timeline", str(tmp_path / "tl.json"), "--json", "--compute-ms", "40"]) == 0
    step0_override = json.loads(capsys.readouterr().out)["steps"][0]
    assert step0_override["alpha"] == pytest.approx((70 + 40 - 100) / 40, abs=1e-4)
