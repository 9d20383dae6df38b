"""Start a local MXNet parameter-server job: one scheduler, S servers and W workers.

An MXNet ``dist_*`` KVStore job is several cooperating processes that find each other through
ps-lite environment variables (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI``, ...). The scheduler and the
servers need no script of their own: importing ``mxnet`` with ``DMLC_ROLE=scheduler|server`` makes
the process serve until the workers are done. This module starts all of them on one machine, runs
the user's command as every worker, prefixes each output line with the process's role and rank,
and makes sure that the job ends as one unit:

* every worker exits 0            -> the scheduler and servers are given a moment to finish, then
                                     stopped; the launcher returns 0;
* any process fails or is killed  -> every other process is stopped; the launcher returns non-zero;
* the launcher is interrupted or its ``timeout`` passes -> everything is stopped.

"Stopped" means SIGTERM to the process's whole process group, then SIGKILL after a grace period.
Each process is started in a new session (its own process group), so helpers a worker forks die
with it, and a Ctrl-C on the terminal reaches only the launcher, which then stops the job in order.

The same options are exposed as a command line (``python -m bytesched.launch``) through
:func:`build_parser` and :func:`run`, which a ``bytesched launch`` subcommand can reuse.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator, Mapping, Sequence, TextIO

from bytesched.launch.ports import free_port

__all__ = [
    "EXIT_TIMEOUT",
    "LaunchError",
    "build_parser",
    "free_port",
    "launch_ps",
    "ps_env",
    "run",
]

#: Exit status when the job's ``timeout`` passed (the same value as coreutils' ``timeout``).
EXIT_TIMEOUT = 124
#: Seconds between SIGTERM and SIGKILL when stopping a process group.
DEFAULT_KILL_GRACE = 3.0
#: Seconds the scheduler and servers get to exit on their own after every worker succeeded.
#: MXNet's servers leave once worker 0's KVStore tells them to; a job whose workers never
#: created a KVStore leaves them waiting, and they are stopped when this runs out.
DEFAULT_SHUTDOWN_GRACE = 5.0

# The scheduler and servers run no user code: importing mxnet with DMLC_ROLE set serves.
_SERVE_CODE = "import mxnet"
# Why the job cannot go on without a failed member: ps-lite never replaces one, and the survivors
# would block in C++ (a push or pull, or the final barrier) with no error of their own.
_WITHOUT = {
    "scheduler": "ps-lite cannot go on without its scheduler",
    "server": "ps-lite cannot replace a lost server; every push and pull of the keys it held would "
              "wait for it forever",
    "worker": "the servers would wait forever for its pushes (dist_sync) and its part of the final barrier",
}


class LaunchError(ValueError):
    """The job cannot be started as asked (bad counts, empty command, bad port or timeout)."""


@dataclass
class _Member:
    """One process of the job, with what is needed to name, stop and drain it."""

    role: str  # "scheduler", "server" or "worker"
    rank: int  # index within its role (0 for the scheduler)
    popen: subprocess.Popen[bytes]
    reader: threading.Thread | None = None
    returncode: int | None = None

    @property
    def name(self) -> str:
        """The label used in output prefixes and messages, e.g. ``worker 1``."""
        return self.role if self.role == "scheduler" else f"{self.role} {self.rank}"


@dataclass
class _Exited:
    """Event posted by a waiter thread when a member's process has exited."""

    member: _Member
    returncode: int


