"""A slower network on one machine: Linux network namespaces whose links are shaped by ``tc``.

On an unshaped loopback, communication is almost free and no scheduler can help; benchmarks and
the demo therefore run their ranks inside namespaces whose links are limited by a token-bucket
filter (``tc qdisc ... tbf``, the one shaping discipline besides ``htb`` that every kernel here
has). This module holds the primitives: a namespace, shaping one device, and the simplest
emulated network, :func:`shaped_loopback`, where all ranks share one loopback in both
directions, like hosts on one hub (the per-host topology is in :mod:`.topology`).

Only namespaces this module created are touched, and each is deleted when its context exits,
also on an exception, Ctrl-C (SIGINT) or SIGTERM/SIGHUP (turned into ``SystemExit`` while the
context is active, so ``finally`` blocks run). Their names start with :data:`PREFIX` and the
creating process's pid, so :func:`cleanup_stale` can delete what a killed run (SIGKILL, power
loss) left. Shaping needs root and the ``ip`` and ``tc`` tools; :func:`unavailable_reason` says
why it cannot be done instead of failing halfway.

Example::

    with shaped_loopback(parse_rate("1gbit")) as ns:
        subprocess.run([*ns.exec_prefix(), "horovodrun", "-np", "2", "-H", "localhost:2", ...])
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]?)(bit|bps)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_names = itertools.count()
_T = TypeVar("_T")

#: Every namespace this package creates is named ``PREFIX-<creating pid>-<n>[-<role>]``.
PREFIX = "bytesched"
_STALE_RE = re.compile(rf"^{PREFIX}-(\d+)-\d+(?:-[a-z0-9]+)?$")
_NETNS_DIR = "/var/run/netns"
# `ip netns exec NAME` bind-mounts the files in /etc/netns/NAME/ over /etc/ for what it runs.
_NETNS_ETC = "/etc/netns"
_CLONE_NEWNET = 0x40000000


class ShapingUnavailable(RuntimeError):
    """The host (or user) cannot create shaped namespaces; the message says why."""


def parse_rate(text: str) -> int:
    """Bits per second from ``"1gbit"``, ``"500mbit"``, ``"2.5g"`` or ``"800000000"``."""
    match = _RATE_RE.match(text)
    if match is None:
        raise ValueError(f"rate {text!r} is not a bandwidth: expected e.g. 1gbit, 500mbit, 2.5g or bits/s")
    value = float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]
    if not 1e5 <= value <= 1e12:
        raise ValueError(f"rate {text!r} is outside 100kbit..1000gbit")
    return int(value)


def format_rate(bits_per_second: float) -> str:
    """``2.5 Gbit/s``-style text for reports."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:g} {unit}"
    return f"{bits_per_second:g} bit/s"


