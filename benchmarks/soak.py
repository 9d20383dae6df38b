"""``python -m benchmarks soak``: a long 2-rank PyTorch run that must neither hang, grow, nor drift.

The soak: the same small model is trained twice under ``horovodrun`` with the same seeds
and data, once through ScheduledOptimizer (partitioned, credit-limited, with a random delay in
every layer's backward so that the ranks' gradients become ready in shifting orders) and once
with plain ``hvd.DistributedOptimizer``. It passes when

- both runs, launched side by side, finish within ``--timeout`` (no deadlock),
- every rank's resident memory, sampled every ``--report-every`` steps, stays within
  ``--rss-tolerance`` (5 %) of its first sample after warm-up (the first ``--warmup`` steps), and
- the final parameters of every rank of both runs are bit-identical (SHA-256 of their bytes). With
  two ranks each element of an all-reduced gradient is one addition of two numbers, which is the
  same whatever the partitioning, fusion or order, so nothing but exact equality is acceptable.

The worker half of this module (``python -m benchmarks.soak``, run by horovodrun) is also
the training loop of the reliability tests (``tests/scripts/reliability_train.py``), which add
faults through :class:`Hooks`.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .horovod_jobs import end_job, horovodrun_argv

PROGRESS = re.compile(r"PROGRESS rank=(\d+) step=(\d+) rss=(\d+)")
DONE = re.compile(r"DONE rank=(\d+) digest=(\w+) seconds=([\d.]+)")


# -- the worker (one rank) --------------------------------------------------------------------

@dataclass
class Hooks:
    """What a caller adds to the training loop: ``on_backward(step, layer)`` runs inside each
    layer's backward, ``after_step(step, model, optimizer)`` after each optimizer step (fault
    injection)."""

    on_backward: Callable[[int, int], None] = lambda step, layer: None
    after_step: Callable[[int, Any, Any], None] = lambda step, model, optimizer: None


def rss_bytes() -> int:
    """This process's resident set size now (Linux), not its peak."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parameter_digest(model: Any) -> str:
    """SHA-256 of every parameter's bytes, in order: equal digests mean bit-identical models."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train(backend: str, steps: int, *, unscheduled: bool = False, delay_ms: float = 0.0,
          report_every: int = 0, hooks: Hooks | None = None) -> int:
    """Train the soak model on this rank; print progress, the end-of-run facts, and at the very
    end of interpreter exit ``EXITED rank=<r> at=<time>``. Returns the exit code."""
    import torch  # before any horovod import (horovod.mxnet segfaults otherwise)
    import torch.nn.functional as F
    from torch import nn

    hooks = hooks or Hooks()
    who = {"rank": "?"}
    # Registered before the backend's own exit handler, so (last in, first out) it runs after it
    # and after bytesched's: how long the whole exit took after the last step.
    atexit.register(lambda: print(f"EXITED rank={who['rank']} at={time.time():.3f}", flush=True))
    if backend == "horovod":
        import horovod.torch as hvd
        hvd.init()
        rank = hvd.rank()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    who["rank"] = str(rank)
    from bytesched.plugins.torch import ScheduledOptimizer

    class LayeredNet(nn.Module):
        """Five dense layers; a backward hook per layer runs the delays and the caller's hook."""

        def __init__(self, width: int = 64, layers: int = 5) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for index, layer in enumerate(self.layers):
                x = torch.tanh(layer(x))
                x.register_hook(lambda grad, index=index: on_backward(index))
            return x

    rng = random.Random(rank)
    step = 0

    def on_backward(index: int) -> None:
        if delay_ms:
            time.sleep(rng.uniform(0.0, delay_ms / 1000))
        hooks.on_backward(step, index)

    model = LayeredNet()
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if backend == "horovod":
        inner = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    optimizer = inner if unscheduled else ScheduledOptimizer(model, inner)
    data = torch.Generator().manual_seed(rank)
    began = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad()
        x = torch.randn(32, 64, generator=data)
        F.mse_loss(model(x), torch.sin(x)).backward()
        optimizer.step()
        hooks.after_step(step, model, optimizer)
        if report_every and (step + 1) % report_every == 0:
            print(f"PROGRESS rank={rank} step={step + 1} rss={rss_bytes()}", flush=True)
    if not unscheduled:
        optimizer.synchronize()
    elapsed = time.perf_counter() - began
    print(f"DONE rank={rank} digest={parameter_digest(model)} seconds={elapsed:.3f} at={time.time():.3f}", flush=True)
    others = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
    print(f"THREADS rank={rank} non_daemon={','.join(others) or '-'}", flush=True)
    return 0


def worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's options (shared with tests/scripts/reliability_train.py)."""
    parser.add_argument("--backend", choices=("horovod", "dist"), default="horovod")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="random backward delay per layer, 0..this")
    parser.add_argument("--unscheduled", action="store_true", help="plain hvd.DistributedOptimizer")
    parser.add_argument("--report-every", type=int, default=0, help="print step and RSS every this many steps")


# -- the driver -------------------------------------------------------------------------------

@dataclass
class Run:
    """One horovodrun launch: per-rank RSS samples, final digests, and how it ended."""

    name: str
    rss: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # rank -> [(step, bytes)]
    digests: dict[int, str] = field(default_factory=dict)
    train_seconds: dict[int, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    exit_code: int | None = None
    hung: bool = False
    tail: list[str] = field(default_factory=list)


def launch(name: str, worker_args: list[str], ranks: int, *, env: dict[str, str], timeout: float,
           echo: Callable[[str], None]) -> Run:
    """Run the worker under horovodrun, reading its output as it comes; end the job after
    ``timeout`` seconds (a deadlock) or if interrupted."""
    argv = horovodrun_argv(ranks, "benchmarks.soak", worker_args)
    run = Run(name)
    began = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # Ctrl-C of the driver reaches it too
    timer = threading.Timer(timeout, lambda: (setattr(run, "hung", True), end_job(proc)))
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            run.tail = (run.tail + [line])[-40:]
            if (m := PROGRESS.search(line)):
                rank, step, rss = map(int, m.groups())
                run.rss.setdefault(rank, []).append((step, rss))
                echo(f"{name}: rank {rank} step {step} rss {rss / 2**20:.1f} MiB")
            elif (m := DONE.search(line)):
                run.digests[int(m.group(1))] = m.group(2)
                run.train_seconds[int(m.group(1))] = float(m.group(3))
        run.exit_code = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            end_job(proc)
    run.wall_seconds = time.monotonic() - began
    return run


def rss_drift(samples: list[tuple[int, int]], warmup: int) -> float | None:
    """Largest relative departure of a sample after ``warmup`` steps from the first such sample."""
    after = [rss for step, rss in samples if step > warmup]
    if len(after) < 2:
        return None
    return max(abs(rss - after[0]) for rss in after) / after[0]


def summarize(runs: list[Run], ranks: int, warmup: int, tolerance: float) -> dict[str, Any]:
    """The verdict: each check with its figures and, when it failed, why."""
    problems: list[str] = []
    result: dict[str, Any] = {"runs": {}}
    for run in runs:
        drift = {rank: rss_drift(samples, warmup) for rank, samples in sorted(run.rss.items())}
        result["runs"][run.name] = {
            "exit_code": run.exit_code, "hung": run.hung, "wall_seconds": round(run.wall_seconds, 1),
            "train_seconds": run.train_seconds, "digests": run.digests,
            "rss_mib": {rank: [round(rss / 2**20, 2) for _, rss in samples] for rank, samples in run.rss.items()},
            "rss_drift": drift,
        }
        if run.hung:
            problems.append(f"{run.name} run did not finish in time (deadlock?)")
        elif run.exit_code != 0 or len(run.digests) != ranks:
            problems.append(f"{run.name} run failed (exit code {run.exit_code}); last output:\n" + "\n".join(run.tail))
        for rank, value in drift.items():
            if value is None:
                problems.append(f"{run.name} rank {rank}: too few RSS samples after warm-up (raise --steps)")
            elif value > tolerance:
                problems.append(f"{run.name} rank {rank}: RSS moved {value:.1%} after warm-up (> {tolerance:.0%})")
    digests = {(run.name, rank): d for run in runs for rank, d in run.digests.items()}
    result["parameters_identical"] = len(set(digests.values())) == 1 and len(digests) == ranks * len(runs)
    if not result["parameters_identical"] and not problems:
        problems.append("final parameters differ: " + ", ".join(f"{n} rank {r}: {d[:12]}" for (n, r), d in
                                                                 sorted(digests.items())))
    result["problems"] = problems
    result["passed"] = not problems
    return result


def main(args: argparse.Namespace) -> int:
    """Run the scheduled and the plain job, then check liveness, memory and equality."""
    if args.steps <= args.warmup + 2 * args.report_every:
        raise SystemExit(f"--steps {args.steps} leaves too few RSS samples after --warmup {args.warmup} "
                         f"(every {args.report_every} steps)")
    echo = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else \
        (lambda text: print(text, flush=True))
    env = dict(os.environ, BYTESCHED_PARTITION_BYTES=args.partition_bytes, BYTESCHED_CREDIT_BYTES=args.credit_bytes,
               PYTHONUNBUFFERED="1")
    common = ["--steps", str(args.steps), "--delay-ms", str(args.delay_ms), "--report-every", str(args.report_every)]
    # Side by side (each job's rank 0 listens on a free port): half the wall-clock time.
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda spec: launch(*spec, args.ranks, env=env, timeout=args.timeout, echo=echo),
                             [("scheduled", common), ("plain", [*common, "--unscheduled"])]))
    result = summarize(runs, args.ranks, args.warmup, args.rss_tolerance)
    result["settings"] = {k: getattr(args, k) for k in ("ranks", "steps", "delay_ms", "report_every", "warmup",
                                                           "partition_bytes", "credit_bytes", "rss_tolerance")}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, run in result["runs"].items():
            drift = ", ".join(f"rank {r}: {'n/a' if v is None else f'{v:.2%}'}" for r, v in run["rss_drift"].items())
            print(f"{name}: exit {run['exit_code']}, {run['wall_seconds']} s; RSS drift after warm-up: {drift}")
        print(f"final parameters bit-identical across ranks and runs: {result['parameters_identical']}")
        print("PASSED" if result["passed"] else "FAILED:\n" + "\n".join(result["problems"]))
    return 0 if result["passed"] else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``soak`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("soak", help="long 2-rank run: no deadlock, stable RSS, same parameters",
                                   description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run (default 2000)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (default 2: exact equality needs 2)")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="random backward delay per layer, 0..this ms")
    parser.add_argument("--report-every", type=int, default=100, help="RSS sample every this many steps")
    parser.add_argument("--warmup", type=int, default=200, help="steps before RSS must be stable")
    parser.add_argument("--rss-tolerance", type=float, default=0.05, help="allowed RSS drift after warm-up")
    parser.add_argument("--partition-bytes", default="4KB", help="BYTESCHED_PARTITION_BYTES of the scheduled run")
    parser.add_argument("--credit-bytes", default="8KB", help="BYTESCHED_CREDIT_BYTES of the scheduled run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it counts as hung")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (progress goes to stderr)")
    parser.set_defaults(func=main)


def _worker_main() -> int:
    parser = argparse.ArgumentParser(description="one rank of python -m benchmarks soak (run by horovodrun)")
    worker_arguments(parser)
    args = parser.parse_args()
    return train(args.backend, args.steps, unscheduled=args.unscheduled, delay_ms=args.delay_ms,
                 report_every=args.report_every)


if __name__ == "__main__":
    sys.exit(_worker_main())