class _Interrupted(BaseException):
    """Raised in the main thread by the SIGINT/SIGTERM handler so the job can be stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class _Job:
    """The running processes, the event queue their waiter threads post to, and output sinks."""

    out: TextIO
    err: TextIO
    members: list[_Member] = field(default_factory=list)
    events: queue.Queue[_Exited] = field(default_factory=queue.Queue)
    out_lock: threading.Lock = field(default_factory=threading.Lock)
    # While processes are being started a signal is only recorded (and acted on right after),
    # so that a process is never left running without being in ``members``; once the job is
    # being stopped, further signals are only recorded (see _signal_handling).
    starting: bool = False
    stopping: bool = False
    pending_signal: int | None = None

    def say(self, message: str) -> None:
        """Write a launcher message (not a process's output) to the error stream."""
        with self.out_lock:
            self.err.write(f"[launch] {message}\n")
            self.err.flush()

    def running(self) -> list[_Member]:
        """Members whose exit has not been observed yet."""
        return [m for m in self.members if m.returncode is None]


# --------------------------------------------------------------------------- arguments and env


def ps_env(
    role: str, *, host: str, port: int, num_workers: int, num_servers: int
) -> dict[str, str]:
    """The ps-lite variables that make a process join the job as ``role``.

    ``DMLC_NODE_HOST`` pins the address each node advertises to ``host``; without it ps-lite
    guesses an interface, which on a machine with odd or no network devices can be unreachable.
    """
    if role not in ("scheduler", "server", "worker"):
        raise LaunchError(f"unknown ps-lite role {role!r}")
    return {
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": host,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NODE_HOST": host,
        "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_NUM_WORKER": str(num_workers),
    }


def _check_arguments(
    command: Sequence[str], num_workers: int, num_servers: int, port: int | None,
    timeout: float | None, kill_grace: float, shutdown_grace: float,
) -> None:
    """Reject arguments that cannot make a job, with a message that says what to change."""
    if not command:
        raise LaunchError("no worker command given (e.g. `-- python train.py`)")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise LaunchError(f"the number of workers must be an integer >= 1, got {num_workers!r}")
    if isinstance(num_servers, bool) or not isinstance(num_servers, int) or num_servers < 1:
        raise LaunchError(
            f"the number of servers must be an integer >= 1 (a parameter-server job needs a "
            f"server to hold the keys), got {num_servers!r}"
        )
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"port must be in 1..65535 (or omitted to pick a free one), got {port}")
    if timeout is not None and not timeout > 0:
        raise LaunchError(f"timeout must be a positive number of seconds, got {timeout}")
    if kill_grace < 0 or shutdown_grace < 0:
        raise LaunchError("grace periods must be >= 0 seconds")


# --------------------------------------------------------------------------- starting processes


def _pump_output(pipe: IO[bytes], prefix: str, job: _Job) -> None:
    """Copy a process's merged stdout/stderr to the job's output, one prefixed line at a time.

    Runs in its own thread per process so that no process can block on a full pipe. Ends at EOF,
    which comes when the process and everything it forked have closed the pipe.
    """
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            with job.out_lock:
                job.out.write(prefix + line)
                job.out.flush()


def _wait_for_exit(member: _Member, job: _Job) -> None:
    """Block until the member's process exits, then post the event to the job's queue.

    One waiter thread per process lets the main thread sleep on a single queue (with the job's
    deadline as the timeout) instead of polling each process.

    Where the OS allows, the process is left unreaped (a zombie) until the job is stopped: its
    pid, which is also its process group's id, then cannot be reused by an unrelated process
    before the launcher signals that group at the end.
    """
    if hasattr(os, "waitid"):
        info = os.waitid(os.P_PID, member.popen.pid, os.WEXITED | os.WNOWAIT)
        assert info is not None  # None only with WNOHANG
        exited = info.si_code == os.CLD_EXITED  # otherwise killed (or dumped) by a signal
        returncode = info.si_status if exited else -info.si_status
    else:
        returncode = member.popen.wait()
    job.events.put(_Exited(member, returncode))


