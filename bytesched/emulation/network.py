"""A slower network on one machine: Linux network namespaces whose links are shaped by ``tc``.

On an unshaped loopback, communication is almost free and no scheduler can help; benchmarks and
the demo therefore run their ranks inside a namespace whose loopback is limited by a token-bucket
filter (``tc qdisc ... tbf``, the one shaping discipline besides ``htb`` that every kernel here
has). All ranks share that one loopback, in both directions, like hosts on one hub.

Only namespaces this module created are touched, and each is deleted when its context exits,
also on an exception, Ctrl-C (SIGINT) or SIGTERM/SIGHUP (turned into ``SystemExit`` while the
context is active, so ``finally`` blocks run). Shaping needs root and the ``ip`` and ``tc``
tools; :func:`unavailable_reason` says why it cannot be done instead of failing halfway.

Example::

    with shaped_loopback(parse_rate("1gbit")) as ns:
        subprocess.run([*ns.exec_prefix(), "horovodrun", "-np", "2", "-H", "localhost:2", ...])
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any, Iterator, Sequence

_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]?)(bit|bps)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_names = itertools.count()


class ShapingUnavailable(RuntimeError):
    """This machine (or user) cannot create shaped namespaces; the message says why."""


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


def _run(argv: Sequence[str]) -> None:
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
        _run([*self.exec_prefix(), *argv])

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
def namespace(prefix: str = "bytesched") -> Iterator[Namespace]:
    """A new network namespace with its loopback up; deleted on exit, whatever happens."""
    reason = unavailable_reason()
    if reason is not None:
        raise ShapingUnavailable(reason)
    name = f"{prefix}-{os.getpid()}-{next(_names)}"
    with _signals_exit():
        _run(["ip", "netns", "add", name])
        try:
            ns = Namespace(name)
            ns.run(["ip", "link", "set", "lo", "up"])
            yield ns
        finally:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def tbf_burst(bits_per_second: int) -> int:
    """Bucket size in bytes: 2 ms at full rate, and never below 256 KiB, because the loopback's
    64 KiB packets must fit in the bucket (tbf drops larger ones)."""
    return max(256 * 1024, bits_per_second // 8 // 500)


@contextlib.contextmanager
def shaped_loopback(bits_per_second: int, latency_ms: int = 100) -> Iterator[Namespace]:
    """A new namespace whose loopback carries at most ``bits_per_second`` (both directions and
    every rank together); ``latency_ms`` bounds how long a packet may queue (tbf's limit)."""
    with namespace() as ns:
        ns.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{bits_per_second}bit",
                "burst", str(tbf_burst(bits_per_second)), "latency", f"{latency_ms}ms"])
        yield ns
