"""``python -m benchmarks overhead``: what bytesched costs per tensor, with and without tensor fusion.

A model of many small tensors (``--layers`` dense layers of ``--width`` x ``--width``: two tensors
each) and almost no compute is trained on ``--ranks`` ranks (default 2) over the unshaped loopback,
so the step time is the frameworks' and bytesched's fixed costs per tensor, not bytes or arithmetic. The stacks:
``mxnet`` and ``torch`` over Horovod, ``torch-distributed`` (torchrun, Gloo) and ``mxnet-ps`` (a
``dist_sync`` KVStore, as many servers as workers under ``bytesched launch``, the optimizer on the
servers). Each round runs one job per mode, in turn: ``plain`` (Horovod's DistributedOptimizer
alone, DistributedDataParallel for torch-distributed, the bare KVStore for mxnet-ps), ``unfused``
(bytesched, ``BYTESCHED_FUSION_BYTES=1``: one task per tensor; the KVStore never fuses) and
``fused`` (bytesched with the environment's ``BYTESCHED_FUSION_BYTES``, by default 1 MB, which the
plan keeps on the CPU; not for mxnet-ps). bytesched runs
with no other settings, so the start-up plan picks its sizes, as for a user who sets none. A plan
that stays out passes every gradient to the framework's own path (PyTorch's once its path trial
found that path the faster; the timed steps begin once the trial decided), so those modes
measure that path; ``core`` (``BYTESCHED_PLAN=0``, one task per tensor) measures the path through
the Core that a plan with sizes, or tuning, takes (over torch.distributed the native Core's, ``pycore`` the
Python Core's, ``BYTESCHED_NATIVE=off``); ``batched`` the same path with batching while busy up to
1 MB (``BYTESCHED_BATCH_BYTES``; ``pybatched`` on the Python Core); ``off`` (``BYTESCHED_POLICY=off``,
default fusion) the framework's own path from the first step. Reported per
framework and mode: the median over rounds of each job's milliseconds per step, and the
difference to ``plain`` per tensor; and rank 0's context switches per tensor over the timed steps
(every thread's, voluntary and not: each time a thread blocks, on the GIL, a lock, a queue or the
network, or is preempted), the measurable trace of the thread hand-offs on each path, with its
number of threads; and rank 0's CPU time per tensor in each of its threads (Python's by their
names, the libraries' by the kernel's, ``(native)``), which says where the cost lies: the
training thread, bytesched's threads (Core, updates, Horovod poller), or the library's; and rank
0's passes of Python's cyclic garbage collector per step and their time, which every thread waits
for (what a path keeps alive per tensor across the step sets them off). The
emulated-network benchmark cannot show these costs (they hide under its sleeping layers and the network's noise);
this one shows nothing else.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from bytesched.launch.ports import free_port
from bytesched.runtime import step_until_settled

from .horovod_jobs import end_job, horovodrun_argv
from .provenance import command_line, revision

FRAMEWORKS = ("mxnet", "torch", "torch-distributed", "mxnet-ps")
MODES: dict[str, dict[str, str]] = {"plain": {}, "unfused": {"BYTESCHED_FUSION_BYTES": "1"}, "fused": {},
                                   "core": {"BYTESCHED_FUSION_BYTES": "1", "BYTESCHED_PLAN": "0"},
                                   "pycore": {"BYTESCHED_FUSION_BYTES": "1", "BYTESCHED_PLAN": "0",
                                              "BYTESCHED_NATIVE": "off"},
                                   "off": {"BYTESCHED_POLICY": "off"},
                                   "batched": {"BYTESCHED_FUSION_BYTES": "1", "BYTESCHED_PLAN": "0",
                                               "BYTESCHED_BATCH_BYTES": "1MB"},
                                   "pybatched": {"BYTESCHED_FUSION_BYTES": "1", "BYTESCHED_PLAN": "0",
                                                 "BYTESCHED_BATCH_BYTES": "1MB", "BYTESCHED_NATIVE": "off"}}
"""Each mode and the environment its job runs with, over the caller's."""
UNFUSED_ONLY = ("mxnet-ps",)
"""Stacks whose bytesched plugin does not fuse: no ``fused`` mode."""
RESULT = re.compile(r"OVERHEAD ms_per_step=([\d.]+) switches_per_step=([\d.]+) threads=(\d+) passing=([01]) "
                    r"gc_passes_per_step=([\d.]+) gc_ms_per_step=([\d.]+) cpu_ms_by_thread=(\{.*\})")
