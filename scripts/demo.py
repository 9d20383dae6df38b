"""The demo: the same training run on the local host without and with bytesched, and the speedup.

Runs examples/pytorch_synthetic_benchmark.py under ``horovodrun --gloo`` three times: plain
``hvd.DistributedOptimizer``; ``ScheduledOptimizer`` in barrier mode (scheduled communication,
but backward waits for it: what scheduling gains without crossing the barrier); and
``ScheduledOptimizer`` crossing the barrier (the default). It prints the img/sec of each and the
speedups over the first.
On an unshaped loopback communication is almost free, so when it can (as root, with ``ip`` and
``tc``) the demo runs both inside a network namespace whose loopback is limited to
``--bandwidth`` (benchmarks.emulation), and deletes the namespace afterwards, also on failure or
Ctrl-C. Otherwise it runs unshaped and says why.

That model computes on the same CPU cores that communicate, where scheduling has nothing to
overlap. So, with shaping, the demo then trains an emulated VGG16 whose layers sleep for their
(scaled) compute time, as a GPU would leave the CPU free, on two emulated hosts joined at
``--emulated-bandwidth``: plain Horovod against bytesched with no settings, which picks its
partition and credit at start-up from its own measured step and network (the start-up plan:
``python -m benchmarks emulated``, configuration ``plan``; median of three interleaved rounds).

    .venv/bin/python scripts/demo.py [--bandwidth 3gbit] [--no-shaping] [--no-emulated]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's benchmarks package (not installed)

from benchmarks.emulated.results import load, summarize  # noqa: E402 - after the sys.path insert
from benchmarks.emulation import (Namespace, ShapingUnavailable, format_rate, parse_rate, shaped_loopback,  # noqa: E402 - after the sys.path insert
                                  unavailable_reason)

BENCHMARK = REPO / "examples" / "pytorch_synthetic_benchmark.py"
TOTAL_RE = re.compile(r"Total img/sec on (\d+) CPU rank\(s\): ([0-9.]+) \+-([0-9.]+)")
RANK0_PREFIX = re.compile(r"^\[0\]<stdout>:")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--bandwidth", default="3gbit",
                        help="emulated network bandwidth, shared by all ranks and both directions")
    parser.add_argument("--no-shaping", action="store_true", help="run on the unshaped loopback")
    parser.add_argument("--ranks", type=int, default=2, help="Horovod ranks (processes) on the local host")
    parser.add_argument("--model", default="vgg", help="model of the synthetic benchmark")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-warmup", type=int, default=4)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=8)
    parser.add_argument("--emulated-bandwidth", default="1gbit",
                        help="per-host bandwidth of the emulated-compute part (where VGG16's communication "
                             "about equals its compute)")
    parser.add_argument("--no-emulated", action="store_true", help="skip the emulated-compute part")
    args = parser.parse_args(argv)
    try:
        args.rate = parse_rate(args.bandwidth)
        args.emulated_rate = parse_rate(args.emulated_bandwidth)
    except ValueError as error:
        parser.error(str(error))
    return args


@contextlib.contextmanager
def network(args: argparse.Namespace) -> Iterator[Namespace | None]:
    """The shaped namespace, or None (unshaped) with the reason printed."""
    reason = "--no-shaping was given" if args.no_shaping else unavailable_reason()
    with contextlib.ExitStack() as stack:
        ns = None
        if reason is None:
            try:
                ns = stack.enter_context(shaped_loopback(args.rate))
            except ShapingUnavailable as error:
                reason = str(error)
        if ns is not None:
            print(f"Network: loopback shaped to {format_rate(args.rate)} (tc tbf) in namespace {ns.name}, "
                  f"shared by all {args.ranks} ranks and both directions", flush=True)
        else:
            print(f"Network: UNSHAPED loopback ({reason}); communication is almost free here, so expect "
                  f"little difference", flush=True)
        yield ns


RUNS = {  # label -> the benchmark's flags
    "baseline (hvd.DistributedOptimizer)": ["--no-bytesched"],
    "bytesched, barrier mode": ["--bytesched", "--no-cross-barrier"],
    "bytesched, crossing the barrier": ["--bytesched", "--cross-barrier"],
}


def benchmark(ns: Namespace | None, args: argparse.Namespace, flags: list[str]) -> tuple[float, float]:
    """Run the benchmark once; (total img/sec, +- 1.96 std). Rank 0's lines are echoed."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    argv = [*(ns.exec_prefix() if ns else []), str(horovodrun), "-np", str(args.ranks),
            "-H", f"localhost:{args.ranks}", "--gloo", sys.executable, str(BENCHMARK),
            "--model", args.model, "--batch-size", str(args.batch_size), "--num-warmup", str(args.num_warmup),
            "--num-batches-per-iter", str(args.num_batches_per_iter), "--num-iters", str(args.num_iters), *flags]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    lines = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if RANK0_PREFIX.match(line):
                print("    " + RANK0_PREFIX.sub("", line), end="", flush=True)
        process.wait()
    finally:
        if process.poll() is None:  # interrupted: stop the whole job before the namespace goes
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    match = TOTAL_RE.search("".join(lines))
    if process.returncode != 0 or match is None:
        sys.stderr.write("".join(lines[-40:]))
        raise SystemExit(f"the run with {' '.join(flags)} failed (exit {process.returncode})")
    return float(match.group(2)), float(match.group(3))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"Demo: {args.model}, batch {args.batch_size} per rank, {args.ranks} Horovod ranks on the local host "
          f"({os.cpu_count()} cores)", flush=True)
    results = {}
    with network(args) as ns:
        for label, flags in RUNS.items():
            print(f"\n== {label}", flush=True)
            results[label] = benchmark(ns, args, flags)
    network_text = f"{format_rate(args.rate)} shaped loopback" if ns else "unshaped loopback"
    print(f"\n== Result ({network_text}; total img/sec of {args.ranks} ranks, mean +- 1.96 std over "
          f"{args.num_iters} timed iterations; speedup over the baseline)")
    base = results[next(iter(RUNS))][0]
    for label, (rate, conf) in results.items():
        print(f"  {label:<36} {rate:8.1f} +-{conf:<6.1f} {rate / base:5.2f}x")
    if not args.no_emulated:
        emulated(args, shaping=ns is not None)
    return 0


