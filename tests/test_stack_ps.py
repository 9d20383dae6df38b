"""The MXNet parameter-server part of the stack, and the launcher that runs it (bytesched.launch).

Real ps-lite scheduler, server and worker processes on 127.0.0.1; no mocks.
"""

from __future__ import annotations

import io
import re
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from bytesched.launch import EXIT_TIMEOUT, LaunchError, build_parser, launch_ps, ports, run
from conftest import SCRIPTS, require, run_job, started

SLEEPER = SCRIPTS / "ps_sleeper_worker.py"
LAUNCH = [sys.executable, "-m", "bytesched.launch"]


def grandchildren(output: str) -> list[int]:
    """Pids of the helper processes the sleeper workers report having forked."""
    return [int(pid) for pid in re.findall(r"grandchild=(\d+)", output)]


def assert_dead(pids: list[int]) -> None:
    """Each pid is gone or a zombie waiting for init: stopping reached the process group."""
    for pid in pids:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"grandchild {pid} still {status}"


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_dist_sync_two_servers_two_workers_exact_aggregate() -> None:
    """Worker-specific pushes of small and server-sharded keys pull back as exact sums."""
    require("mxnet")
    out, err = io.StringIO(), io.StringIO()

    status = launch_ps([sys.executable, str(SCRIPTS / "ps_kvstore_worker.py")],
                       num_workers=2, num_servers=2, timeout=75, stdout=out, stderr=err)

    output = out.getvalue()
    assert status == 0, output + err.getvalue()
    ok = re.findall(r"^\[worker (\d)\] KVSTORE OK rank=(\d) launcher_rank=(\d)", output, re.M)
    assert sorted(w for w, _, _ in ok) == ["0", "1"], output
    assert sorted(r for _, r, _ in ok) == ["0", "1"], "KVStore ranks must be distinct"
    assert all(w == lr for w, _, lr in ok), "BYTESCHED_RANK must match the worker index"
    assert "FAIL" not in output


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_worker_crash_stops_the_whole_job_quickly() -> None:
    """Worker 1 exits 3 while worker 0 blocks in the KVStore (and ignores SIGTERM): the CLI
    returns 3 within seconds and nothing is left running, grandchildren included."""
    require("mxnet")
    began = time.monotonic()

    result = run_job(
        [*LAUNCH, "--servers", "2", "--workers", "2", "--kill-grace", "2", "--timeout", "45",
         "--", sys.executable, SLEEPER, "--crash-rank", "1", "--kvstore",
         "--ignore-sigterm-rank", "0"],
        timeout=50,
    )

    elapsed = time.monotonic() - began
    assert result.returncode == 3, result.stdout
    assert "[worker 1] crashing with exit code 3" in result.stdout
    assert "[launch] worker 1 exited with code 3; stopping the job" in result.stdout
    assert "sending SIGKILL: worker 0" in result.stdout  # worker 0 ignored SIGTERM
    assert "FAIL" not in result.stdout
    assert elapsed < 15, f"took {elapsed:.1f} s to stop after a crash"
    assert len(grandchildren(result.stdout)) == 2, result.stdout
    assert_dead(grandchildren(result.stdout))


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_timeout_kills_everything() -> None:
    """Workers that never finish (one ignoring SIGTERM) are killed when the timeout passes."""
    out, err = io.StringIO(), io.StringIO()
    began = time.monotonic()

    status = launch_ps([sys.executable, str(SLEEPER), "--ignore-sigterm-rank", "1"],
                       num_workers=2, num_servers=1, timeout=3, kill_grace=1,
                       stdout=out, stderr=err)

    elapsed = time.monotonic() - began
    assert status == EXIT_TIMEOUT
    assert "timeout: the job did not finish within 3 s" in err.getvalue()
    assert 3 <= elapsed < 3 + 1 + 6, f"elapsed {elapsed:.1f} s"
    assert len(grandchildren(out.getvalue())) == 2, out.getvalue()
    assert_dead(grandchildren(out.getvalue()))


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_ctrl_c_to_the_launcher_stops_everything() -> None:
    """SIGINT to the CLI (what Ctrl-C sends) stops every process and exits 128+SIGINT."""
    argv = [*LAUNCH, "--servers", "1", "--workers", "2", "--",
            sys.executable, SLEEPER]
    with started(argv) as launcher:
        assert launcher.stdout is not None
        seen = []
        for line in launcher.stdout:  # pytest-timeout ends this if the workers never start
            seen.append(line)
            if sum("ready rank=" in ln for ln in seen) == 2:
                break
        launcher.send_signal(signal.SIGINT)
        rest, _ = launcher.communicate(timeout=20)
    output = "".join(seen) + rest

    assert launcher.returncode == 128 + signal.SIGINT, output
    assert "[launch] received SIGINT; stopping the job" in output
    assert_dead(grandchildren(output))


@pytest.mark.multiproc
@pytest.mark.timeout(60)
def test_failing_server_stops_the_workers() -> None:
    """A scheduler/server process that fails (here: its interpreter is /bin/false) fails the job
    and stops the workers, which would otherwise wait forever."""
    out, err = io.StringIO(), io.StringIO()

    status = launch_ps([sys.executable, str(SLEEPER)], num_workers=2, num_servers=1,
                       python="/bin/false", timeout=30, kill_grace=1, stdout=out, stderr=err)

    assert status == 1, err.getvalue()
    assert re.search(r"(scheduler|server 0) exited with code 1; stopping the job", err.getvalue())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 0}, "number of workers must be an integer >= 1"),
        ({"num_servers": 0}, "number of servers must be an integer >= 1"),
        ({"command": []}, "no worker command"),
        ({"timeout": 0}, "timeout must be a positive"),
        ({"port": 70000}, "port must be in 1..65535"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts(kwargs: dict, message: str) -> None:
    args = {"command": ["true"], "num_workers": 1, "num_servers": 1, **kwargs}
    before = psutil.Process().children(recursive=True)
    with pytest.raises(LaunchError, match=message):
        launch_ps(**args)
    assert psutil.Process().children(recursive=True) == before


def test_cli_reports_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(build_parser().parse_args(["--workers", "0", "--", "true"])) == 2
    assert "number of workers must be an integer >= 1" in capsys.readouterr().err
    assert run(build_parser().parse_args(["--workers", "1"])) == 2
    assert "no worker command" in capsys.readouterr().err


def test_free_port_draws_from_below_the_kernels_ephemeral_range() -> None:
    """The ports the kernel hands to bind(0) and outgoing connections cannot take the one chosen."""
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert ports._EXPLICIT_PORT_FLOOR <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port_falls_back_to_the_kernel_when_no_range_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under 1,000 ports below the ephemeral range: the kernel's pick, a free port of its own
    range, rather than a draw among the ten explicit ports left."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    if low <= ports._EXPLICIT_PORT_FLOOR + 10:
        pytest.skip(f"the kernel's ephemeral range starts at {low}, where the ten explicit ports lie")
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._EXPLICIT_PORT_FLOOR + 10)
    port = ports.free_port()
    assert low <= port <= high, (port, low, high)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
