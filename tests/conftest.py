"""Shared test helpers: stack checks that fail loudly, and a guard against leftover processes.

Multi-process tests (marked ``multiproc``) get a unique token in ``BYTESCHED_TEST_TOKEN``. Every
process they start inherits it, so after the test any process still carrying the token, or still
a child of this one, was left behind: it is killed and the test fails. Tagging by environment
also finds grandchildren that were re-parented to init when their parent died.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Collection, Iterator, Mapping, Sequence

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
TOKEN_VAR = "BYTESCHED_TEST_TOKEN"
# Processes that are on their way out (already signalled) get this long before counting as left.
SETTLE_SECONDS = 3.0

_SETUP_HINT = "`make test` (which runs scripts/setup.sh) installs the whole stack into .venv"


def pytest_configure(config: pytest.Config) -> None:
    """Make the checkout's ``benchmarks`` package (not installed) importable here and in every
    process a test starts; silence mxnet 1.9.1's import-time DeprecationWarnings (distutils),
    which are not ours; give Ctrl-C back its terminal meaning when the suite was started with
    SIGINT ignored."""
    sys.path.insert(0, str(REPO_ROOT))
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO_ROOT) if not path else f"{REPO_ROOT}{os.pathsep}{path}"
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet")
    # A job put in the background by a non-interactive shell (`cmd &` in a script) starts with
    # SIGINT ignored, and every process it starts inherits that: the Ctrl-C tests' jobs would
    # never see their SIGINT. A handled signal is reset to the default by exec, so the children
    # get what a terminal gives them.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def require(module_name: str, component: str | None = None) -> ModuleType:
    """Import ``module_name`` or FAIL the test naming the missing component.

    The stack is part of what is tested: a missing piece is a broken set-up, never a reason to
    skip.
    """
    try:
        if module_name.startswith("horovod.mxnet"):
            # torch first: a process that imports torch after horovod.mxnet segfaults, which a
            # later test of the same pytest process would otherwise do
            importlib.import_module("torch")
        return importlib.import_module(module_name)
    except Exception as error:  # ImportError, or OSError/RuntimeError from a broken extension
        pytest.fail(
            f"missing component: {component or module_name} (`import {module_name}` failed with "
            f"{type(error).__name__}: {error}) under {sys.executable}. {_SETUP_HINT}.",
            pytrace=False,
        )


def require_executable(name: str) -> Path:
    """The path of ``name`` next to this interpreter (the venv's bin/), or FAIL the test."""
    path = Path(sys.executable).parent / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"missing component: {path} does not exist. {_SETUP_HINT}.", pytrace=False)
    return path


# --------------------------------------------------------------------------- leftover processes