def emulated(args: argparse.Namespace, shaping: bool) -> None:
    """Plain Horovod against bytesched on emulated (CPU-free) VGG16 compute; prints the speedup."""
    if not shaping:
        print("\n(emulated-compute part skipped: it needs the network shaping that was unavailable above)")
        return
    rate = format_rate(args.emulated_rate)
    print(f"\n== Emulated VGG16 compute (layers sleep, the CPU stays free as with a GPU), 2 hosts at "
          f"{rate} per direction: plain Horovod vs bytesched with no settings (start-up plan)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bytesched-demo-") as folder:
        out = Path(folder) / "emulated.json"
        command = [sys.executable, "-m", "benchmarks", "emulated", "--frameworks",
                   "torch-horovod", "--models", "vgg16", "--bandwidths", args.emulated_bandwidth, "--ranks", "2",
                   "--configs", "vanilla,plan", "--repeats", "3", "--json", str(out)]
        if subprocess.run(command, cwd=REPO).returncode != 0:
            raise SystemExit("the emulated-compute benchmark failed (its output is above)")
        [group] = load(out)["groups"]
    cells = {cell.config: cell for cell in summarize(group)}
    base, sched = cells["vanilla"], cells["plan"]
    if base.throughput is None or sched.throughput is None or sched.speedup is None:
        raise SystemExit("the emulated-compute benchmark reported no runs")
    print(f"\n== Result (emulated VGG16 compute, {rate} per host; samples/s, median of "
          f"{sched.throughput.count} rounds; speedup over plain Horovod in the same round, median [min-max])")
    print(f"  {'plain Horovod':<40} {base.throughput.median:8.1f}  1.00x")
    print(f"  {'bytesched (no settings: start-up plan)':<40} {sched.throughput.median:8.1f}  "
          f"{sched.speedup.median:.2f}x [{sched.speedup.low:.2f}-{sched.speedup.high:.2f}]")


if __name__ == "__main__":
    sys.exit(main())
