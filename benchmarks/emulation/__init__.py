"""Emulated networks for benchmarks and the demo: shaped links inside Linux network namespaces,
and an emulated cluster (hosts on such a network) that launches Horovod, torch.distributed and
MXNet parameter-server jobs across them."""

from .cluster import Cluster, emulated_cluster, simulator_topology
from .job import Job
from .network import (Namespace, ShapingUnavailable, cleanup_stale, format_rate, namespace, parse_rate,
                      shaped_loopback, unavailable_reason)
from .topology import Host

__all__ = ["Cluster", "Host", "Job", "Namespace", "ShapingUnavailable", "cleanup_stale", "emulated_cluster",
           "format_rate", "namespace", "parse_rate", "shaped_loopback", "simulator_topology",
           "unavailable_reason"]
