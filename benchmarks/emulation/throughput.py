"""Measure what an emulated network really carries: TCP streams between hosts, all at once.

Used to check that shaping limits each direction as configured (veth: both directions of a
pair at the full rate each; loopback: both together share it) and to find the rate this CPU can
reach at all. Each stream is two processes, a sink on the receiving host and a sender on the
sending host, started inside their hosts' namespaces. Every sender connects first and then all
start sending together (process start-up on a loaded machine would otherwise stagger them);
each sink counts the bytes after its first read until the end, so the token bucket's initial
burst is not counted as speed.

Command line (root)::

    python -m benchmarks.emulation.throughput --topology veth --rate 1gbit --megabytes 50 --repeats 3
    python -m benchmarks.emulation.throughput --topology veth --rate 200mbit --megabytes 10 --allreduce 2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Sequence

from .cluster import Cluster, emulated_cluster
from .network import format_rate, parse_rate
from .topology import Host

# argv: address. Prints the port it listens on, then (after the stream) when its first read
# returned, when the stream ended (CLOCK_MONOTONIC is one clock for every namespace) and how
# many bytes came in between.
_SINK = """
import socket, sys, time
server = socket.socket(); server.bind((sys.argv[1], 0)); server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept(); conn.recv(1 << 20); got = 0; start = time.monotonic()
while chunk := conn.recv(1 << 20):
    got += len(chunk)
print(start, time.monotonic(), got, flush=True)
"""
# argv: address, port, bytes. Connects, says "ready", and sends once told "go" on stdin.
_SENDER = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2]))); left = int(sys.argv[3])
print("ready", flush=True); sys.stdin.readline()
chunk = b"x" * (1 << 20)
while left > 0:
    conn.sendall(chunk[:left]); left -= len(chunk)
conn.close()
"""


@dataclass(frozen=True)
class Transfer:
    """One stream as its receiver saw it: after its first read and at its end (monotonic
    seconds), and the bytes that came in between."""

    start: float
    end: float
    nbytes: int

    @property
    def rate(self) -> float:
        """Bits per second over the stream's own duration."""
        return self.nbytes * 8 / (self.end - self.start)


def aggregate_rate(transfers: Sequence[Transfer]) -> float:
    """Bits per second of all ``transfers`` together, from the first start to the last end: what
    a shared medium carried (per-stream rates overstate it when one stream ends early and the
    others then run alone)."""
    return sum(t.nbytes for t in transfers) * 8 / (max(t.end for t in transfers) - min(t.start for t in transfers))