JOB_TIMEOUT_S = 300.0
FAILURE_LINES = 120
"""How much of a failed job's output the error shows: a rank that crashes at start-up prints
first, ahead of the other ranks' tracebacks and the launcher's own, about 30 lines."""


class JobResult(NamedTuple):
    """What rank 0 of one job measured over its timed steps."""

    ms_per_step: float
    switches_per_step: float
    threads: int
    passes_through: bool = False
    """bytesched's plan stayed out and the gradients took the framework's own path."""
    cpu_ms_by_thread: dict[str, float] = {}
    """CPU milliseconds per step of each thread (threads of one name summed)."""
    gc_passes_per_step: float = 0.0
    """Passes of Python's cyclic garbage collector per step, every generation."""
    gc_ms_per_step: float = 0.0
    """Milliseconds per step those passes took (every thread waits for them: they hold the GIL)."""


# -- the worker (one rank) --------------------------------------------------------------------

class Window:
    """The timed steps' wall-clock seconds, and this process's context switches, each thread's
    CPU time and Python's cyclic garbage collections over them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.switches = 0
        self.cpu_by_thread: dict[str, float] = {}  # CPU seconds, threads of one name summed
        self.passing = False  # a scheduled job's plugin passed through (its plan stayed out)
        self.gc_passes = 0
        self.gc_seconds = 0.0
        self._gc_began = 0.0

    def start(self) -> None:
        self._cpu = _thread_cpu()
        gc.callbacks.append(self._collection)
        self._began, self._switched = time.perf_counter(), _context_switches()

    def stop(self) -> "Window":
        self.seconds = time.perf_counter() - self._began
        self.switches = _context_switches() - self._switched
        gc.callbacks.remove(self._collection)
        for tid, (name, seconds) in _thread_cpu().items():
            used = seconds - self._cpu.get(tid, (name, 0.0))[1]
            self.cpu_by_thread[name] = self.cpu_by_thread.get(name, 0.0) + used
        return self


    def _collection(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks``: a pass of the collector starts or stops (on whichever thread allocated)."""
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_passes += 1
            self.gc_seconds += time.perf_counter() - self._gc_began


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """Each live thread of this process: its name (Python's, or the kernel's with ``(native)`` for
    the libraries' threads) and its CPU seconds so far (the scheduler's nanosecond count)."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            ns = int((task / "schedstat").read_text().split()[0])
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        tid = int(task.name)
        threads[tid] = (names.get(tid, f"{comm} (native)"), ns / 1e9)
    return threads


def _context_switches() -> int:
    """Voluntary and involuntary context switches of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def _threads() -> int:
    """This process's threads (the kernel's count: Python's, the frameworks' and the libraries')."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def _mxnet_steps(scheduled: bool, layers: int, width: int, steps: int, warmup: int) -> Window:
    """The window of ``steps`` training steps of the MXNet model over Horovod after ``warmup`` more."""
    import torch  # noqa: F401  (before horovod.mxnet, else that import segfaults)
    import horovod.mxnet as hvd
    import mxnet as mx
    from mxnet import gluon

    hvd.init()
    net = _gluon_model(layers, width)
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    optimizer = hvd.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=1e-3))
    if scheduled:
        from bytesched.plugins.mxnet import ScheduledOptimizer
        optimizer = ScheduledOptimizer(optimizer)
    window = _gluon_timed_steps(net, gluon.Trainer(params, optimizer, kvstore=None), width, steps, warmup)
    window.passing = scheduled and optimizer.passes_through
    return window


def _ps_steps(scheduled: bool, layers: int, width: int, steps: int, warmup: int) -> Window:
    """The window of ``steps`` training steps of the MXNet model on a ``dist_sync`` parameter server
    (under ``bytesched launch``) after ``warmup`` more; the servers run the optimizer."""
    import mxnet as mx
    from mxnet import gluon

    store = mx.kv.create("dist_sync")
    if scheduled:
        from bytesched.plugins.mxnet import ScheduledKVStore
        store = ScheduledKVStore(store)
    net = _gluon_model(layers, width)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-3}, kvstore=store)
    window = _gluon_timed_steps(net, trainer, width, steps, warmup, getattr(store, "wait_idle", None))
    window.passing = scheduled and store.passes_through
    return window


def _gluon_model(layers: int, width: int) -> Any:
    import mxnet as mx
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    for _ in range(layers):
        net.add(gluon.nn.Dense(width, in_units=width))
    net.initialize(mx.init.Xavier())
    return net


def _gluon_timed_steps(net: Any, trainer: Any, width: int, steps: int, warmup: int, drain: Any = None) -> Window:
    """The window of ``steps`` Gluon training steps after ``warmup`` more (the engine idle, and a
    scheduled store's ``drain()`` done, before the clock starts and before it stops)."""
    import mxnet as mx
    from mxnet import autograd

    x = mx.nd.ones((8, width))
    window = Window()
    for step in range(warmup + steps):
        if step == warmup:
            mx.nd.waitall()
            if drain is not None:
                drain()
            window.start()
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(8)
    mx.nd.waitall()
    if drain is not None:
        drain()
    return window.stop()


def _torch_steps(scheduled: bool, layers: int, width: int, steps: int, warmup: int) -> Window:
    """The window of ``steps`` training steps of the PyTorch model after ``warmup`` more."""
    import horovod.torch as hvd
    import torch
    from torch import nn

    hvd.init()
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters())
    if scheduled:
        from bytesched.plugins.torch import ScheduledOptimizer
        optimizer = ScheduledOptimizer(model, optimizer)
    window = _timed_steps(model, optimizer, torch.ones(8, width), steps, warmup, scheduled)
    window.passing = scheduled and optimizer.passes_through
    return window


