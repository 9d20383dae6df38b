"""``bytesched simulate``: predict iteration time, throughput and speedup for every policy."""

from __future__ import annotations

import argparse
import json
import sys

from ..core.config import SIMULATED_POLICIES, ConfigError
from .plan import PLAN
from .cluster import ARCHS, ASSIGNMENTS, COLLECTIVES, TOPOLOGIES
from .options import SWEEPABLE
from .predict import simulate
from .backends import BACKENDS
from .profile import ProfileError, shipped_profiles
from .simulator import DEFAULT_ITERATIONS, DEFAULT_WARMUP, SimulationError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` subcommand."""
    p = subparsers.add_parser(
        "simulate", help="predict iteration time and speedup per policy (discrete-event simulator)",
        description="Run the real bytesched scheduler in virtual time on a described cluster and "
                    "predict iteration time, throughput and speedup over the vanilla framework "
                    "for every policy. See docs/simulator.md.")
    p.add_argument("--profile", default="vgg16",
                   help=f"shipped profile ({', '.join(shipped_profiles())}) or a profile JSON path "
                        "(make one with `bytesched profile`); default vgg16")
    p.add_argument("--arch", choices=ARCHS, default="allreduce", help="gradient synchronisation (default allreduce)")
    p.add_argument("--workers", type=int, default=16, help="data-parallel workers, one device each (default 16)")
    p.add_argument("--bandwidth", default="10Gbps", help="each worker NIC per direction, e.g. 10Gbps, 1.25GB/s")
    p.add_argument("--servers", type=int, help="parameter servers (ps; default: as many as workers)")
    p.add_argument("--server-bandwidth", help="each server NIC per direction (ps; default: --bandwidth)")
    p.add_argument("--topology", choices=TOPOLOGIES, default="full-duplex",
                   help="a full-duplex NIC per host, or one shared medium (a shaped loopback)")
    p.add_argument("--overhead", default="300us", help="per-message overhead θ (default 300us, the paper's)")
    p.add_argument("--latency", default="5us", help="one network hop (default 5us)")
    p.add_argument("--collective", choices=COLLECTIVES, default="nccl",
                   help="all-reduce algorithm: nccl (ring or tree per size, as NCCL chooses; default), ring "
                        "(Gloo, MPI) or tree")
    p.add_argument("--asynchronous", action="store_true",
                   help="ps: asynchronous SGD (MXNet's dist_async): each worker goes on after its own push and pull, "
                        "a server applies each push alone")
    p.add_argument("--assignment", choices=ASSIGNMENTS, default="mxnet", help="PS key placement (default mxnet)")
    p.add_argument("--backend", choices=tuple(BACKENDS), default="horovod",
                   help="the all-reduce's framework: horovod (its fusion cycle fuses what is submitted together; "
                        "default) or torch-distributed (DDP's 25 MiB buckets as vanilla, every collective alone, the "
                        "PyTorch plugin's 1 MB buckets, and the plan weighs batching while busy with every size)")
    p.add_argument("--fusion-threshold", help="Horovod fusion buffer of vanilla all-reduce (default 128MiB; "
                   "0 with --backend torch-distributed)")
    p.add_argument("--cycle-time", default="1ms", help="Horovod cycle time of vanilla all-reduce")
    p.add_argument("--bucket-bytes", help="bytesched's tensor fusion of scheduled all-reduce "
                   "(BYTESCHED_FUSION_BYTES of the PyTorch plugin and MXNet over Horovod, e.g. 1MB; default: none, "
                   "1MB with --backend torch-distributed)")
    p.add_argument("--policy", default=",".join([*SIMULATED_POLICIES, PLAN]),
                   help=f"comma-separated policies (default all: {','.join(SIMULATED_POLICIES)}; tictac: TAC "
                        f"on the profile's layer chain) and {PLAN} (the sizes a job gets with no settings, chosen by "
                        "simulating it); vanilla always runs")
    p.add_argument("--partition", help="partition size, e.g. 4MB (default: each policy's own)")
    p.add_argument("--credit", help="credit size, e.g. 16MB (default 16MB)")
    p.add_argument("--tune", action="store_true",
                   help="run each credit-window policy at its best partition/credit (a 24-point grid), "
                        "as the paper's auto-tuned results")
    p.add_argument("--decoupled", action="store_true",
                   help="the plan also weighs a decoupled all-reduce (DeAR: reduce-scatters in the backward pass, "
                        "all-gathers in the next forward pass), which no plugin runs yet")
    p.add_argument("--breakdown", action="store_true",
                   help="also say where the time from the ideal to the plan goes (order constraint, partitions and "
                        "placement, hop latency, per-message cost, the plan's choice): up to 63 more short simulations")
    p.add_argument("--worker", action="append", default=[], metavar="RANK:compute=F,bandwidth=B",
                   help="make one worker different (repeatable): e.g. 3:compute=1.5 (a straggler), "
                        "0:bandwidth=5Gbps (a slower link)")
    p.add_argument("--sweep", metavar="VAR=V1,V2,...",
                   help=f"one prediction per value; VAR in {', '.join(SWEEPABLE)}, e.g. bandwidth=1,10,25,40,100Gbps")
    p.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, help="measured iterations")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="iterations simulated before measuring")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="also draw throughput and speedup to this file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    backend = BACKENDS[args.backend]
    try:
        report = simulate(
            args.profile, policies=args.policy, partition=args.partition, credit=args.credit,
            sweep=args.sweep, iterations=args.iterations, warmup=args.warmup, tune=args.tune,
            breakdown=args.breakdown, decoupled=args.decoupled, batching=backend.batches,
            arch=args.arch, workers=args.workers, bandwidth=args.bandwidth, servers=args.servers,
            server_bandwidth=args.server_bandwidth, topology=args.topology, overhead=args.overhead,
            latency=args.latency, collective=args.collective, assignment=args.assignment,
            asynchronous=args.asynchronous or None,
            fusion_threshold=_or(args.fusion_threshold, backend.fusion_threshold), cycle_time=args.cycle_time,
            bucket_bytes=_or(args.bucket_bytes, backend.bucket_bytes),
            vanilla_bucket_bytes=backend.vanilla_bucket_bytes,
            worker_specs=args.worker or None)
    except (ConfigError, ProfileError, SimulationError, ValueError) as error:
        print(f"bytesched simulate: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.table())
    if args.plot:
        report.plot(args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _or(given: str | None, preset: float | None) -> str | float | None:
    """The command line's value where given, else the backend's (None: the cluster's default)."""
    return given if given is not None else preset
