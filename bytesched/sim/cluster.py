"""The simulated cluster: workers, network, gradient-synchronisation architecture and the
framework constants the baselines need (Horovod's fusion, MXNet's key-to-server assignment).

Units inside the simulator are bytes, seconds and bytes/second; :func:`parse_bandwidth` and
:func:`parse_duration` read the human forms the command line takes (``10Gbps``, ``300us``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.config import ConfigError

ARCHS = ("allreduce", "ps")
TOPOLOGIES = ("full-duplex", "shared")
ASSIGNMENTS = ("mxnet", "round-robin")
COLLECTIVES = ("nccl", "ring", "tree")
"""All-reduce algorithms (:mod:`bytesched.sim.allreduce`): NCCL's choice per size, or one always."""

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_DURATION_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_QUANTITY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ/]*)\s*$")


def parse_bandwidth(text: str | float, *, name: str = "bandwidth") -> float:
    """Bytes/second from ``10Gbps``, ``25Gbit/s``, ``1.25GB/s`` or a plain number of bytes/s.

    Bits are spelled ``bps`` or ``bit/s`` and bytes ``B/s`` (capital B), as on NIC data sheets;
    the ambiguous ``Gb/s`` is refused rather than guessed.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _QUANTITY_RE.match(str(text))
        unit = m.group(2) if m else ""
        lower = unit.lower()
        scale: float | None = None
        if m is not None and not unit:
            scale = 1.0
        elif m is not None and unit.endswith("B/s") and lower[:-3] in _PREFIX:
            scale = _PREFIX[lower[:-3]]
        elif m is not None:
            for suffix in ("bps", "bit/s"):
                if lower.endswith(suffix) and lower[: -len(suffix)] in _PREFIX:
                    scale = _PREFIX[lower[: -len(suffix)]] / 8
        if scale is None:
            raise ConfigError(f"{name}={text!r} is not a bandwidth: expected e.g. 10Gbps, 25Gbit/s, "
                              f"1.25GB/s or a number of bytes per second")
        value = float(m.group(1)) * scale  # type: ignore[union-attr]  # matched: scale is set
    if not (value > 0 and (math.isfinite(value) or value == math.inf)):
        raise ConfigError(f"{name}={text!r} must be a positive bandwidth")
    return value


def parse_duration(text: str | float, *, name: str = "duration") -> float:
    """Seconds from ``300us``, ``1.5ms``, ``0.2s`` or a plain number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _QUANTITY_RE.match(str(text))
        unit = m.group(2).lower() if m else ""
        if m is None or (unit and unit not in _DURATION_UNITS):
            raise ConfigError(f"{name}={text!r} is not a duration: expected e.g. 300us, 1.5ms, 0.2s")
        value = float(m.group(1)) * (_DURATION_UNITS[unit] if unit else 1.0)
    if not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"{name}={text!r} must be a finite duration >= 0")
    return value


def format_bandwidth(value: float) -> str:
    """``10Gbps`` style, for tables and plots."""
    bits = value * 8
    for unit, scale in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("Kbps", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits:g}bps"