def _timed_steps(net: Any, optimizer: Any, x: Any, steps: int, warmup: int, scheduled: bool,
                 before_timing: Any = None) -> Window:
    """The window of ``steps`` PyTorch training steps after ``warmup`` more (a scheduled
    optimizer's warm-up lasts until its plan and path trial settled, and its updates landed
    before the clock starts, the timed ones before it stops); ``before_timing()`` runs right
    before the clock starts."""
    def train_step() -> None:
        optimizer.zero_grad()
        net(x).sum().backward()
        optimizer.step()

    window = Window()
    for step in range(warmup + steps):
        if step == warmup:
            if scheduled:
                step_until_settled(optimizer, train_step)  # time the path the job keeps
                optimizer.synchronize()
            if before_timing is not None:
                before_timing()
            window.start()
        train_step()
    if scheduled:
        optimizer.synchronize()
    return window.stop()


def _distributed_steps(scheduled: bool, layers: int, width: int, steps: int, warmup: int) -> Window:
    """The window of ``steps`` training steps of the PyTorch model over torch.distributed (under
    torchrun) after ``warmup`` more: DDP when not ``scheduled``."""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    if scheduled:
        from bytesched.plugins.torch import ScheduledOptimizer
        net, optimizer = model, ScheduledOptimizer(model, sgd)
    else:
        net, optimizer = nn.parallel.DistributedDataParallel(model), sgd
    window = _timed_steps(net, optimizer, torch.ones(8, width), steps, warmup, scheduled, dist.barrier)
    if scheduled:
        window.passing = optimizer.passes_through
        optimizer.close()
    # Leave together: a rank whose Gloo peer has already torn down its connections can abort
    # (SIGABRT) in Gloo's own threads at exit.
    dist.barrier()
    dist.destroy_process_group()
    return window


def _worker_main() -> int:
    parser = argparse.ArgumentParser(description="one rank of python -m benchmarks overhead (run by horovodrun)")
    parser.add_argument("framework", choices=FRAMEWORKS)
    parser.add_argument("mode", choices=tuple(MODES))
    for name in ("layers", "width", "steps", "warmup"):
        parser.add_argument(f"--{name}", type=int, required=True)
    args = parser.parse_args()
    run = {"mxnet": _mxnet_steps, "torch": _torch_steps, "torch-distributed": _distributed_steps,
           "mxnet-ps": _ps_steps}[args.framework]
    window = run(args.mode != "plain", args.layers, args.width, args.steps, args.warmup)
    rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK", os.environ.get("BYTESCHED_RANK", "0")))
    if rank == "0":
        print(f"OVERHEAD ms_per_step={window.seconds / args.steps * 1e3:.3f} "
              f"switches_per_step={window.switches / args.steps:.1f} threads={_threads()} "
              f"passing={int(window.passing)} gc_passes_per_step={window.gc_passes / args.steps:.3f} "
              f"gc_ms_per_step={window.gc_seconds / args.steps * 1e3:.3f} cpu_ms_by_thread="
              f"{json.dumps({name: round(s / args.steps * 1e3, 3) for name, s in window.cpu_by_thread.items()})}",
              flush=True)
    if args.framework == "torch-distributed":
        # After destroy_process_group a rank can still abort in the interpreter's teardown, where
        # Gloo's threads end ("terminate called without an active exception": a DDP job, once in
        # 30 torch.distributed jobs on 4 ranks; PyTorch keeps the group alive once TorchDynamo is
        # imported after it, docs/experiments/exit-abort.md). Every rank left the process group
        # together and rank 0 printed its measurement, so the process ends without that teardown.
        sys.stderr.flush()
        os._exit(0)
    return 0


