"""Ports a job's processes agree on before any of them listens."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

#: Lowest port :func:`free_port` draws from: above the registered services that commonly listen.
_EXPLICIT_PORT_FLOOR = 20000


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now and that the kernel does not hand out.

    ps-lite's scheduler and the bytesched channel need a fixed port that every other process is
    told in advance, so the port is chosen here and bound later by another process. A port the
    kernel picked (``bind(("", 0))``) lies in its ephemeral range, which every outgoing connection
    and every other ``bind(0)`` of the job (ps-lite's own nodes among them) draws from as well: in
    that gap a server took the scheduler's port and the job failed with "Address already in use".
    Ports below the ephemeral range are never assigned by the kernel, so only another process that
    chooses ports explicitly can take one, and drawing at random among thousands makes that rare.
    """
    low = _ephemeral_low()
    span = range(_EXPLICIT_PORT_FLOOR, low) if low - _EXPLICIT_PORT_FLOOR >= 1000 else range(0)
    rng = random.SystemRandom()
    for _ in range(100 if span else 0):
        port = rng.choice(span)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
