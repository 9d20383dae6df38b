"""Faults in real multi-rank jobs: a rank killed, frozen or stalled mid-iteration, and Ctrl-C.

Every surviving rank must exit non-zero within a bounded time, and say which rank was lost (or
has not started the stalled collective) and which tensor it was waiting for. Two launchers: the
real ``horovodrun`` (which ends a job when a rank exits), and tests/scripts/reliability_launch.py,
which starts the ranks like a batch scheduler and never kills one, so that whatever ends the
survivors is bytesched itself. Two ranks wherever two suffice; three only where a follower must
learn about another follower's loss from rank 0. See docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from bytesched.launch.ports import free_port
from conftest import SCRIPTS, job_processes, require, require_executable, run_job, started

FAULT_TIMEOUT_S = 3
GRACE_S = 10  # bytesched.core.core.EXIT_GRACE_S
TRAIN = [sys.executable, str(SCRIPTS / "reliability_train.py"), "--steps", "12", "--step-sleep", "0.05"]
INTERRUPT_BOUND_S = 20.0
START_BOUND_S = 120.0  # launch to the injected fault, on a heavily loaded 2-core machine
AFTER_FAULT_BOUND_S = FAULT_TIMEOUT_S + GRACE_S + 20.0  # detection + exit grace + slack for load


def fault_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, BYTESCHED_CHANNEL_PORT=str(free_port()),
               BYTESCHED_FAULT_TIMEOUT_S=str(FAULT_TIMEOUT_S), **extra)
    env.pop("BYTESCHED_ORDER", None)
    return env


def launch_until_exits(ranks: int, args: list[str], survivors: set[int], env: dict[str, str],
                       start_s: float = START_BOUND_S, after_fault_s: float = AFTER_FAULT_BOUND_S,
                       ) -> tuple[str, dict[int, tuple[int, float]]]:
    """Run the job under the no-kill launcher until every rank in ``survivors`` exited; then kill
    what is left (a frozen rank). The bound on the survivors' exit runs from the FAULT line (start-up
    on a loaded machine varies too much). Returns the output and {rank: (exit code, seconds after
    the fault)}."""
    require("horovod.torch", "Horovod built with PyTorch")
    argv = [sys.executable, str(SCRIPTS / "reliability_launch.py"), str(ranks), "--", *TRAIN, *args]
    exits: dict[int, tuple[int, float]] = {}
    lines: list[str] = []
    deadline = time.monotonic() + start_s
    fault_at: float | None = None
    with started(argv, env=env) as job:
        assert job.stdout is not None
        fd = job.stdout.fileno()
        buffer = ""
        while not survivors <= exits.keys() and time.monotonic() < deadline:
            if not select.select([fd], [], [], 0.2)[0]:
                continue
            chunk = os.read(fd, 1 << 16).decode(errors="replace")
            if not chunk:  # the launcher exited
                break
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            for line in complete:
                lines.append(line)
                if fault_at is None and "FAULT rank=" in line:
                    fault_at = time.monotonic()
                    deadline = fault_at + after_fault_s
                m = re.match(r"EXIT rank=(\d+) code=(-?\d+)", line)
                if m:
                    since = time.monotonic() - fault_at if fault_at is not None else -1.0
                    exits[int(m.group(1))] = (int(m.group(2)), since)
    output = "\n".join(lines) + buffer
    assert fault_at is not None, f"no fault within {start_s} s of the start:\n{output[-6000:]}"
    assert survivors <= exits.keys(), (f"ranks {sorted(survivors - exits.keys())} still ran {after_fault_s} s "
                                       f"after the fault (a hang):\n{output[-6000:]}")
    return output, exits


def rank_output(output: str, rank: int) -> str:
    return "\n".join(line for line in output.splitlines() if line.startswith(f"[{rank}] "))


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_frozen_rank_is_named_with_the_tensor_and_survivors_exit() -> None:
    """SIGSTOP: the process stays, its sockets stay open, only heartbeats can tell (a hung node).
    No plan: on the Core's path the survivors also name the tensor they wait for."""
    output, exits = launch_until_exits(3, ["--stop-rank", "1"], {0, 2}, env=fault_env(BYTESCHED_PLAN="0"))
    fault = re.search(r"FAULT rank=1 freezing", output)
    assert fault, output[-4000:]
    for rank in (0, 2):
        mine = rank_output(output, rank)
        assert exits[rank][0] != 0, mine[-3000:]
        assert "rank 1 was lost" in mine, mine[-3000:]
        # a tensor name, with "+N" for the other N gradients of its fusion bucket
        assert re.search(rf"rank {rank} was waiting for tensor 'layers\.\d\.(weight|bias)(\+\d+)?' partition 0",
                         mine), mine[-3000:]
        # close() at exit does not wait out its timeout for all-reduces that will never finish
        assert "updates still pending" not in mine, mine[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_stalled_rank_is_named_and_stall_timeout_ends_the_job() -> None:
    """A rank alive but stuck before producing a gradient: rank 0's stall warning names it, and
    BYTESCHED_STALL_TIMEOUT_S ends every rank, the stuck one included (it loses rank 0). No plan:
    the Core's path, whose stall check asks the other ranks which of them has not started."""
    env = fault_env(BYTESCHED_STALL_WARNING_S="2", BYTESCHED_STALL_TIMEOUT_S="5", BYTESCHED_PLAN="0")
    output, exits = launch_until_exits(2, ["--hang-rank", "1"], {0, 1}, env=env)
    leader = rank_output(output, 0)
    assert re.search(r"stall: tensor 'layers\.\d\.(weight|bias)(\+\d+)?' partition 0 of 1 \(started \d+ s ago\) "
                     r"on rank 0 and has not finished: rank\(s\) 1 have not started it", leader), leader[-3000:]
    assert "BYTESCHED_STALL_TIMEOUT_S=5" in leader, leader[-3000:]
    assert exits[0][0] != 0 and exits[1][0] != 0, output[-3000:]
    assert "rank 0 was lost" in rank_output(output, 1), output[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_stalled_rank_while_passing_through_is_warned_about_and_the_stall_timeout_ends_the_job() -> None:
    """The same stall once the plan passes the gradients through to Horovod (no sub-task of the
    Core in flight): rank 0 warns what it waits for, and the stall timeout ends it, then the stuck
    rank, which loses rank 0."""
    env = fault_env(BYTESCHED_STALL_WARNING_S="2", BYTESCHED_STALL_TIMEOUT_S="5")
    output, exits = launch_until_exits(2, ["--hang-rank", "1", "--pass-through"], {0, 1}, env=env)
    leader = rank_output(output, 0)
    assert "passing through" in leader, leader[-3000:]
    assert re.search(r"stall: rank 0 has waited \d+ s for step \d+'s gradients, passing through to Horovod's "
                     r"all-reduce", leader), leader[-3000:]
    assert "BYTESCHED_STALL_TIMEOUT_S=5" in leader, leader[-3000:]
    assert exits[0][0] != 0 and exits[1][0] != 0, output[-3000:]
    assert "rank 0 was lost" in rank_output(output, 1), output[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_killed_rank_survivors_exit_nonzero_without_launcher_help() -> None:
    """SIGKILL closes the dead rank's connections: Gloo's own error usually ends the survivors
    first; either way they exit non-zero, within the fault timeout and exit grace."""
    output, exits = launch_until_exits(2, ["--kill-rank", "1"], {0, 1}, env=fault_env())
    assert exits[1][0] == -9, output[-3000:]
    assert exits[0][0] != 0, rank_output(output, 0)[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_killed_rank_under_horovodrun_ends_the_job() -> None:
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    start = time.monotonic()
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", *TRAIN, "--kill-rank", "1"],
                     timeout=120, env=fault_env())
    assert "FAULT rank=1 killing itself" in result.stdout, result.stdout[-3000:]
    assert result.returncode != 0
    assert "Exit code: 137" in result.stdout or "exit with status code" in result.stdout, result.stdout[-3000:]
    assert time.monotonic() - start < 100


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_ctrl_c_stops_every_rank_within_the_bound(no_leftover_processes: str) -> None:
    """SIGINT to horovodrun's process group (what Ctrl-C in a terminal does) mid-training: the
    launcher and both ranks are gone within INTERRUPT_BOUND_S, nothing left running."""
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    argv = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
            str(SCRIPTS / "reliability_train.py"), "--steps", "100000", "--report-every", "5", "--step-sleep", "0.02"]
    with started(argv, env=fault_env(PYTHONUNBUFFERED="1")) as job:  # horovodrun relays lines at once
        assert job.stdout is not None
        fd, buffer, training = job.stdout.fileno(), "", set()
        deadline = time.monotonic() + 90
        while training != {"0", "1"} and time.monotonic() < deadline and job.poll() is None:
            if select.select([fd], [], [], 0.2)[0]:
                buffer += os.read(fd, 1 << 16).decode(errors="replace")
                training |= set(re.findall(r"PROGRESS rank=(\d) step=", buffer))
        assert training == {"0", "1"}, f"the job did not start training:\n{buffer[-4000:]}"
        os.killpg(job.pid, signal.SIGINT)
        interrupted = time.monotonic()
        try:
            job.wait(timeout=INTERRUPT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"horovodrun still ran {INTERRUPT_BOUND_S} s after SIGINT", pytrace=False)
        remaining = INTERRUPT_BOUND_S - (time.monotonic() - interrupted)
        _, alive = psutil.wait_procs(job_processes(no_leftover_processes), timeout=max(remaining, 0.1))
        assert not alive, f"still running {INTERRUPT_BOUND_S} s after SIGINT: pids {[p.pid for p in alive]}"
