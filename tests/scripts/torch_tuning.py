"""Run on 2 ranks under ``horovodrun --gloo`` (``--backend horovod``) or ``torchrun``
(``--backend dist``): ScheduledOptimizer with tuning switched on by ``BYTESCHED_TUNING*``.

The trial knobs (max trials, steps per trial, warm-up) come from the environment that
tests/test_torch_tuning.py sets; each case sets the switch itself (``--cases``, in order):

- ``tune``: crossing the barrier, ``BYTESCHED_TUNING=1``, log ``<log-dir>/tune.csv``;
- ``late``: barrier mode, and rank 0's switch of trial 1 leaves ``--delay-s`` late (the test
  harness ``FaultyBroadcasts`` of tuning_ranks.py wraps rank 0's real channel: this delay exists
  only in this script), so the follower must wait for it at the agreed step;
- ``slow``: a really slow rank 0: it sleeps ``--delay-s`` after backward of steps 2 and 3, around
  its decision (at the boundary of step 3) of the switch of step 6; the follower is held by the
  all-reduces, not by the switch, so it never waits for it;
- ``load``: ``BYTESCHED_TUNING_LOAD=<log-dir>/tune.csv`` alone (a previous job's log, read by a
  new optimizer, Core and channel);
- ``lost``: rank 0 never sends trial 1's switch; the follower must fail with TuningProtocolError
  within ``BYTESCHED_CHANNEL_TIMEOUT_S`` (8 s here). The job then exits 1 (the follower leaves at
  once, as a crashed rank would, and the launcher stops rank 0), so this case comes last.

``tune``, ``late``, ``slow`` and ``load`` train the same model on the same data as the unscheduled
baseline (plain hvd.DistributedOptimizer, or a hand-written all-reduce) and must end with the same
bits: two-rank sums are exact, so how gradients were partitioned cannot change them. Each prints
``CASE`` lines (torch_harness.Reporter) and one ``TUNED {json}`` line: the switches this rank's
session returned (step, partition, credit, batching threshold), ``tuned_params``, and its longest wait in on_step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import bytesched.plugins.torch.optimizer as optimizer_module
from bytesched.core import from_env
from bytesched.tuning import TuningProtocolError, make_session
from torch_harness import OPTIMIZERS, Reporter, new_model, snapshot, train
from torch_suites import DEFAULT, DistributedFlavor, Flavor, HorovodFlavor, run_baseline
from tuning_ranks import FaultyBroadcasts

STEPS = 17
"""Two trials of 6 steps (at steps 0 and 6), the kept sizes from step 12, confirmed at step 15."""
LOST_TIMEOUT_S = 8.0


class Recorder:
    """Replaces the plugin's ``make_session``: records what this rank's session returns and how
    long each call took, and on rank 0 wraps the channel in FaultyBroadcasts when asked."""

    def __init__(self) -> None:
        self.faults: dict[str, Any] = {}
        self.applied: list[list[int]] = []
        self.longest_wait = 0.0

    def reset(self, faults: dict[str, Any] | None = None) -> None:
        self.faults = dict(faults or {})
        self.applied = []
        self.longest_wait = 0.0

    def make_session(self, config: Any, *, channel: Any, rank: int, **options: Any) -> Any:
        if rank == 0 and self.faults:
            channel = FaultyBroadcasts(channel, **self.faults)
        session = make_session(config, channel=channel, rank=rank, **options)
        if session is None:
            return None
        on_step = session.on_step

        def recorded(step: int, samples: float = 1.0, now: float | None = None) -> Any:
            began = time.monotonic()
            try:
                params = on_step(step, samples, now)
            finally:  # a failed wait counts too
                self.longest_wait = max(self.longest_wait, time.monotonic() - began)
            if params is not None:
                self.applied.append([step, int(params.partition_bytes), int(params.credit_bytes),
                                     int(params.batch_bytes)])
            return params

        session.on_step = recorded  # type: ignore[method-assign]
        return session


RECORDER = Recorder()
optimizer_module.make_session = RECORDER.make_session  # type: ignore[assignment]


def set_tuning_env(log_dir: Path, case: str) -> None:
    """This case's switch: tuning on (with a log; ``lost``: with a short channel timeout instead),
    or loading ``tune.csv``."""
    for name in ("BYTESCHED_TUNING", "BYTESCHED_TUNING_LOG", "BYTESCHED_TUNING_LOAD"):
        os.environ.pop(name, None)
    if case == "load":
        os.environ["BYTESCHED_TUNING_LOAD"] = str(log_dir / "tune.csv")
    elif case == "lost":
        os.environ["BYTESCHED_TUNING"] = "1"
        os.environ["BYTESCHED_CHANNEL_TIMEOUT_S"] = str(LOST_TIMEOUT_S)
    else:
        os.environ["BYTESCHED_TUNING"] = "1"
        os.environ["BYTESCHED_TUNING_LOG"] = str(log_dir / f"{case}.csv")


def tuned_run(flavor: Flavor, report: Reporter, case: str, expected: list[torch.Tensor], cross_barrier: bool,
              faults: dict[str, Any] | None = None, between: Callable[[nn.Module, Any], None] | None = None,
              batch_bytes: int = 0) -> None:
    """Train with tuning, opening with batching under ``batch_bytes`` (0: off); the same bits as
    ``expected``, tuning finished; print TUNED."""
    RECORDER.reset(faults)
    model = new_model("wide")
    optimizer = flavor.scheduled(model, OPTIMIZERS["sgd"](model.parameters()),
                                 dataclasses.replace(DEFAULT, batch_bytes=batch_bytes), "bytescheduler", cross_barrier)
    train(model, optimizer, "wide", flavor.rank, steps=STEPS, between=between)
    optimizer.synchronize()
    got = snapshot(model)
    tuned = optimizer.tuned_params
    optimizer.close()
    report.same(f"{case}/same_as_unscheduled", expected, got)
    report.result(f"{case}/finished", tuned is not None, f"tuned_params={tuned}")
    print("TUNED " + json.dumps({"case": case, "rank": flavor.rank, "applied": RECORDER.applied,
                                 "tuned": None if tuned is None else [tuned.partition_bytes, tuned.credit_bytes,
                                                                      tuned.batch_bytes],
                                 "longest_wait_s": round(RECORDER.longest_wait, 3)}), flush=True)


def slow_rank0(rank: int, seconds: float) -> Callable[[nn.Module, Any], None]:
    """Called between backward and step(): rank 0 sleeps ``seconds`` in steps 2 and 3."""
    steps = iter(range(STEPS))

    def between(model: nn.Module, optimizer: Any) -> None:
        if next(steps) in (2, 3) and rank == 0:
            time.sleep(seconds)

    return between


def lost(flavor: Flavor, report: Reporter) -> None:
    """Rank 0 never sends trial 1's switch: the follower fails clearly; the job exits 1."""
    RECORDER.reset({"drop_trial": 1})
    model = new_model("wide")
    optimizer = flavor.scheduled(model, OPTIMIZERS["sgd"](model.parameters()), DEFAULT, "bytescheduler", True)
    try:
        train(model, optimizer, "wide", flavor.rank, steps=STEPS)
    except TuningProtocolError as error:
        timeout = from_env().channel_timeout_s
        bounded = timeout - 0.5 <= RECORDER.longest_wait <= timeout + 2.0
        report.result("lost/follower_fails_clearly",
                      flavor.rank != 0 and bounded and "did not arrive within" in str(error),
                      f"waited={RECORDER.longest_wait:.1f}s (timeout {timeout:g}s) applied={RECORDER.applied} "
                      f"error={str(error)!r}")
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # a rank that failed leaves; the launcher stops the others
    report.result("lost/follower_fails_clearly", False,
                  f"rank {flavor.rank} trained {STEPS} steps although trial 1's switch was never sent")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("horovod", "dist"), required=True)
    parser.add_argument("--cases", required=True, help="comma-separated: tune, late, slow, load, lost")
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--delay-s", type=float, default=4.0)
    parser.add_argument("--opening-batch", type=int, default=0,
                        help="the configured batching threshold in bytes, trial 0's (0: off)")
    args = parser.parse_args()
    flavor: Flavor = HorovodFlavor() if args.backend == "horovod" else DistributedFlavor()
    torch.set_num_threads(1)
    report = Reporter(flavor.rank)
    cases = args.cases.split(",")
    expected = run_baseline(flavor, "wide", "sgd", steps=STEPS) if set(cases) - {"lost"} else []
    for case in cases:
        set_tuning_env(args.log_dir, case)
        if case in ("tune", "load"):
            report.run(case, lambda: tuned_run(flavor, report, case, expected, cross_barrier=True,
                                               batch_bytes=args.opening_batch))
        elif case == "late":
            report.run(case, lambda: tuned_run(flavor, report, case, expected, cross_barrier=False,
                                               faults={"delay_trial": 1, "delay_s": args.delay_s}))
        elif case == "slow":
            report.run(case, lambda: tuned_run(flavor, report, case, expected, cross_barrier=True,
                                               between=slow_rank0(flavor.rank, args.delay_s)))
        elif case == "lost":
            report.run(case, lambda: lost(flavor, report))
        else:
            parser.error(f"unknown case {case!r}")
    report.finish()


if __name__ == "__main__":
    main()