def stream_rates(streams: Sequence[tuple[Host, Host]], nbytes: int, timeout: float = 60.0) -> list[Transfer]:
    """Each ``(sender, receiver)`` stream of ``nbytes``, all started at the same time."""
    sinks = [subprocess.Popen([*receiver.namespace.exec_prefix(), sys.executable, "-c", _SINK, receiver.address],
                              stdout=subprocess.PIPE, text=True) for _, receiver in streams]
    senders: list[subprocess.Popen[str]] = []
    try:
        for (sender, receiver), sink in zip(streams, sinks):
            assert sink.stdout is not None
            port = sink.stdout.readline().strip()
            if not port:
                raise RuntimeError(f"the sink on host {receiver.index} did not start")
            senders.append(subprocess.Popen(
                [*sender.namespace.exec_prefix(), sys.executable, "-c", _SENDER, receiver.address, port, str(nbytes)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for process, (sender, receiver) in zip(senders, streams):
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"host {sender.index} could not connect to host {receiver.index}")
        for process in senders:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.close()
        transfers = []
        for sink, (sender, receiver) in zip(sinks, streams):
            output, _ = sink.communicate(timeout=timeout)
            if sink.returncode != 0 or len(output.split()) != 3:
                raise RuntimeError(f"stream host {sender.index} -> host {receiver.index} failed")
            start, end, got = output.split()
            transfers.append(Transfer(float(start), float(end), int(got)))
        for process in senders:
            if process.wait(timeout=timeout) != 0:
                raise RuntimeError(f"a sender exited with {process.returncode}")
        return transfers
    finally:
        for process in [*sinks, *senders]:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


# One torch.distributed rank: a warm-up, then the median time of 3 all-reduces of argv[1] floats.
_ALLREDUCE = """
import statistics, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
tensor = torch.ones(int(sys.argv[1]))
dist.all_reduce(tensor)
times = []
for _ in range(3):
    start = time.monotonic(); dist.all_reduce(tensor); times.append(time.monotonic() - start)
print("ALLREDUCE", statistics.median(times), flush=True)
dist.destroy_process_group()
"""


def allreduce_seconds(cluster: Cluster, nbytes: int, ranks: int, timeout: float = 300.0) -> list[float]:
    """Each rank's median time for an all-reduce of ``nbytes`` (float32) among ``ranks`` ranks
    (torch.distributed with Gloo, its ring algorithm), placed on ``cluster`` as jobs are."""
    job = cluster.launch_torch_distributed([sys.executable, "-c", _ALLREDUCE, str(nbytes // 4)], env={}, ranks=ranks)
    status = job.wait(timeout)
    times = [float(line.rsplit(" ", 1)[1]) for line in job.output if "] ALLREDUCE " in line]
    if status != 0 or len(times) != ranks:
        raise RuntimeError(f"the all-reduce job failed (status {status}):\n" + "\n".join(job.output[-20:]))
    return times


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rates of streams between host 0 and host 1 (one each way, at once, unless
    ``--one-way``): median and range over ``--repeats`` runs; or, with ``--allreduce``, how
    long an all-reduce takes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", choices=("veth", "loopback"), default="veth")
    parser.add_argument("--rate", type=parse_rate, default=parse_rate("1gbit"))
    parser.add_argument("--megabytes", type=int, default=50, help="per stream, or the all-reduce's size (default: 50)")
    parser.add_argument("--repeats", type=int, default=3, help="runs to take the median of (default: 3)")
    parser.add_argument("--one-way", action="store_true", help="only host 0 -> host 1")
    parser.add_argument("--allreduce", type=int, metavar="RANKS",
                        help="instead of streams: time an all-reduce of --megabytes among RANKS ranks, one per host")
    args = parser.parse_args(argv)
    hosts = args.allreduce or 2
    with emulated_cluster(hosts, args.rate, topology=args.topology) as cluster:
        print(cluster.describe())
        if args.allreduce:
            _print_allreduce(cluster, args.megabytes * 10**6, args.allreduce)
            return 0
        a, b = cluster.hosts
        streams = [(a, b)] if args.one_way else [(a, b), (b, a)]
        runs = [stream_rates(streams, args.megabytes * 10**6) for _ in range(args.repeats)]
        for index, (sender, receiver) in enumerate(streams):
            _print_rates(f"host {sender.index} -> host {receiver.index}", [run[index].rate for run in runs])
        _print_rates("all streams together", [aggregate_rate(run) for run in runs])
    return 0


def _print_allreduce(cluster: Cluster, nbytes: int, ranks: int) -> None:
    """The measured all-reduce time next to the bandwidth terms the simulator uses for a ring
    (bytesched/sim/network.py): 2(n-1)/n of the bytes per full-duplex link, 2(n-1) times the
    bytes over one shared medium."""
    seconds = allreduce_seconds(cluster, nbytes, ranks)
    byte_rate = cluster.bits_per_second / 8
    print(f"all-reduce of {nbytes / 1e6:g} MB among {ranks} ranks: {min(seconds):.3f}-{max(seconds):.3f} s "
          f"(median of 3 per rank); a ring needs {2 * (ranks - 1) / ranks * nbytes / byte_rate:.3f} s on "
          f"full-duplex links, {2 * (ranks - 1) * nbytes / byte_rate:.3f} s on one shared medium")


def _print_rates(what: str, rates: list[float]) -> None:
    def text(rate: float) -> str:
        return format_rate(round(rate, -7))
    print(f"{what}: median {text(statistics.median(rates))} (min {text(min(rates))}, max {text(max(rates))}, "
          f"{len(rates)} runs)")


if __name__ == "__main__":
    sys.exit(main())
