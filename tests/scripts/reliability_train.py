"""The soak's training job (:func:`benchmarks.soak.train`) with faults injected on request.

Used by tests/test_reliability_*.py: options make one rank die (SIGKILL), freeze (SIGSTOP) or
hang in the middle of a backward pass, or perturb one rank's weights (to check BYTESCHED_CHECK),
and can make the start-up plan pass through (``--pass-through``).
At the end each rank prints ``DONE rank=<r> digest=<sha256> ...``, its non-daemon threads, and
at the very end of interpreter exit ``EXITED rank=<r> at=<time>``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch  # before any horovod import (horovod.mxnet segfaults otherwise)

from benchmarks.soak import Hooks, train, worker_arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    worker_arguments(parser)
    parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself...")
    parser.add_argument("--stop-rank", type=int, default=-1, help="this rank SIGSTOPs itself (frozen)...")
    parser.add_argument("--hang-rank", type=int, default=-1, help="this rank's training loop sleeps...")
    parser.add_argument("--fault-step", type=int, default=5, help="...in the backward pass of this step")
    parser.add_argument("--perturb-rank", type=int, default=-1, help="add 1e-3 to a weight of this rank...")
    parser.add_argument("--perturb-step", type=int, default=5, help="...after this step")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--pass-through", action="store_true",
                        help="the start-up plan cannot time the all-reduce, so it stays out and passes through")
    return parser.parse_args(argv)


def plan_passing_through() -> None:
    """The start-up plan's measurement fails on every rank: it stays out of the way and passes the
    gradients through to the framework from step 2."""
    from bytesched.runtime import start_observer

    def no_measurement(*args: object) -> None:
        raise RuntimeError("not measured (--pass-through)")
    start_observer.measure_network = no_measurement  # type: ignore[assignment]


def rank() -> int:
    """This process's rank, from the launcher's environment (Horovod or torch.distributed)."""
    return int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "-1")))


def fault_hooks(args: argparse.Namespace) -> Hooks:
    def on_backward(step: int, layer: int) -> None:
        if step != args.fault_step or layer != 2:
            return
        me = rank()
        if me == args.kill_rank:
            print(f"FAULT rank={me} killing itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if me == args.stop_rank:
            print(f"FAULT rank={me} freezing (SIGSTOP) at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if me == args.hang_rank:
            print(f"FAULT rank={me} hanging at step {step}", flush=True)
            time.sleep(3600)

    def after_step(step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == args.perturb_step and rank() == args.perturb_rank:
            if not args.unscheduled:
                optimizer.synchronize()  # the pending update lands first, then the perturbation
            with torch.no_grad():
                model.layers[3].bias[7] += 1e-3
            print(f"FAULT rank={rank()} perturbed layers.3.bias after step {step}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    return Hooks(on_backward=on_backward, after_step=after_step)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.pass_through:
        plan_passing_through()
    sys.exit(train(arguments.backend, arguments.steps, unscheduled=arguments.unscheduled,
                   delay_ms=arguments.delay_ms, report_every=arguments.report_every, hooks=fault_hooks(arguments)))
