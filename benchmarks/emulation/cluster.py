"""An emulated cluster on one machine: hosts with shaped network links, and jobs placed on them.

The benchmark harness runs every framework on the same emulated cluster::

    with emulated_cluster(2, parse_rate("1gbit")) as cluster:
        job = cluster.launch_horovod([sys.executable, "train.py"], env={"BYTESCHED_POLICY": "p3"}, ranks=2)
        status = job.wait(timeout=300)
        print(cluster.describe(), status, *job.output, sep="\\n")

Rank ``r`` runs on host ``r % len(hosts)``, inside that host's namespace (``ip netns exec``),
so it can only talk to other hosts over the shaped links. Each launcher sets the variables the
framework needs to find its peers across namespaces (Horovod's Gloo rendezvous,
torch.distributed's master, ps-lite's scheduler), plus, for bytesched, the rank-0 channel's
address (``BYTESCHED_CHANNEL_HOST``/``PORT``: rank 0's host) and a job token of its own.
A launcher's ``env`` is added to this process's environment; the variables the launcher sets
win over both. Output goes to ``Job.output`` (each line prefixed with ``[rank 1]`` etc.).

Horovod is started without ``horovodrun`` (which would need ssh to reach other hosts): this
process serves Horovod's HTTP rendezvous itself, from a socket opened inside host 0's
namespace, and gives every rank the environment ``horovodrun --gloo`` would (see horovod's
runner/gloo_run.py). Every host's namespace resolves the machine's host name to that host's own
address, as on a real cluster: Horovod 0.28.1 builds the Gloo device of its process sets
without ``HOROVOD_GLOO_IFACE`` and advertises the address of ``gethostname()`` instead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from bytesched.launch.ps import ps_env
from .job import Job
from .network import ShapingUnavailable, cleanup_stale, format_rate, unavailable_reason
from .topology import Host, loopback_hosts, switched_hosts

TOPOLOGIES = ("veth", "loopback")
# The scheduler and servers of a ps-lite job run no user code: importing mxnet serves.
_SERVE = "import mxnet"
_jobs = itertools.count()


@dataclass(frozen=True)
class Placement:
    """Where one rank runs (see :meth:`Cluster.place`)."""

    rank: int
    host: Host
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


@dataclass
class Cluster:
    """Hosts of one emulated network and the jobs launched on them (see the module docstring)."""

    topology: str
    hosts: list[Host]
    bits_per_second: int
    jobs: list[Job] = field(default_factory=list)

    def describe(self) -> str:
        """One line for reports saying what the network was."""
        rate = format_rate(self.bits_per_second)
        count = f"{len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''}"
        if self.topology == "veth":
            return f"{count}, veth pairs shaped to {rate} per direction (tc tbf)"
        return f"{count} on one loopback shaped to {rate} for all traffic together (tc tbf)"

    def host_of(self, rank: int) -> Host:
        """Where rank (or worker, or server) ``rank`` runs: ranks go round-robin over hosts."""
        return self.hosts[rank % len(self.hosts)]

    def place(self, rank: int, size: int) -> Placement:
        """Rank ``rank`` of ``size``: its host, and its place among the ranks on that host
        (local) and among the ranks with its local rank on other hosts (cross), as Horovod
        numbers them."""
        count = len(self.hosts)
        host, local_rank = self.host_of(rank), rank // count
        return Placement(rank, host, local_rank=local_rank, local_size=len(range(host.index, size, count)),
                         cross_rank=host.index, cross_size=min(count, size - local_rank * count))

    # ------------------------------------------------------------------ launchers

    def launch_horovod(self, argv: Sequence[str], *, env: Mapping[str, str], ranks: int) -> Job:
        """``ranks`` copies of ``argv`` joined by Horovod over Gloo (CPU operations too)."""
        from horovod.runner.common.util.hosts import SlotInfo

        _check_count("ranks", ranks)
        placements = [self.place(rank, ranks) for rank in range(ranks)]
        slots = [SlotInfo(hostname=p.host.name, rank=p.rank, size=ranks, local_rank=p.local_rank,
                          local_size=p.local_size, cross_rank=p.cross_rank, cross_size=p.cross_size)
                 for p in placements]
        root = self.hosts[0]
        port, stop_rendezvous = _serve_horovod_rendezvous(root, slots)
        job = self._job("horovod", stop_rendezvous)
        common = self._common_env(env)
        common.update({"HOROVOD_GLOO_RENDEZVOUS_ADDR": root.address, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                       "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"})
        with _stopped_on_error(job):
            for p in placements:
                rank_env = {**common, "HOROVOD_GLOO_IFACE": p.host.interface, "NCCL_SOCKET_IFNAME": p.host.interface,
                            "HOROVOD_HOSTNAME": p.host.name, "HOROVOD_RANK": str(p.rank), "HOROVOD_SIZE": str(ranks),
                            "HOROVOD_LOCAL_RANK": str(p.local_rank), "HOROVOD_LOCAL_SIZE": str(p.local_size),
                            "HOROVOD_CROSS_RANK": str(p.cross_rank), "HOROVOD_CROSS_SIZE": str(p.cross_size),
                            **_bytesched_rank(p.rank, ranks)}
                job.start(f"rank {p.rank}", [*p.host.namespace.exec_prefix(), *argv], rank_env)
        return job

    def launch_torch_distributed(self, argv: Sequence[str], *, env: Mapping[str, str], ranks: int) -> Job:
        """``ranks`` copies of ``argv`` that ``torch.distributed.init_process_group("gloo")``
        joins through the default ``env://`` rendezvous (master on host 0)."""
        _check_count("ranks", ranks)
        root = self.hosts[0]
        job = self._job("torch")
        common = self._common_env(env)
        common.update({"MASTER_ADDR": root.address, "MASTER_PORT": str(root.namespace.free_port(root.address)),
                       "WORLD_SIZE": str(ranks)})
        with _stopped_on_error(job):
            for p in (self.place(rank, ranks) for rank in range(ranks)):
                rank_env = {**common, "RANK": str(p.rank), "LOCAL_RANK": str(p.local_rank),
                            "LOCAL_WORLD_SIZE": str(p.local_size), "GLOO_SOCKET_IFNAME": p.host.interface,
                            **_bytesched_rank(p.rank, ranks)}
                job.start(f"rank {p.rank}", [*p.host.namespace.exec_prefix(), *argv], rank_env)
        return job

    def launch_ps(self, argv: Sequence[str], *, env: Mapping[str, str], workers: int, servers: int) -> Job:
        """An MXNet parameter-server job: the ps-lite scheduler on host 0, worker ``w`` (running
        ``argv``) on host ``w % hosts`` and server ``s`` on host ``(workers + s) % hosts``.

        With ``workers + servers`` hosts every worker and every server has a NIC of its own,
        which is what the simulator's full-duplex PS model assumes; with as many hosts as
        workers, server ``s`` shares host ``s`` (and its links) with worker ``s``."""
        _check_count("workers", workers)
        _check_count("servers", servers)
        root = self.hosts[0]
        port = root.namespace.free_port(root.address)
        job = self._job("ps")
        common = self._common_env(env)

        def role_env(role: str, host: Host) -> dict[str, str]:
            # As bytesched launch does, but every node advertises its own host's address.
            return {**common, **ps_env(role, host=root.address, port=port, num_workers=workers,
                                       num_servers=servers), "DMLC_NODE_HOST": host.address}

        with _stopped_on_error(job):
            job.start("scheduler", [*root.namespace.exec_prefix(), sys.executable, "-c", _SERVE],
                      role_env("scheduler", root), member=False)
            for rank in range(servers):
                host = self.host_of(workers + rank)
                job.start(f"server {rank}", [*host.namespace.exec_prefix(), sys.executable, "-c", _SERVE],
                          role_env("server", host), member=False)
            for rank in range(workers):
                host = self.host_of(rank)
                job.start(f"worker {rank}", [*host.namespace.exec_prefix(), *argv],
                          {**role_env("worker", host), **_bytesched_rank(rank, workers)})
        return job

    # ------------------------------------------------------------------ shared by the launchers

    def _job(self, kind: str, on_end: Callable[[], None] | None = None) -> Job:
        job = Job(f"{kind}-{next(_jobs)}", on_end)
        self.jobs.append(job)
        return job

    def _common_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """This process's environment, then the caller's ``env``, then what the job needs to
        work across namespaces (which therefore wins): bytesched's rank-0 channel on rank 0's
        host and a token of this job's own, so that jobs never hear each other."""
        root = self.hosts[0]
        merged = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        merged.update({"BYTESCHED_CHANNEL_HOST": root.address,
                       "BYTESCHED_CHANNEL_PORT": str(root.namespace.free_port(root.address)),
                       "BYTESCHED_JOB_TOKEN": secrets.token_hex(16)})
        return merged


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _serve_horovod_rendezvous(host: Host, slots: Sequence[Any]) -> tuple[int, Callable[[], None]]:
    """Serve Horovod's HTTP rendezvous for ``slots`` on ``host`` (inside its namespace, from a
    thread of this process, as horovodrun serves it from its own); returns the port and a
    function that stops it."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = host.namespace.call(lambda: RendezvousHTTPServer((host.address, 0), RendezvousHandler, 0))
    server.init(slots)
    thread = threading.Thread(target=server.serve_forever, name="horovod-rendezvous", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return int(server.server_address[1]), stop


def _bytesched_rank(rank: int, size: int) -> dict[str, str]:
    """The rank variables ``bytesched launch`` gives every process of a job."""
    return {"BYTESCHED_RANK": str(rank), "BYTESCHED_WORLD_SIZE": str(size)}


@contextlib.contextmanager
def _stopped_on_error(job: Job) -> Iterator[None]:
    """Stop the processes already started if starting the rest fails."""
    try:
        yield
    except BaseException:
        job.kill()
        raise


@contextlib.contextmanager
def emulated_cluster(hosts: int, bits_per_second: int, *, topology: str = "veth") -> Iterator[Cluster]:
    """``hosts`` emulated machines on a network shaped to ``bits_per_second``.

    ``topology="veth"``: one namespace per host, each joined to a switch by a veth pair shaped
    per direction (full duplex, like real NICs). ``topology="loopback"``: all hosts share one
    namespace whose loopback is shaped (one medium for every host and both directions).
    Leftovers of killed earlier runs are deleted first; on exit (also on an exception, Ctrl-C
    or SIGTERM) every job still running is stopped and every namespace deleted. Raises
    ShapingUnavailable, saying why, where namespaces cannot be made (not root, no iproute2).
    """
    builders = {"veth": switched_hosts, "loopback": loopback_hosts}
    if topology not in builders:
        raise ValueError(f"topology {topology!r} is unknown: expected one of {', '.join(TOPOLOGIES)}")
    if isinstance(bits_per_second, bool) or not isinstance(bits_per_second, (int, float)) or not bits_per_second >= 1:
        raise ValueError(f"bits_per_second must be a positive number (e.g. parse_rate('1gbit')), "
                         f"got {bits_per_second!r}")
    reason = unavailable_reason()
    if reason is not None:
        raise ShapingUnavailable(reason)
    cleanup_stale()
    rate = int(bits_per_second)
    with builders[topology](hosts, rate) as built:
        cluster = Cluster(topology, built, rate)
        try:
            yield cluster
        finally:
            for job in cluster.jobs:
                job.kill()


def simulator_topology(cluster: Cluster) -> str:
    """The simulator's ``Cluster.topology`` that models ``cluster``'s network: ``full-duplex``
    for veth pairs (a NIC per host, each direction separate), ``shared`` for one loopback."""
    return {"veth": "full-duplex", "loopback": "shared"}[cluster.topology]
