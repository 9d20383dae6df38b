"""The two emulated networks a cluster can run on, as lists of :class:`Host`.

``veth`` (:func:`switched_hosts`) models real NICs: every host is a namespace of its own with one
interface, ``eth0``, joined by a veth pair to a Linux bridge in a switch namespace. Each
direction is shaped separately (full duplex): the host's ``eth0`` egress is its upload, the
switch port's egress towards the host is its download. A transfer from host A to host B is
limited by A's upload and B's download, and B can send to A at the full rate at the same time.

``loopback`` (:func:`loopback_hosts`) is the quick mode: every host is the same namespace and
address, and everything crosses the one shaped loopback, both directions together (one shared
medium).

Addresses are ``10.213.0.<index + 1>/24``. They exist only inside this cluster's namespaces,
which have no route to anything else, so clusters running at the same time cannot collide.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from typing import Iterator

from .network import Namespace, namespace, run_tool, shape, shaped_loopback

#: The hosts' subnet; host ``i`` is ``SUBNET.(i + 1)``.
SUBNET = "10.213.0"
#: Nearly veth's largest MTU (65535), like the loopback's: per-packet costs (bridge, tbf, TCP)
#: are what limits a stream on this CPU, and 64 KiB frames reached 5-6.7 Gbit/s one way where
#: 9000-byte frames reached 2.2-3 (shaped to 10 Gbit/s; docs/benchmarks.md, "Emulated network").
MTU = 65000
#: How long a packet may wait in a shaped queue (tbf's ``latency``). Short, like a real NIC's or
#: switch port's buffer: with a long queue a host's ACKs wait behind its own upload, and with
#: both directions busy at 200 Mbit/s the slowest stream of 4 runs got 0.60 of the rate with
#: 100 ms, 0.71 with 20 ms and 0.93 with 5 ms, while 2 ms fell to 0.56 at 1 Gbit/s (drops).
#: One noisy run each on a loaded machine: 10 ms is a middle, not an optimum.
QUEUE_MS = 10
HOST_INTERFACE = "eth0"
_BRIDGE = "br0"
#: Hosts per /24 (addresses .1 to .254).
MAX_HOSTS = 254


@dataclass(frozen=True)
class Host:
    """One emulated machine: where its processes run and the address they bind.

    ``interface`` is the device that carries its traffic to other hosts (Horovod's
    ``HOROVOD_GLOO_IFACE``, Gloo's ``GLOO_SOCKET_IFNAME``).
    """

    index: int
    namespace: Namespace
    address: str
    interface: str = HOST_INTERFACE

    @property
    def name(self) -> str:
        """``host<index>``: resolvable on every host of the cluster (HOROVOD_HOSTNAME)."""
        return f"host{self.index}"


def _name_hosts(hosts: list[Host]) -> None:
    """In each host's namespace, ``host<i>`` resolves to host i and the machine's own name to
    that host itself, as on a real cluster (see :meth:`.network.Namespace.set_hosts`)."""
    everyone = {host.name: host.address for host in hosts}
    for host in hosts:
        host.namespace.set_hosts({**everyone, socket.gethostname(): host.address})


def _check_hosts(hosts: int) -> None:
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(f"hosts must be an integer in 1..{MAX_HOSTS}, got {hosts!r}")


@contextlib.contextmanager
def switched_hosts(hosts: int, bits_per_second: int) -> Iterator[list[Host]]:
    """``hosts`` namespaces, each with a veth link to one switch shaped to ``bits_per_second``
    per direction; every namespace (and so every link) is deleted on exit."""
    _check_hosts(hosts)
    with contextlib.ExitStack() as stack:
        switch = stack.enter_context(namespace("sw"))
        switch.run(["ip", "link", "add", _BRIDGE, "type", "bridge"])
        switch.run(["ip", "link", "set", _BRIDGE, "up"])
        built = []
        for index in range(hosts):
            ns = stack.enter_context(namespace(f"h{index}"))
            port = f"p{index}"
            # Both ends are created directly in their namespaces: nothing appears in the
            # machine's own namespace, and every cluster can use the same short names.
            run_tool(["ip", "link", "add", HOST_INTERFACE, "netns", ns.name, "type", "veth",
                      "peer", "name", port, "netns", switch.name])
            switch.run(["ip", "link", "set", port, "mtu", str(MTU), "master", _BRIDGE, "up"])
            address = f"{SUBNET}.{index + 1}"
            ns.run(["ip", "link", "set", HOST_INTERFACE, "mtu", str(MTU), "up"])
            ns.run(["ip", "addr", "add", f"{address}/24", "dev", HOST_INTERFACE])
            shape(ns, HOST_INTERFACE, bits_per_second, QUEUE_MS)  # upload
            shape(switch, port, bits_per_second, QUEUE_MS)  # download
            built.append(Host(index, ns, address))
        _name_hosts(built)
        yield built


@contextlib.contextmanager
def loopback_hosts(hosts: int, bits_per_second: int) -> Iterator[list[Host]]:
    """``hosts`` hosts that are all one namespace whose loopback is shaped to
    ``bits_per_second`` for everything together (:func:`.network.shaped_loopback`)."""
    _check_hosts(hosts)
    with shaped_loopback(bits_per_second) as ns:
        built = [Host(index, ns, "127.0.0.1", "lo") for index in range(hosts)]
        _name_hosts(built)
        yield built