@dataclass(frozen=True)
class WorkerSpec:
    """How one worker differs from the rest: ``compute`` multiplies its compute times (2.0 is a
    straggler at half speed), ``bandwidth`` replaces its NIC speed (bytes/s, each direction)."""

    compute: float = 1.0
    bandwidth: float | None = None

    def __post_init__(self) -> None:
        if not (self.compute > 0 and math.isfinite(self.compute)):
            raise ConfigError(f"worker compute factor must be a positive number, got {self.compute!r}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ConfigError(f"worker bandwidth must be positive bytes/s, got {self.bandwidth!r}")


@dataclass(frozen=True)
class Cluster:
    """What the job runs on. Every worker is identical unless :attr:`worker_specs` says
    otherwise; identical workers are simulated once, so 1,000 of them cost what one does.

    Attributes:
        workers: number of data-parallel workers (each one device; the paper's assumption 1-2).
        arch: ``allreduce`` (ring) or ``ps`` (parameter server).
        bandwidth: each worker NIC's speed per direction, bytes/s.
        servers: parameter servers (PS); ``None`` means as many as workers (colocated, the
            paper's set-up).
        server_bandwidth: each server NIC's speed per direction; ``None`` means ``bandwidth``.
        topology: ``full-duplex`` (a NIC per host, each direction separate) or ``shared`` (one
            medium for everything, e.g. a rate-shaped loopback).
        overhead: θ, the fixed cost of every message (RPC, serialisation, synchronisation);
            the paper measured about 300 us.
        latency: one network hop; a ring all-reduce pays ``2(n-1)`` of them, a tree
            ``4 ceil(log2 n)``, a PS message one (pipelined: it delays the message, not the next
            one on its connection).
        collective: the all-reduce algorithm: ``nccl`` (ring or tree, whichever is faster for
            each collective's size, as NCCL chooses), ``ring`` (Gloo, MPI) or ``tree``.
        assignment: how the PS maps keys to servers: ``mxnet`` (a key of at least
            ``bigarray_bound`` elements is sliced evenly over all servers, smaller keys are
            hashed to one) or ``round-robin`` (each key whole on the next server).
        bigarray_bound: MXNet's ``MXNET_KVSTORE_BIGARRAY_BOUND`` in elements.
        fusion_threshold: Horovod tensor fusion buffer (vanilla all-reduce), bytes.
        cycle_time: Horovod background-loop cycle (vanilla all-reduce), seconds.
        asynchronous: a parameter server of asynchronous SGD (MXNet's ``dist_async``): each
            worker goes on after its own push and pull, a server applies each push alone and
            answers its pull, and every worker is simulated apart, started a fraction of a step
            after the one before (:mod:`bytesched.sim.simulator`).
        bucket_bytes: bytesched's tensor fusion in a scheduled all-reduce job
            (``BYTESCHED_FUSION_BYTES`` of the PyTorch plugin and of MXNet over Horovod):
            consecutive tensors share one task while they hold at most this many bytes
            together; 0: one task per tensor.
        vanilla_bucket_bytes: the framework's own buckets in a vanilla all-reduce job (DDP's
            ``bucket_cap_mb``): consecutive tensors share one all-reduce while they hold at most
            this many bytes together, each started once its last gradient is ready; 0: Horovod's
            fusion cycle (``fusion_threshold``, ``cycle_time``) instead. Over torch.distributed
            set ``fusion_threshold=0`` too: c10d runs every collective alone.
        worker_specs: rank -> :class:`WorkerSpec` for heterogeneous workers.
    """

    workers: int = 16
    arch: str = "allreduce"
    bandwidth: float = 10e9 / 8
    servers: int | None = None
    server_bandwidth: float | None = None
    topology: str = "full-duplex"
    overhead: float = 300e-6
    latency: float = 5e-6
    collective: str = "nccl"
    assignment: str = "mxnet"
    bigarray_bound: int = 1_000_000
    fusion_threshold: float = 128 * 2**20
    cycle_time: float = 1e-3
    asynchronous: bool = False
    bucket_bytes: float = 0.0
    vanilla_bucket_bytes: float = 0.0
    worker_specs: tuple[tuple[int, WorkerSpec], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers={self.workers!r} must be an integer >= 1")
        if self.arch not in ARCHS:
            raise ConfigError(f"arch={self.arch!r} is unknown: expected one of {', '.join(ARCHS)}")
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"topology={self.topology!r} is unknown: expected one of {', '.join(TOPOLOGIES)}")
        if self.collective not in COLLECTIVES:
            raise ConfigError(f"collective={self.collective!r} is unknown: expected one of {', '.join(COLLECTIVES)}")
        if self.assignment not in ASSIGNMENTS:
            raise ConfigError(f"assignment={self.assignment!r} is unknown: expected one of {', '.join(ASSIGNMENTS)}")
        if self.asynchronous and self.arch != "ps":
            raise ConfigError(f"asynchronous training needs a parameter server (arch='ps'), not arch={self.arch!r}")
        if self.servers is not None and (not isinstance(self.servers, int) or self.servers < 1):
            raise ConfigError(f"servers={self.servers!r} must be an integer >= 1")
        for name in ("bandwidth", "server_bandwidth"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name}={value!r} must be a positive number of bytes/s")
        for name in ("overhead", "latency", "cycle_time"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"{name}={value!r} must be a finite number of seconds >= 0")
        for name in ("fusion_threshold", "bucket_bytes", "vanilla_bucket_bytes"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0 bytes")
        if not isinstance(self.bigarray_bound, int) or self.bigarray_bound < 1:
            raise ConfigError(f"bigarray_bound={self.bigarray_bound!r} must be an integer >= 1 (elements)")
        seen = set()
        for rank, spec in self.worker_specs:
            if not (isinstance(rank, int) and 0 <= rank < self.workers):
                raise ConfigError(f"worker spec for rank {rank!r}: ranks are 0..{self.workers - 1}")
            if rank in seen:
                raise ConfigError(f"worker spec for rank {rank} is given twice")
            if not isinstance(spec, WorkerSpec):
                raise ConfigError(f"worker spec for rank {rank} must be a WorkerSpec, got {spec!r}")
            seen.add(rank)

    @property
    def num_servers(self) -> int:
        """Servers actually simulated (PS)."""
        return self.servers if self.servers is not None else self.workers

    @property
    def server_capacity(self) -> float:
        return self.server_bandwidth if self.server_bandwidth is not None else self.bandwidth

    def worker_classes(self) -> list[tuple[WorkerSpec, list[int]]]:
        """Groups of identical workers, rank 0's group first (rank 0 leads the scheduling).

        Identical workers do identical things at identical times, so each group is simulated
        once and counts as many flows on shared links as it has members; with
        :attr:`asynchronous` every worker is a group of its own.
        """
        specs = dict(self.worker_specs)
        default = WorkerSpec()
        if self.asynchronous:  # workers drift apart: none does what another does at the same time
            return [(specs.get(rank, default), [rank]) for rank in range(self.workers)]
        groups: dict[WorkerSpec, list[int]] = {}
        for rank in range(self.workers):
            groups.setdefault(specs.get(rank, default), []).append(rank)
        return sorted(groups.items(), key=lambda item: item[1][0])

    def bandwidth_of(self, spec: WorkerSpec) -> float:
        return spec.bandwidth if spec.bandwidth is not None else self.bandwidth

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (units: bytes, seconds, bytes/s)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "worker_specs":
                value = {str(rank): {"compute": s.compute, "bandwidth": s.bandwidth} for rank, s in value}
            out[f.name] = value
        out["servers"] = self.num_servers if self.arch == "ps" else None
        return out


def parse_worker_spec(text: str) -> tuple[int, WorkerSpec]:
    """``RANK:compute=1.5,bandwidth=5Gbps`` -> (rank, WorkerSpec)."""
    rank_text, sep, rest = text.partition(":")
    if not sep or not rank_text.strip().isdigit() or not rest.strip():
        raise ConfigError(f"worker spec {text!r}: expected RANK:compute=FACTOR,bandwidth=RATE "
                          f"(e.g. 3:compute=1.5 or 0:bandwidth=5Gbps)")
    values: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("compute", "bandwidth"):
            raise ConfigError(f"worker spec {text!r}: {item!r} is not compute=FACTOR or bandwidth=RATE")
        if key == "compute":
            try:
                values[key] = float(value)
            except ValueError:
                raise ConfigError(f"worker spec {text!r}: compute={value!r} is not a number") from None
        else:
            values[key] = parse_bandwidth(value, name=f"worker {rank_text} bandwidth")
    return int(rank_text), WorkerSpec(**values)