def _start(job: _Job, role: str, rank: int, argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Start one process of the job in its own session, with its output and exit watched."""
    try:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: killpg reaches its children; no tty ^C
        )
    except OSError as error:  # e.g. the command does not exist or is not executable
        raise LaunchError(f"cannot start {role} {rank} ({argv[0]!r}): {error}") from error
    member = _Member(role, rank, popen)
    job.members.append(member)
    assert popen.stdout is not None
    member.reader = threading.Thread(
        target=_pump_output, args=(popen.stdout, f"[{member.name}] ", job),
        name=f"bytesched-launch-out-{member.name}", daemon=True,
    )
    member.reader.start()
    threading.Thread(
        target=_wait_for_exit, args=(member, job),
        name=f"bytesched-launch-wait-{member.name}", daemon=True,
    ).start()


def _start_all(
    job: _Job, command: Sequence[str], num_workers: int, num_servers: int, host: str,
    port: int, base_env: Mapping[str, str], python: str,
) -> None:
    """Start the scheduler, then the servers, then the workers (the order ps-lite expects).

    A SIGINT/SIGTERM that arrives meanwhile is acted on once every started process is recorded.
    """

    def env_for(role: str) -> dict[str, str]:
        env = dict(base_env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the prefixer as they are printed
        env.update(ps_env(role, host=host, port=port,
                          num_workers=num_workers, num_servers=num_servers))
        return env

    job.starting = True
    try:
        _start(job, "scheduler", 0, [python, "-c", _SERVE_CODE], env_for("scheduler"))
        for rank in range(num_servers):
            _start(job, "server", rank, [python, "-c", _SERVE_CODE], env_for("server"))
        # The workers' rank-0 channel (bytesched.core.channel): worker 0 listens on `host` at a
        # port of this job's own, unless the caller chose one.
        channel = {"BYTESCHED_CHANNEL_HOST": host, "BYTESCHED_CHANNEL_PORT": str(free_port(host))}
        for rank in range(num_workers):
            env = env_for("worker")
            for name, value in channel.items():
                env.setdefault(name, value)
            env["BYTESCHED_RANK"] = str(rank)
            env["BYTESCHED_WORLD_SIZE"] = str(num_workers)
            _start(job, "worker", rank, command, env)
    finally:
        job.starting = False
    if job.pending_signal is not None:
        job.stopping = True
        raise _Interrupted(job.pending_signal)


# --------------------------------------------------------------------------- watching and stopping


def _describe_exit(returncode: int) -> str:
    """Human wording for a return code, naming the signal when the process was killed."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _job_status(returncode: int) -> int:
    """Map a failed process's return code to the launcher's non-zero exit status."""
    return 128 + (-returncode) if returncode < 0 else returncode


def _next_exit(job: _Job, deadline: float | None) -> _Exited | None:
    """Sleep until a process exits or the deadline passes (then ``None``)."""
    try:
        if deadline is None:
            event = job.events.get()
        else:
            event = job.events.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None
    event.member.returncode = event.returncode
    return event


def _watch(job: _Job, timeout: float | None, started: float) -> int | None:
    """Wait until every worker succeeded (``0``), a process failed (its status), or time ran out.

    Returns ``None`` when the timeout passed. Servers and the scheduler exiting 0 while workers
    still run is not a failure in itself: they may legitimately finish a moment before the last
    worker's exit is observed.
    """
    deadline = None if timeout is None else started + timeout
    while any(m.role == "worker" for m in job.running()):
        event = _next_exit(job, deadline)
        if event is None:
            return None
        if event.returncode != 0:
            job.say(f"{event.member.name} {_describe_exit(event.returncode)}; stopping the job: "
                    f"{_WITHOUT[event.member.role]}")
            return _job_status(event.returncode)
    return 0


def _signal_groups(job: _Job, sig: signal.Signals) -> None:
    """Send ``sig`` to every member's process group, including members that already exited.

    A member that exited may have left children in its group; they are stopped too. A group
    that no longer exists is fine.
    """
    for member in job.members:
        try:
            os.killpg(member.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _live_groups(pgids: set[int]) -> set[int]:
    """The process groups among ``pgids`` that still have a running (non-zombie) member.

    A killed process whose parent already exited stays a zombie until init reaps it, which on
    some machines takes a second or two; it runs nothing, so it does not count. On Linux this
    reads /proc; elsewhere it falls back to ``killpg(pgid, 0)``, which also counts zombies.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return {pgid for pgid in pgids if _signal_reaches(pgid)}
    live: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) in pgids:
            live.add(int(fields[2]))
    return live


def _signal_reaches(pgid: int) -> bool:
    """Whether process group ``pgid`` still has any member (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_groups_gone(job: _Job, seconds: float) -> set[int]:
    """Wait up to ``seconds`` until no member's process group runs anything; returns the rest.

    SIGKILL is delivered asynchronously and the kernel offers no wake-up for "this group is now
    empty", so this checks with a short, growing sleep. It runs once, while stopping, and
    usually ends within milliseconds; it lets callers rely on "when launch_ps returns, none of
    the job's processes run any more", grandchildren included.
    """
    deadline = time.monotonic() + seconds
    pause = 0.001
    pgids = {m.popen.pid for m in job.members}
    while (pgids := _live_groups(pgids)) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return pgids


def _wait_all(job: _Job, seconds: float) -> bool:
    """Wait up to ``seconds`` for every member to exit; True if all did."""
    deadline = time.monotonic() + seconds
    while job.running():
        if _next_exit(job, deadline) is None:
            return False
    return True


def _stop(job: _Job, kill_grace: float) -> None:
    """Stop every process group: SIGTERM, then SIGKILL for whatever is left after the grace."""
    _signal_groups(job, signal.SIGTERM)
    if not _wait_all(job, kill_grace):
        names = ", ".join(m.name for m in job.running())
        job.say(f"still running {kill_grace:g} s after SIGTERM, sending SIGKILL: {names}")
    _signal_groups(job, signal.SIGKILL)  # also reaches children that ignored SIGTERM
    _wait_all(job, 10.0)
    survivors = _wait_groups_gone(job, 5.0)
    if survivors:
        names = ", ".join(m.name for m in job.members if m.popen.pid in survivors)
        job.say(f"WARNING: processes survived SIGKILL (uninterruptible?) in the groups of: {names}")
    for member in job.members:
        if member.returncode is not None:
            member.popen.wait()  # reap the zombies _wait_for_exit left (a no-op otherwise)
    for member in job.members:
        if member.reader is not None:
            member.reader.join(timeout=2.0)


def _finish_servers(job: _Job, shutdown_grace: float) -> int:
    """After the workers succeeded, let the scheduler and servers leave on their own.

    Returns the job's status: 0, unless a scheduler or server failed while shutting down, which
    is reported rather than hidden. Members still running after the grace are stopped by the
    caller; being stopped then is expected and not a failure.
    """
    _wait_all(job, shutdown_grace)
    status = 0
    for member in job.members:
        if member.role != "worker" and member.returncode not in (None, 0):
            job.say(f"{member.name} {_describe_exit(member.returncode)} after the workers finished")
            status = status or _job_status(member.returncode)
    if job.running():
        names = ", ".join(m.name for m in job.running())
        job.say(f"workers finished; stopping {names}")
    return status


@contextlib.contextmanager
def _signal_handling(job: _Job) -> Iterator[None]:
    """Turn the first SIGINT/SIGTERM to the launcher into :class:`_Interrupted`.

    Raising in the main thread (as Python does for Ctrl-C) wakes it from its wait on the event
    queue so it can stop the job in order. Signals that arrive while processes are being started
    are recorded and acted on right after; signals that arrive while the job is being stopped
    are ignored, because stopping is bounded (SIGTERM, a grace period, SIGKILL) and cutting it
    short would leave processes behind.

    Handlers can only be set from the main thread; elsewhere (a launcher driven from another
    thread) the caller's handling stays as it is. A signal the launcher was started with
    ignored (``nohup``, ``&`` in a script) stays ignored, as Python itself does for SIGINT.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        if job.starting or job.stopping:
            job.pending_signal = job.pending_signal or signum
            return
        job.stopping = True
        raise _Interrupted(signum)

    previous = {
        sig: signal.signal(sig, handler)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --------------------------------------------------------------------------- public API


def launch_ps(
    command: Sequence[str],
    num_workers: int,
    num_servers: int,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    *,
    python: str | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``command`` as ``num_workers`` MXNet KVStore workers with a local scheduler and servers.

    Args:
        command: the worker's argv, e.g. ``["python", "train.py"]``. Every worker runs the same
            command; ``BYTESCHED_RANK`` (0..W-1) and ``BYTESCHED_WORLD_SIZE`` tell them apart.
            (ps-lite gives KVStore ranks in connection order, so ``kv.rank`` may differ.)
            ``BYTESCHED_CHANNEL_HOST``/``PORT`` (the rank-0 channel) default to ``host`` and a
            free port of this job.
        num_workers: W >= 1.
        num_servers: S >= 1.
        host: the address every process binds and advertises; loopback by default.
        port: the scheduler's port; a free one is picked when omitted.
        env: the base environment for every process (default: this process's environment).
        timeout: seconds for the whole job; when it passes everything is stopped and
            :data:`EXIT_TIMEOUT` is returned.
        python: interpreter for the scheduler and servers (default: this one, so they import the
            same mxnet as the workers are expected to).
        kill_grace: seconds between SIGTERM and SIGKILL when stopping processes.
        shutdown_grace: seconds the scheduler and servers get to exit by themselves after the
            workers succeeded.
        stdout: where the prefixed process output goes (default: ``sys.stdout`` at call time).
        stderr: where the launcher's own messages go (default: ``sys.stderr`` at call time).

    Returns:
        0 when every worker exited 0 (and no server failed); otherwise non-zero: the failing
        process's exit code, 128+N when it was killed by signal N or the launcher received
        signal N, or :data:`EXIT_TIMEOUT` on timeout.

    Raises:
        LaunchError: the arguments cannot make a job.
    """
    _check_arguments(command, num_workers, num_servers, port, timeout, kill_grace, shutdown_grace)
    job = _Job(out=sys.stdout if stdout is None else stdout,
               err=sys.stderr if stderr is None else stderr)
    port = port if port is not None else free_port(host)
    started = time.monotonic()
    with _signal_handling(job):
        try:
            _start_all(job, command, num_workers, num_servers, host, port,
                       os.environ if env is None else env, python or sys.executable)
            status = _watch(job, timeout, started)
            if status is None:
                job.say(f"timeout: the job did not finish within {timeout:g} s; stopping it")
                status = EXIT_TIMEOUT
            elif status == 0:
                status = _finish_servers(job, shutdown_grace)
        except _Interrupted as stop:
            job.say(f"received {signal.Signals(stop.signum).name}; stopping the job")
            status = 128 + stop.signum
        finally:
            job.stopping = True  # from here on, signals to the launcher are only recorded
            _stop(job, kill_grace)
    if status != 0:
        job.say("how each process ended: " + ", ".join(
            f"{m.name} {_describe_exit(m.returncode)}" for m in job.members if m.returncode is not None))
    return status


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add the launcher's options to ``parser`` (or a new one) and return it.

    Taking a parser lets a ``bytesched launch`` subcommand share these options exactly.
    """
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="python -m bytesched.launch",
            description="Run a command as the workers of a local MXNet parameter-server job "
                        "(one scheduler, --servers servers, --workers workers).",
            epilog="example: python -m bytesched.launch --servers 2 --workers 2 -- python train.py",
        )
    parser.add_argument("-w", "--workers", type=int, default=1, metavar="W",
                        help="number of worker processes (default: 1)")
    parser.add_argument("-s", "--servers", type=int, default=1, metavar="S",
                        help="number of server processes (default: 1)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the processes bind and advertise (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="scheduler port (default: a free port)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop everything and exit 124 if the job runs longer than this")
    parser.add_argument("--kill-grace", type=float, default=DEFAULT_KILL_GRACE,
                        metavar="SECONDS", help="time between SIGTERM and SIGKILL "
                        f"(default: {DEFAULT_KILL_GRACE:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the worker command, after `--`")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the job described by parsed ``args``; returns the exit status (2 for bad arguments)."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        return launch_ps(command, args.workers, args.servers, host=args.host, port=args.port,
                         timeout=args.timeout, kill_grace=args.kill_grace)
    except LaunchError as error:
        print(f"bytesched launch: error: {error}", file=sys.stderr)
        return 2
