"""benchmarks.emulation (used by the PyTorch demo): shaped loopbacks in network namespaces that
really limit bandwidth and are always deleted. Needs root with ``ip`` and ``tc``, as the demo."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from benchmarks.emulation import ShapingUnavailable, format_rate, parse_rate, shaped_loopback
from conftest import require_shaping, started

# Sends 20 MB over a TCP connection on 127.0.0.1 and prints the rate in bit/s.
THROUGHPUT = textwrap.dedent("""
    import socket, threading, time
    N = 20_000_000
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
    def sink():
        conn, _ = server.accept(); got = 0
        while got < N:
            got += len(conn.recv(1 << 20))
    thread = threading.Thread(target=sink); thread.start()
    client = socket.create_connection(server.getsockname()); chunk = b"x" * (1 << 20)
    start = time.monotonic()
    for _ in range(N // len(chunk)): client.sendall(chunk)
    client.sendall(b"x" * (N % len(chunk))); thread.join()
    print(N * 8 / (time.monotonic() - start))
""")


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_parse_and_format_rates() -> None:
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("500mbit") == 500 * 10**6
    assert parse_rate("2.5g") == 2_500_000_000
    assert parse_rate("800000000") == 800_000_000
    assert format_rate(2.5e9) == "2.5 Gbit/s"
    for bad in ("fast", "1 gbyte", "0", "10tbit"):
        with pytest.raises(ValueError, match="rate"):
            parse_rate(bad)


@pytest.mark.parametrize("rate", ["200mbit", "1gbit"])
def test_shaped_loopback_limits_bandwidth_and_is_deleted(rate: str) -> None:
    require_shaping()
    with shaped_loopback(parse_rate(rate)) as ns:
        assert ns.name in namespaces()
        result = subprocess.run([*ns.exec_prefix(), sys.executable, "-c", THROUGHPUT],
                                capture_output=True, text=True, timeout=30)
    measured = float(result.stdout)
    assert 0.75 * parse_rate(rate) < measured < 1.1 * parse_rate(rate), f"{format_rate(measured)} for {rate}"
    assert ns.name not in namespaces()


def test_namespace_is_deleted_when_the_body_fails() -> None:
    require_shaping()
    with pytest.raises(KeyError):
        with shaped_loopback(parse_rate("1gbit")) as ns:
            raise KeyError("boom")
    assert ns.name not in namespaces()


@pytest.mark.multiproc
@pytest.mark.timeout(30)
def test_namespace_is_deleted_on_sigterm() -> None:
    require_shaping()
    holder = textwrap.dedent("""
        import time
        from benchmarks.emulation import parse_rate, shaped_loopback
        with shaped_loopback(parse_rate("1gbit")) as ns:
            print(ns.name, flush=True)
            time.sleep(60)
    """)
    with started([sys.executable, "-c", holder]) as process:
        assert process.stdout is not None
        name = process.stdout.readline().strip()
        assert name and name in namespaces()
        process.terminate()
        assert process.wait(timeout=10) == 128 + 15
    assert name not in namespaces()


def test_unavailable_shaping_is_an_error_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(ShapingUnavailable, match="needs root"):
        with shaped_loopback(parse_rate("1gbit")):
            pass
