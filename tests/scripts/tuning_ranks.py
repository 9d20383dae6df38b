"""One rank of a tuning job on the real rank-0 channel and the real Core, without a framework.

Each step enqueues the same few gradients (CommTasks over fixed buffers whose communication
finishes as soon as it starts), all ready at once, and waits until the Core has finished them;
before each step the tuning session is asked for new sizes, which go to ``core.set_params``.
Followers run the Core in ``rank0`` order, so a rank that partitioned a step differently from rank
0 would wait forever for sub-tasks it does not have: a finished run shows that every rank switched
at the same steps. The measured throughput is real (fewer, larger partitions cost the Core less).

    python tuning_ranks.py RANK WORLD_SIZE [--delay-trial T --delay-s S] [--drop-trial T]

Configuration comes from ``BYTESCHED_*`` (tuning knobs, channel port, job token). Prints one
line ``RESULT {json}`` (applied switches, final sizes) or ``ERROR {json}`` (the exception).
:class:`FaultyBroadcasts` is imported by the in-process tests too.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from typing import Any

from bytesched.core import CommTask, Config, Core, SubTask, from_env, split_elements
from bytesched.core.channel import open_channel
from bytesched.tuning import make_session
from bytesched.tuning.protocol import SWITCH

TENSOR_BYTES = (6_000_000, 3_000_000, 1_000_000, 400_000)
SAMPLES_PER_STEP = 32


class FaultyBroadcasts:
    """Rank 0's channel, except that the switch of trial ``delay_trial`` leaves ``delay_s`` late
    (from a timer thread) and the switch of trial ``drop_trial`` is never sent. Everything else
    (and gather) goes straight to the real channel."""

    def __init__(self, leader: Any, *, delay_trial: int | None = None, delay_s: float = 0.0,
                 drop_trial: int | None = None) -> None:
        self.leader = leader
        self.delay_trial = delay_trial
        self.delay_s = delay_s
        self.drop_trial = drop_trial
        self.timers: list[threading.Timer] = []

    def broadcast(self, kind: str, body: dict[str, Any]) -> None:
        trial = body.get("trial") if kind == SWITCH else None
        if trial is not None and trial == self.drop_trial:
            return
        if trial is not None and trial == self.delay_trial:
            timer = threading.Timer(self.delay_s, self.leader.broadcast, (kind, body))
            self.timers.append(timer)
            timer.start()
            return
        self.leader.broadcast(kind, body)

    def gather(self, kind: str, timeout: float | None = None) -> dict[int, dict[str, Any]]:
        return self.leader.gather(kind, timeout)


class GradientTask(CommTask):
    """A gradient over a fixed buffer; its communication completes the moment it starts."""

    def __init__(self, name: str, priority: int, buffer: bytearray, done: "StepDone") -> None:
        super().__init__(name, priority, len(buffer))
        self.buffer = buffer
        self.done = done

    def partition(self, size: float) -> list[tuple[memoryview, int]]:
        view = memoryview(self.buffer)
        return [(view[a * 4:b * 4], (b - a) * 4) for a, b in split_elements(len(self.buffer) // 4, 4, size)]

    def start(self, subtask: SubTask) -> None:
        self.notify_finish(subtask)

    def on_finish(self) -> None:
        self.done.one()

    def on_error(self, error: BaseException) -> None:
        self.done.fail(error)


class StepDone:
    """Counts a step's finished tasks; the training thread waits on it."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.error: BaseException | None = None
        self.event = threading.Event()

    def one(self) -> None:
        self.left -= 1  # only the Core thread calls this
        if self.left == 0:
            self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()


def run(rank: int, world_size: int, config: Config, steps: int, faults: dict[str, Any]) -> dict[str, Any]:
    channel = open_channel(config, rank, world_size)
    core = Core(config, rank=rank, order="rank0", channel=channel).start()
    session_channel = FaultyBroadcasts(channel, **faults) if rank == 0 and faults else channel
    session = make_session(config, rank=rank, world_size=world_size, channel=session_channel, arch="ps")
    assert session is not None, "BYTESCHED_TUNING or BYTESCHED_TUNING_LOAD must be set"
    buffers = [bytearray(n) for n in TENSOR_BYTES]
    applied = []
    try:
        for step in range(steps):
            params = session.on_step(step, SAMPLES_PER_STEP)
            if params is not None:
                core.set_params(params)
                applied.append([step, params.partition_bytes, params.credit_bytes])
            done = StepDone(len(buffers))
            for priority, buffer in enumerate(buffers):
                core.enqueue(GradientTask(f"grad{priority}", priority, buffer, done), ready=True)
            if not done.event.wait(30):
                raise RuntimeError(f"rank {rank}: step {step} did not finish in 30 s "
                                   f"({done.left} tensors left; did the ranks partition it differently?)")
            if done.error is not None:
                raise done.error
        final = session.final
        return {"rank": rank, "applied": applied, "done": session.done,
                "final": None if final is None else [final.partition_bytes, final.credit_bytes]}
    finally:
        core.shutdown(5)
        channel.close(timeout=2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world_size", type=int)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--delay-trial", type=int)
    parser.add_argument("--delay-s", type=float)
    parser.add_argument("--drop-trial", type=int)
    args = parser.parse_args()
    faults = {k: v for k, v in (("delay_trial", args.delay_trial), ("delay_s", args.delay_s),
                                ("drop_trial", args.drop_trial)) if v is not None}
    started = time.monotonic()
    try:
        result = run(args.rank, args.world_size, from_env(), args.steps, faults)
    except BaseException as exc:  # reported to the test, which decides whether it was expected
        print("ERROR " + json.dumps({"rank": args.rank, "type": type(exc).__name__, "message": str(exc),
                                     "traceback": traceback.format_exc()}), flush=True)
        return 1
    result["seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