# -- the driver -------------------------------------------------------------------------------

def job_argv(framework: str, mode: str, args: argparse.Namespace) -> list[str]:
    """The command of one job on ``args.ranks`` ranks: under torchrun, ``bytesched launch`` (as
    many servers as workers) or horovodrun."""
    worker_args = [framework, mode, "--layers", str(args.layers), "--width", str(args.width),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if framework == "torch-distributed":
        return _torchrun_argv(args.ranks, "benchmarks.overhead", worker_args)
    if framework == "mxnet-ps":
        launcher = str(Path(sys.executable).parent / "bytesched")
        return [launcher, "launch", "--servers", str(args.ranks), "--workers", str(args.ranks),
                "--timeout", str(int(JOB_TIMEOUT_S) - 10), "--", sys.executable, "-m", "benchmarks.overhead",
                *worker_args]
    return horovodrun_argv(args.ranks, "benchmarks.overhead", worker_args)


def run_job(framework: str, mode: str, args: argparse.Namespace) -> JobResult:
    """One job; what its rank 0 measured (SystemExit naming the job if it failed)."""
    argv = job_argv(framework, mode, args)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **MODES[mode])
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        end_job(proc)
        raise SystemExit(f"python -m benchmarks overhead: the {framework} {mode} job did not finish in "
                         f"{JOB_TIMEOUT_S:.0f} s") from None
    found = RESULT.search(output)
    if proc.returncode != 0 or found is None:
        tail = "\n".join(output.splitlines()[-FAILURE_LINES:])
        raise SystemExit(f"python -m benchmarks overhead: the {framework} {mode} job failed "
                         f"(exit code {proc.returncode}):\n{tail}")
    return JobResult(float(found.group(1)), float(found.group(2)), int(found.group(3)), found.group(4) == "1",
                     json.loads(found.group(7)), float(found.group(5)), float(found.group(6)))


def _torchrun_argv(ranks: int, module: str, worker_args: list[str]) -> list[str]:
    """``python -m module worker_args`` on ``ranks`` local ranks under the torchrun next to this
    interpreter, on a free port."""
    port = free_port()
    torchrun = Path(sys.executable).parent / "torchrun"
    return [str(torchrun), "--nproc-per-node", str(ranks), "--master-port", str(port), "-m", module, *worker_args]


def modes_of(framework: str, chosen: tuple[str, ...] = tuple(MODES)) -> tuple[str, ...]:
    """The ``chosen`` modes that run for ``framework``, ``plain`` always."""
    return tuple(mode for mode in MODES if (mode == "plain" or mode in chosen)
                 and not (mode == "fused" and framework in UNFUSED_ONLY))


def summarize(runs: dict[str, dict[str, list[JobResult]]], tensors: int) -> dict[str, Any]:
    """Per framework and mode: median, min and max ms per step, the median's excess over
    ``plain`` per tensor (microseconds), the median context switches per tensor, the threads and
    how many of the jobs passed through; and per thread, the median CPU microseconds per tensor
    (a thread missing from a job counts as 0 there), the busiest thread first."""
    result: dict[str, Any] = {}
    for framework, modes in runs.items():
        plain = statistics.median(run.ms_per_step for run in modes["plain"])
        result[framework] = {}
        for mode, jobs in modes.items():
            times = [job.ms_per_step for job in jobs]
            result[framework][mode] = {
                "ms_per_step": round(statistics.median(times), 2), "min": round(min(times), 2),
                "max": round(max(times), 2),
                "us_per_tensor_over_plain": round((statistics.median(times) - plain) / tensors * 1e3, 1),
                "switches_per_tensor": round(statistics.median(job.switches_per_step for job in jobs) / tensors, 2),
                "threads": max(job.threads for job in jobs),
                "passed_through": sum(job.passes_through for job in jobs),
                "gc_passes_per_step": round(statistics.median(job.gc_passes_per_step for job in jobs), 2),
                "gc_ms_per_step": round(statistics.median(job.gc_ms_per_step for job in jobs), 3),
                "cpu_us_per_tensor_by_thread": _cpu_by_thread(jobs, tensors)}
    return result


