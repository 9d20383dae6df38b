"""A distributed job on an emulated cluster: its processes, their output, and ending it as one.

A job has *members* (the ranks or workers whose success is the job's success) and *helpers*
(a ps-lite scheduler and servers, which serve until the workers are done). It ends as one unit,
as ``bytesched launch`` does (bytesched/launch/ps.py):

* every member exits 0            -> helpers get a few seconds to leave on their own, then are
                                     stopped; :meth:`Job.wait` returns 0;
* any process exits non-zero      -> at once, from a watcher thread (whether or not someone is
                                     waiting), every other process is stopped; ``wait`` returns
                                     that process's status (128+N if killed by signal N);
* ``wait``'s timeout passes       -> everything is stopped and TimeoutError names what still ran.

Each process runs in a session of its own, so stopping it (SIGTERM to its process group, then
SIGKILL) also reaches what it forked. A watcher thread waits for each exit without reaping it
(``WNOWAIT``): the pid, which is also the group's id, cannot be reused by an unrelated process
before the job has signalled that group for the last time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import IO, Callable, Mapping, Sequence

#: Seconds between SIGTERM and SIGKILL.
KILL_GRACE = 3.0
#: Seconds helpers get to leave by themselves after every member succeeded.
HELPER_GRACE = 5.0


@dataclass
class _Process:
    label: str  # e.g. "rank 1" or "server 0": output prefix and messages
    member: bool  # its success is the job's success (a rank or worker), or a helper
    popen: subprocess.Popen[bytes]
    reader: threading.Thread
    returncode: int | None = None


def _status(returncode: int) -> int:
    """A process's return code as a shell-style exit status (128+N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


class Job:
    """Processes started by an emulated cluster's ``launch_*``; see the module docstring.

    ``output`` collects every process's merged stdout and stderr as it arrives, one line per
    entry, prefixed with ``[label]`` (``[rank 0]``, ``[worker 1]``, ``[scheduler]``), plus the
    job's own messages prefixed ``[job]``.
    """

    def __init__(self, name: str, on_end: Callable[[], None] | None = None) -> None:
        self.name = name
        self.output: list[str] = []
        self._on_end = on_end
        self._processes: list[_Process] = []
        self._changed = threading.Condition()
        self._failure: _Process | None = None
        self._stopping = False
        self._stop_lock = threading.Lock()
        self._ended = False

    # ------------------------------------------------------------------ starting

    def start(self, label: str, argv: Sequence[str], env: Mapping[str, str], *, member: bool = True) -> None:
        """Start one process; if the job already failed or is stopping, refuse."""
        with self._changed:
            if self._stopping:
                raise RuntimeError(f"job {self.name} is stopping; cannot start {label}")
            popen = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
            assert popen.stdout is not None
            reader = threading.Thread(target=self._collect, args=(popen.stdout, f"[{label}] "), daemon=True,
                                      name=f"job-{self.name}-out-{label}")
            process = _Process(label, member, popen, reader)
            self._processes.append(process)
        reader.start()
        threading.Thread(target=self._watch, args=(process,), daemon=True, name=f"job-{self.name}-wait-{label}").start()

    def _collect(self, pipe: IO[bytes], prefix: str) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                self.output.append(prefix + raw.decode("utf-8", errors="replace").rstrip("\n"))

    def _say(self, message: str) -> None:
        self.output.append(f"[job] {message}")

    def _watch(self, process: _Process) -> None:
        """Record the process's exit; the first non-zero exit stops the whole job."""
        try:
            info = os.waitid(os.P_PID, process.popen.pid, os.WEXITED | os.WNOWAIT)
            returncode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        except ChildProcessError:  # already reaped by a stop that gave up waiting for this thread
            returncode = process.popen.wait()
        with self._changed:
            process.returncode = returncode
            failed = returncode != 0 and not self._stopping and self._failure is None
            if failed:
                self._failure = process
                self._say(f"{process.label} exited with status {_status(returncode)}; stopping the job")
            self._changed.notify_all()
        if failed:
            self._stop()

    # ------------------------------------------------------------------ waiting and stopping

    def _running(self, members_only: bool = False) -> list[_Process]:
        return [p for p in self._processes if p.returncode is None and (p.member or not members_only)]

    def wait(self, timeout: float) -> int:
        """Wait until every member succeeded or one process failed; then end the job.

        Returns 0, or the first failing process's exit status. If ``timeout`` seconds pass
        first, everything is stopped and TimeoutError says which processes were still running.
        """
        with self._changed:
            settled = self._changed.wait_for(
                lambda: self._failure is not None or not self._running(members_only=True), timeout=timeout)
            still = "" if settled else ", ".join(p.label for p in self._running())
            if settled and self._failure is None:
                self._changed.wait_for(lambda: not self._running(), timeout=HELPER_GRACE)
        if still:
            self._say(f"timeout after {timeout:g} s; stopping {still}")
        self._stop()
        if still:
            raise TimeoutError(f"job {self.name} did not finish within {timeout:g} s; still running: {still} "
                               f"(all stopped)")
        if self._failure is not None:
            assert self._failure.returncode is not None
            return _status(self._failure.returncode)
        return 0

    def kill(self) -> None:
        """Stop every process of the job now (SIGTERM, then SIGKILL); safe to call repeatedly."""
        self._stop()

    def _signal_all(self, sig: signal.Signals) -> None:
        for process in self._processes:
            try:
                os.killpg(process.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self) -> None:
        with self._stop_lock:  # one stop at a time; the rest find it done
            if self._ended:
                return
            with self._changed:
                self._stopping = True
                if self._running():
                    self._signal_all(signal.SIGTERM)
                    if not self._changed.wait_for(lambda: not self._running(), timeout=KILL_GRACE):
                        self._say(f"still running {KILL_GRACE:g} s after SIGTERM, killing: "
                                  + ", ".join(p.label for p in self._running()))
                self._signal_all(signal.SIGKILL)  # also what they forked, which SIGTERM may have spared
                self._changed.wait_for(lambda: not self._running(), timeout=10.0)
            for process in self._processes:
                process.popen.wait()  # reap (the watcher left the zombie so the pgid stayed ours)
                process.reader.join(timeout=2.0)
            self._ended = True
            if self._on_end is not None:
                self._on_end()

    @property
    def labels(self) -> list[str]:
        """The processes of the job, in start order."""
        return [p.label for p in self._processes]