def _tagged(token: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``token``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(TOKEN_VAR) == token:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes in ``procs`` that still run (zombies are dead, just not reaped yet)."""
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def job_processes(token: str, ignore: Collection[int] = ()) -> list[psutil.Process]:
    """Every live process of the current test: descendants of this process and tagged ones."""
    procs = {p.pid: p for p in _tagged(token)}
    for child in psutil.Process().children(recursive=True):
        if child.pid not in ignore:
            procs.setdefault(child.pid, child)
    return _alive(list(procs.values()))


def kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL ``procs`` and wait briefly for them, ignoring those already gone."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


def _describe(procs: list[psutil.Process]) -> str:
    lines = []
    for proc in procs:
        try:
            lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
        except psutil.Error:
            lines.append(f"  pid {proc.pid}: (gone)")
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def no_leftover_processes(request: pytest.FixtureRequest,
                          monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """For ``multiproc`` tests: tag started processes, then fail if any outlive the test."""
    if request.node.get_closest_marker("multiproc") is None:
        yield None
        return
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield token
    _fail_if_any_stay(job_processes(token, ignore=before), "processes left running after the test")


@pytest.fixture(scope="module", autouse=True)
def no_process_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the module whose tests (or module fixtures) left a child of pytest running.

    The per-test guard above ignores children that existed before the test, so a helper started
    by a module fixture (multiprocessing's resource tracker once was) would live on unseen for the
    whole session and be counted as theirs by later tests that look at pytest's children.
    """
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    _fail_if_any_stay([p for p in _alive(psutil.Process().children(recursive=True)) if p.pid not in before],
                      f"{request.module.__name__} left processes running after its last test")


@pytest.fixture(scope="module", autouse=True)
def no_core_outlives_its_module() -> Iterator[None]:
    """Stop the process's bytesched Core (``bytesched.core.init``) after each module: a module whose
    ScheduledOptimizers share it leaves it running, and a later module's optimizer with another
    configuration would then be refused ("a bytesched Core is already running with another
    configuration"), failing by test order alone."""
    yield
    core = sys.modules.get("bytesched.core")
    if core is not None:
        core.shutdown()


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[object]:
    """A real one-rank torch.distributed group (gloo), so ScheduledOptimizer has a backend in this
    process. Module-scoped: a module's tests that need torch.distributed *not* initialised must
    run before the first test using it."""
    import torch.distributed as dist

    from bytesched.launch.ports import free_port
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _fail_if_any_stay(leftovers: list[psutil.Process], what: str) -> None:
    """Give ``leftovers`` a moment to exit; kill those still alive and fail with ``what``."""
    if leftovers:
        _gone, leftovers = psutil.wait_procs(leftovers, timeout=SETTLE_SECONDS)
        leftovers = _alive(leftovers)
    if leftovers:
        description = _describe(leftovers)
        kill_all(leftovers)
        pytest.fail(f"{what} (now killed):\n{description}", pytrace=False)


# --------------------------------------------------------------------------- running jobs


def _kill_job(popen: subprocess.Popen[str]) -> None:
    """Kill a started job with everything it started: its process group, descendants, tagged."""
    token = os.environ.get(TOKEN_VAR)
    procs = []
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = psutil.Process(popen.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    if token:
        procs += _tagged(token)
    kill_all(procs)
    popen.kill()
    popen.wait()


@contextlib.contextmanager
def started(argv: Sequence[str | os.PathLike[str]], env: Mapping[str, str] | None = None,
            cwd: Path = REPO_ROOT) -> Iterator[subprocess.Popen[str]]:
    """Start ``argv`` in its own session with merged text output; kill it all if still running.

    The kill in ``finally`` runs whether the test passed, failed or was interrupted by
    pytest-timeout, so no job outlives its test.
    """
    popen = subprocess.Popen(
        [str(a) for a in argv], cwd=cwd, env=dict(os.environ if env is None else env),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        yield popen
    finally:
        if popen.poll() is None:
            _kill_job(popen)
        if popen.stdout is not None:
            popen.stdout.close()


def output_after(job: subprocess.Popen[str], marker: str, timeout: float) -> tuple[str, float]:
    """Read ``job``'s whole output (pytest-timeout ends the test if it never closes), then wait at
    most ``timeout`` seconds for it to exit: the output, and how many seconds after the first line
    containing ``marker`` the output ended (inf if no line did).

    Reading to the end through the same file object matters: ``communicate()`` after a partial
    ``for line in job.stdout`` reads the pipe directly and loses what the iteration had buffered.
    """
    assert job.stdout is not None
    seen, marked = [], None
    for line in job.stdout:
        seen.append(line)
        if marked is None and marker in line:
            marked = time.monotonic()
    ended = time.monotonic()
    job.wait(timeout=timeout)
    return "".join(seen), math.inf if marked is None else ended - marked


def require_shaping() -> None:
    """FAIL (not skip: CI runs as root with iproute2) where shaped namespaces cannot be made."""
    from benchmarks.emulation import unavailable_reason
    reason = unavailable_reason()
    if reason is not None:
        pytest.fail(f"network emulation is unavailable here: {reason}", pytrace=False)


def run_job(argv: Sequence[str | os.PathLike[str]], timeout: float,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion within ``timeout`` seconds; on timeout kill it all and FAIL."""
    timed_out = False
    with started(argv, env=env) as popen:
        try:
            output, _ = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_job(popen)
            output, _ = popen.communicate()
    if timed_out:
        pytest.fail(f"{' '.join(map(str, argv))} did not finish within {timeout} s (killed); "
                    f"output:\n{output[-4000:]}", pytrace=False)
    return subprocess.CompletedProcess(list(map(str, argv)), popen.returncode, output, None)