def _cpu_by_thread(jobs: list[JobResult], tensors: int) -> dict[str, float]:
    """Median over ``jobs`` of each thread's CPU microseconds per tensor, busiest first."""
    names = {name for job in jobs for name in job.cpu_ms_by_thread}
    medians = {name: statistics.median(job.cpu_ms_by_thread.get(name, 0.0) for job in jobs) / tensors * 1e3
               for name in names}
    return {name: round(us, 1) for name, us in sorted(medians.items(), key=lambda item: -item[1])}


def main(args: argparse.Namespace) -> int:
    """Alternate the modes' jobs for ``--rounds`` rounds per framework; print the table."""
    echo = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else \
        (lambda text: print(text, flush=True))
    frameworks = args.frameworks.split(",")
    chosen = tuple(args.modes.split(","))
    if set(frameworks) - set(FRAMEWORKS) or set(chosen) - set(MODES) or min(args.rounds, args.layers) < 1 \
            or args.ranks < 2:
        raise SystemExit(f"python -m benchmarks overhead: --frameworks takes {','.join(FRAMEWORKS)} (got "
                         f"{args.frameworks!r}), --modes {','.join(MODES)} (got {args.modes!r}); --rounds and "
                         "--layers must be >= 1, --ranks >= 2")
    runs: dict[str, dict[str, list[JobResult]]] = {f: {mode: [] for mode in modes_of(f, chosen)}
                                                   for f in frameworks}
    for framework in frameworks:
        for round_ in range(1, args.rounds + 1):
            for mode in runs[framework]:
                job = run_job(framework, mode, args)
                runs[framework][mode].append(job)
                echo(f"{framework} round {round_}/{args.rounds}: {mode:8s} {job.ms_per_step:8.2f} ms/step, "
                     f"{job.switches_per_step:7.1f} context switches/step, {job.threads} threads"
                     + (", passing through" if job.passes_through else ""))
    tensors = 2 * args.layers
    settings = {k: getattr(args, k) for k in ("ranks", "layers", "width", "steps", "warmup", "rounds", "modes")}
    result = {"command": command_line("overhead"), "revision": revision(), "tensors": tensors, "settings": settings,
              "results": summarize(runs, tensors),
              "runs": {f: {mode: [job._asdict() for job in jobs] for mode, jobs in modes.items()}
                       for f, modes in runs.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\n{tensors} tensors, {args.ranks} ranks over loopback; median of {args.rounds} rounds [min-max]")
    print("| framework | mode | ms per step | over plain, per tensor | context switches per tensor | threads "
          "| jobs passing through | garbage collector: passes, ms per step |\n|---|---|---|---|---|---|---|---|")
    for framework, modes in result["results"].items():
        for mode, row in modes.items():
            print(f"| {framework} | {mode} | {row['ms_per_step']} [{row['min']}-{row['max']}] | "
                  f"{row['us_per_tensor_over_plain']} us | {row['switches_per_tensor']} | {row['threads']} | "
                  f"{row['passed_through']} of {args.rounds} | {row['gc_passes_per_step']}, {row['gc_ms_per_step']} |")
    print("\nRank 0's CPU per tensor by thread (median of rounds; threads under 1 us left out)")
    print("| framework | mode | CPU us per tensor: thread |\n|---|---|---|")
    for framework, modes in result["results"].items():
        for mode, row in modes.items():
            threads = ", ".join(f"{name} {us}" for name, us in row["cpu_us_per_tensor_by_thread"].items() if us >= 1)
            print(f"| {framework} | {mode} | {threads} |")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``overhead`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("overhead", help="per-tensor cost of bytesched over Horovod, DDP and a "
                                   "parameter server, fused and not",
                                   description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--frameworks", default="mxnet,torch",
                        help="of mxnet, torch (both over Horovod), torch-distributed and mxnet-ps "
                             "(default mxnet,torch)")
    parser.add_argument("--layers", type=int, default=94, help="dense layers, two tensors each (default 94: "
                        "188 tensors, as the emulated Transformer)")
    parser.add_argument("--width", type=int, default=64, help="layer width (default 64: 16 KB matrices)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per job (default 50)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="jobs per mode (default 3)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks per job (default 2); mxnet-ps runs as many "
                        "servers as workers")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"of {', '.join(MODES)} (default all; plain always runs)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (progress goes to stderr)")
    parser.set_defaults(func=main)


if __name__ == "__main__":
    sys.exit(_worker_main())
