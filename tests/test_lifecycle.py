"""bytesched.runtime's one way to stop: tracked objects close in a fixed order, then the Core stops,
at the end of a ``running()`` block and at interpreter exit (a real child process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import bytesched.core as core_mod
from bytesched import runtime
from bytesched.core import Config


class OneRank:
    """The runtime's Workers for a job of one process (no channel)."""

    rank, size, order = 0, 1, "immediate"

    def barrier(self) -> None:
        pass


class Part:
    """A tracked object that records when it was closed, and whether the Core still ran then."""

    def __init__(self, name: str, log: list[tuple[str, bool]], fail: bool = False) -> None:
        self.name, self.log, self.fail = name, log, fail

    def close(self, timeout: float) -> None:
        self.log.append((self.name, core_mod.get_core().running))
        if self.fail:
            raise RuntimeError(f"{self.name} cannot close")


@pytest.fixture
def fresh_core():
    yield
    core_mod.shutdown(5.0)


def test_shutdown_closes_plugins_newest_first_while_the_core_runs_then_stops_it(fresh_core) -> None:
    core = runtime.start_core(Config(), OneRank())
    log: list[tuple[str, bool]] = []
    parts = [Part("first", log), Part("second", log, fail=True), Part("third", log)]
    engine = Part("engine", log)
    for part in parts:
        runtime.track(part)
    runtime.track(engine, runtime.ENGINE)
    closed_early = Part("closed", log)
    runtime.track(closed_early)
    runtime.untrack(closed_early)
    runtime.shutdown(5.0)
    # A part that fails to close does not keep the others open; the engine's part waits for exit.
    assert log == [("third", True), ("second", True), ("first", True)]
    assert not core.running
    runtime.shutdown(5.0)  # idempotent
    assert len(log) == 3
    assert runtime.start_core(Config(), OneRank()) is not core  # a later object starts a new Core


def test_a_running_block_shuts_down_also_when_training_raises(fresh_core) -> None:
    log: list[tuple[str, bool]] = []
    with pytest.raises(ValueError, match="diverged"):
        with runtime.running(timeout=5.0):
            core = runtime.start_core(Config(), OneRank())
            optimizer = Part("optimizer", log)
            runtime.track(optimizer)
            raise ValueError("loss diverged")
    assert log == [("optimizer", True)]
    assert not core.running


def test_at_exit_plugins_close_then_the_engine_then_the_core_stops_whatever_the_creation_order() -> None:
    script = textwrap.dedent("""
        import atexit
        import bytesched.core as core_mod
        from bytesched import runtime
        from bytesched.core import Config

        class OneRank:
            rank, size, order = 0, 1, "immediate"
            def barrier(self): pass

        class Part:
            def __init__(self, name): self.name = name
            def close(self, timeout):
                print(self.name, "closed; Core running:", core_mod.get_core().running, flush=True)

        cores = []
        # Registered before the runtime's hook, so it runs after it (atexit runs hooks in reverse).
        atexit.register(lambda: print("Core stopped:", not cores[0].running, flush=True))
        engine = Part("engine")
        runtime.track(engine, runtime.ENGINE)  # made first, as MXNet's proxies are
        cores.append(runtime.start_core(Config(), OneRank()))
        optimizer = Part("optimizer")
        runtime.track(optimizer)
        print("training done", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "training done",
        "optimizer closed; Core running: True",
        "engine closed; Core running: True",
        "Core stopped: True",
    ]