def unavailable_reason() -> str | None:
    """Why shaping cannot work here (not root, no ``ip``/``tc``), or None if it should."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (run as root, or without shaping)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (install iproute2)"
    return None


def run_tool(argv: Sequence[str]) -> None:
    """Run an ``ip``/``tc`` command; ShapingUnavailable with its message if it fails."""
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if result.returncode != 0:
        raise ShapingUnavailable(f"`{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()}")


class Namespace:
    """A network namespace this process created (and will delete)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def exec_prefix(self) -> list[str]:
        """Prepend to a command line to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def run(self, argv: Sequence[str]) -> None:
        """Run a set-up command inside the namespace; ShapingUnavailable if it fails."""
        run_tool([*self.exec_prefix(), *argv])

    def set_hosts(self, addresses: Mapping[str, str]) -> None:
        """Make host names resolve to ``addresses`` (name -> address) for everything run through
        :meth:`exec_prefix`, via ``/etc/netns/<name>/hosts``; ``localhost`` stays 127.0.0.1.

        All namespaces share the machine's host name; without this it resolves to an address
        that other emulated hosts cannot reach, and libraries that advertise the address of
        ``gethostname()`` (Gloo in Horovod's process sets) would tell their peers that.
        """
        lines = ["127.0.0.1 localhost", *(f"{address} {name}" for name, address in addresses.items())]
        directory = os.path.join(_NETNS_ETC, self.name)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hosts"), "w") as hosts:
            hosts.write("\n".join(lines) + "\n")

    def call(self, function: Callable[[], _T]) -> _T:
        """``function()`` run inside the namespace, in a helper thread, and its result.

        Sockets belong to the namespace they were created in, so a socket made here can be
        served from any thread of this process afterwards (e.g. a rendezvous server that ranks
        in the namespace must reach) without a child process. Only the helper thread switches
        namespace (``setns`` acts on the calling thread); it ends right after.
        """
        outcome: dict[str, Any] = {}

        def enter_and_call() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(os.path.join(_NETNS_DIR, self.name), os.O_RDONLY)
                try:
                    if libc.setns(fd, _CLONE_NEWNET) != 0:
                        errno = ctypes.get_errno()
                        raise OSError(errno, f"setns into namespace {self.name}: {os.strerror(errno)}")
                finally:
                    os.close(fd)
                outcome["value"] = function()
            except BaseException as error:  # handed to the caller's thread
                outcome["error"] = error

        helper = threading.Thread(target=enter_and_call, name=f"netns-{self.name}")
        helper.start()
        helper.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def free_port(self, address: str) -> int:
        """A TCP port free on ``address`` inside this namespace right now (the usual small race
        until the user binds it; the namespace is private to the job, so little can take it)."""
        def pick() -> int:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))
                return int(sock.getsockname()[1])
        return self.call(pick)

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"


@contextlib.contextmanager
def _signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (so cleanup runs) while active, in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, leave) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def namespace(role: str = "") -> Iterator[Namespace]:
    """A new network namespace with its loopback up; deleted on exit, whatever happens.

    ``role`` (lower-case letters and digits, e.g. ``h0`` or ``sw``) is appended to the name so
    that ``ip netns list`` shows what each one is for.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise ShapingUnavailable(reason)
    if role and not role.isalnum():
        raise ValueError(f"namespace role {role!r} must be letters and digits only")
    name = f"{PREFIX}-{os.getpid()}-{next(_names)}" + (f"-{role.lower()}" if role else "")
    with _signals_exit():
        run_tool(["ip", "netns", "add", name])
        try:
            ns = Namespace(name)
            ns.run(["ip", "link", "set", "lo", "up"])
            yield ns
        finally:
            _delete(name)


def _delete(name: str) -> bool:
    """Delete namespace ``name`` and its /etc/netns files; True if the namespace existed."""
    shutil.rmtree(os.path.join(_NETNS_ETC, name), ignore_errors=True)
    return subprocess.run(["ip", "netns", "delete", name], capture_output=True).returncode == 0


def cleanup_stale() -> list[str]:
    """Delete the namespaces that earlier runs killed before their cleanup left behind.

    Only names of this package (``PREFIX-<pid>-...``) whose creating process no longer exists
    are deleted; namespaces of live runs, including other users of this module running right
    now, are left alone. Deleting a namespace also removes the veth ends and bridge in it, and
    its ``/etc/netns`` files go with it. Returns the deleted namespaces' names.
    """
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split(" ", 1)[0] for line in listing.splitlines()}
    if os.path.isdir(_NETNS_ETC):
        names.update(os.listdir(_NETNS_ETC))  # files of a namespace that is already gone
    deleted = []
    for name in sorted(names):
        match = _STALE_RE.match(name)
        if match is not None and not _pid_alive(int(match.group(1))) and _delete(name):
            deleted.append(name)
    return deleted


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tbf_burst(bits_per_second: int) -> int:
    """Bucket size in bytes: 2 ms at full rate, and never below 256 KiB, because the loopback's
    64 KiB packets must fit in the bucket (tbf drops larger ones)."""
    return max(256 * 1024, bits_per_second // 8 // 500)


def shape(ns: Namespace, device: str, bits_per_second: int, latency_ms: int = 100) -> None:
    """Limit what ``device`` in ``ns`` sends (its egress) to ``bits_per_second``; ``latency_ms``
    bounds how long a packet may queue (tbf's limit)."""
    ns.run(["tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{bits_per_second}bit",
            "burst", str(tbf_burst(bits_per_second)), "latency", f"{latency_ms}ms"])


@contextlib.contextmanager
def shaped_loopback(bits_per_second: int, latency_ms: int = 100) -> Iterator[Namespace]:
    """A new namespace whose loopback carries at most ``bits_per_second`` (both directions and
    every rank together); ``latency_ms`` bounds how long a packet may queue (tbf's limit)."""
    with namespace("lo") as ns:
        shape(ns, "lo", bits_per_second, latency_ms)
        yield ns
