"""Tuning across ranks over the real rank-0 channel: every rank switches at the same step whatever
the timing of the broadcast; a lost, malformed, foreign or contradicted message fails the job
with a clear error instead of letting ranks diverge. In-process (ranks as threads) and as real
processes running the Core in rank-0 order."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest
import zmq

from bytesched.core import Config, SchedulingParams
from bytesched.core.channel import FrameCodec, MessageType, encode_typed, open_channel
from bytesched.launch.ports import free_port
from bytesched.tuning import TuningProtocolError, make_session
from bytesched.tuning.log import load_best
from bytesched.tuning.protocol import SWITCH, Switch
from bytesched.tuning.space import space_for

from conftest import REPO_ROOT, SCRIPTS, started


def _script(name: str) -> ModuleType:
    """A module of tests/scripts (they are run as programs, and imported for their helpers)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FaultyBroadcasts = _script("tuning_ranks").FaultyBroadcasts

TOKEN = "tuning-test-token"
STEPS_PER_TRIAL = 8
PS = space_for("ps")


def make_config(port: int, timeout: float = 10.0, **kwargs: Any) -> Config:
    tuning = dict(tuning=True, tuning_max_trials=5, tuning_steps_per_trial=STEPS_PER_TRIAL, tuning_warmup_steps=1)
    return Config(channel_port=port, channel_timeout_s=timeout, job_token=TOKEN, **{**tuning, **kwargs})


def step_seconds(params: SchedulingParams | None) -> float:
    """A made-up step time with a best point at (2.8 MB, 22.6 MB)."""
    if params is None:
        return 1.0
    i, j = PS.nearest(params, 4_000_000)
    return 0.1 * (1 + 0.02 * ((i - 5) ** 2 + (j - 7) ** 2))


@contextlib.contextmanager
def channels(config: Config) -> Any:
    """Rank 0's and rank 1's ends of one job's channel (rank 1 connects on a thread)."""
    box: dict[str, Any] = {}
    joiner = threading.Thread(target=lambda: box.setdefault("follower", open_channel(config, 1, 2)))
    joiner.start()
    leader = open_channel(config, 0, 2)
    joiner.join(config.channel_timeout_s + 5)
    try:
        yield leader, box["follower"]
    finally:
        box["follower"].close(timeout=0.5)
        leader.close(timeout=0.5)


class Rank(threading.Thread):
    """One rank's training loop as a thread: step boundaries in lockstep with the other rank
    (a barrier, as synchronous training gives), the tuning session asked before each step."""

    def __init__(self, session: Any, steps: int, barrier: threading.Barrier, first_step: int = 0,
                 start_delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.session = session
        self.start_delay = start_delay
        self.steps = steps
        self.first_step = first_step
        self.barrier = barrier
        self.applied: list[tuple[int, SchedulingParams]] = []
        self.waited: dict[int, float] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        now, params = 0.0, None
        time.sleep(self.start_delay)
        try:
            for step in range(self.first_step, self.first_step + self.steps):
                began = time.monotonic()
                new = self.session.on_step(step, 32, now)
                self.waited[step] = time.monotonic() - began
                if new is not None:
                    params = new
                    self.applied.append((step, new))
                now += step_seconds(params)
                self.barrier.wait()
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            self.error = exc
            self.barrier.abort()


def run_two_ranks(config: Config, steps: int, *, leader_channel: Callable[[Any], Any] = lambda c: c,
                  follower_channel: Callable[[Any], Any] = lambda c: c, follower_first_step: int = 0,
                  leader_start_delay: float = 0.0) -> tuple[Rank, Rank]:
    with channels(config) as (leader, follower):
        barrier = threading.Barrier(2, timeout=30)
        ranks = [Rank(make_session(config, rank=0, world_size=2, channel=leader_channel(leader), arch="ps"),
                      steps, barrier, start_delay=leader_start_delay),
                 Rank(make_session(config, rank=1, world_size=2, channel=follower_channel(follower), arch="ps"),
                      steps, barrier, follower_first_step)]
        for rank in ranks:
            rank.start()
        for rank in ranks:
            rank.join(60)
            assert not rank.is_alive(), "a rank is stuck"
    return ranks[0], ranks[1]


# -- agreement ------------------------------------------------------------------------------------
def test_two_ranks_switch_at_the_same_steps_and_keep_the_same_final_sizes() -> None:
    leader, follower = run_two_ranks(make_config(free_port()), steps=70)
    assert leader.error is None and follower.error is None, (leader.error, follower.error)
    assert [step for step, _ in leader.applied] == [0, 8, 16, 24, 32, 40]
    assert follower.applied == leader.applied
    assert leader.session.done and follower.session.done
    assert follower.session.final == leader.session.final == leader.applied[-1][1]


def test_a_rank0_slow_to_start_is_no_lost_switch() -> None:
    """Rank 0 reaches its first step 2 s after the follower (timeout 1 s): trial 0 needs no
    message, and the first broadcast is due only when training has carried both ranks along."""
    leader, follower = run_two_ranks(make_config(free_port(), timeout=1.0), steps=30, leader_start_delay=2.0)
    assert leader.error is None and follower.error is None, (leader.error, follower.error)
    assert follower.applied == leader.applied and [s for s, _ in leader.applied] == [0, 8, 16, 24]


def test_a_late_switch_is_waited_for_and_applied_at_the_agreed_step() -> None:
    delay = 1.0
    leader, follower = run_two_ranks(
        make_config(free_port()), steps=70,
        leader_channel=lambda c: FaultyBroadcasts(c, delay_trial=2, delay_s=delay))
    assert leader.error is None and follower.error is None, (leader.error, follower.error)
    assert follower.applied == leader.applied
    assert [step for step, _ in follower.applied][2] == 16
    # The follower reached step 16 before the switch; it waited there, not somewhere else.
    assert follower.waited[16] > 0.5 * delay
    assert max(w for s, w in follower.waited.items() if s != 16) < 0.5 * delay


def test_a_lost_switch_fails_the_follower_with_a_clear_error() -> None:
    leader, follower = run_two_ranks(make_config(free_port(), timeout=1.5), steps=70,
                                     leader_channel=lambda c: FaultyBroadcasts(c, drop_trial=2))
    assert isinstance(follower.error, TuningProtocolError)
    message = str(follower.error)
    assert "rank 1 reached step 16" in message and "did not arrive within 1.5 s" in message
    assert [s for s, _ in follower.applied] == [0, 8]  # never anything rank 0 did not announce
    assert [s for s, _ in leader.applied][:2] == [0, 8]


def test_rank0_fails_when_a_follower_never_confirms() -> None:
    """A follower that stays silent (stuck, or a bug) is caught by rank 0 a few steps later."""
    config = make_config(free_port(), timeout=1.0)
    with channels(config) as (leader, follower):
        session = make_session(config, rank=0, world_size=2, channel=leader, arch="ps")
        for step in range(3):
            session.on_step(step, 32, float(step))
        with pytest.raises(TuningProtocolError, match="did not get every rank's confirmation of tuning trial 0"):
            session.on_step(3, 32, 3.0)


class AltersReports:
    """A follower's channel whose confirmations claim other sizes (a rank that diverged)."""

    def __init__(self, follower: Any) -> None:
        self.follower = follower

    def subscribe(self, kind: str, callback: Callable[[dict[str, Any]], None]) -> None:
        self.follower.subscribe(kind, callback)

    def report(self, kind: str, body: dict[str, Any]) -> None:
        self.follower.report(kind, {**body, "partition": body["partition"] + 4})


def test_a_follower_that_applied_other_sizes_fails_rank0() -> None:
    leader, follower = run_two_ranks(make_config(free_port()), steps=20, follower_channel=AltersReports)
    assert isinstance(leader.error, TuningProtocolError)
    assert "rank 1 applied trial 0 at step 0 with partition 4000004" in str(leader.error)
    assert "the ranks diverged" in str(leader.error)


def test_ranks_that_count_steps_differently_fail_clearly() -> None:
    leader, follower = run_two_ranks(make_config(free_port(), timeout=3.0), steps=20, follower_first_step=5)
    assert isinstance(leader.error, TuningProtocolError)
    assert "rank 1 applied trial 0 at step 5" in str(leader.error) and "diverged" in str(leader.error)


def test_a_previous_jobs_best_is_loaded_by_rank0_and_applied_by_all(tmp_path: Path) -> None:
    """BYTESCHED_TUNING_LOAD alone: only rank 0 reads the log; every rank switches at step 3."""
    log_path = tmp_path / "previous.csv"
    log_path.write_text("trial,partition_mb,credit_mb,samples_per_s,best_samples_per_s,source\n"
                        "0,4.000,16.000,100.0,100.0,configured\nbest,2.828,22.627,120.0,120.0,final\n")
    config = make_config(free_port(), tuning=False, tuning_load=str(log_path))
    leader, follower = run_two_ranks(config, steps=10)
    assert leader.error is None and follower.error is None, (leader.error, follower.error)
    expected = [(3, SchedulingParams(2_828_000, 22_627_000))]
    assert leader.applied == follower.applied == expected
    assert leader.session.done and follower.session.done


def test_a_malformed_switch_from_rank0_fails_the_follower() -> None:
    config = make_config(free_port())
    with channels(config) as (leader, follower):
        session = make_session(config, rank=1, world_size=2, channel=follower, arch="ps")
        assert session.on_step(0) == SchedulingParams(4_000_000, 16_000_000)  # trial 0: no message
        leader.broadcast(SWITCH, {"trial": 1, "step": 8, "partition": "4MB", "credit": 1, "next_step": 16, "batch": 0})
        for step in range(1, 8):
            assert session.on_step(step) is None
        with pytest.raises(TuningProtocolError, match="invalid tuning message from rank 0.*partition='4MB'"):
            session.on_step(8)


# -- foreign and malformed frames -----------------------------------------------------------------
def test_foreign_and_junk_frames_never_reach_the_session() -> None:
    """A process speaking for rank 0 without the job token (another job, a stale run, a scanner)
    cannot make a follower switch: its frames, pickles and garbage are rejected by the channel;
    the one genuine switch that follows is applied."""
    config = make_config(free_port())
    codec, foreign = FrameCodec(TOKEN), FrameCodec("another-job")
    context = zmq.Context()
    rogue = context.socket(zmq.ROUTER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.bind(f"tcp://127.0.0.1:{config.channel_port}")
    follower = None
    try:
        box: dict[str, Any] = {}
        joiner = threading.Thread(target=lambda: box.setdefault("end", open_channel(config, 1, 2)))
        joiner.start()
        route, _hello = rogue.recv_multipart()
        rogue.send_multipart([route, codec.seal(MessageType.WELCOME, 0, (2).to_bytes(4, "little"))])
        joiner.join(10)
        follower = box["end"]
        session = make_session(config, rank=1, world_size=2, channel=follower, arch="ps")
        assert session.on_step(0) == SchedulingParams(4_000_000, 16_000_000)  # trial 0: no message
        forged = Switch(1, 8, 500_000, 2_000_000, None).to_body()
        import pickle  # the attacker's tool, not ours: it must bounce off the channel
        junk = [
            foreign.seal(MessageType.BROADCAST, 1, encode_typed(SWITCH, forged)),  # another job's token
            pickle.dumps(("tuning.switch", forged)),  # a pickled object
            codec.seal(MessageType.BROADCAST, 1, encode_typed(SWITCH, forged))[:-1],  # truncated MAC
            codec.seal(MessageType.BROADCAST, 7, encode_typed(SWITCH, forged)),  # replayed out of sequence
            codec.seal(MessageType.BROADCAST, 1, bytes([len(SWITCH)]) + SWITCH.encode() + b"{not json"),
        ]
        for frame in junk:
            rogue.send_multipart([route, frame])
        genuine = Switch(1, 8, 2_828_427, 22_627_417, None)  # message 2: the authentic junk used number 1
        rogue.send_multipart([route, codec.seal(MessageType.BROADCAST, 2, encode_typed(SWITCH, genuine.to_body()))])
        assert session.on_step(8) == genuine.params
        assert session.done and follower.rejected == len(junk)
    finally:
        if follower is not None:
            follower.close(timeout=0)
        rogue.close()
        context.term()


def test_no_pickle_anywhere_on_the_tuning_path() -> None:
    """Neither the channel nor any tuning module imports a serialiser that executes code."""
    unsafe = {"pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "jsonpickle"}
    files = [*sorted((REPO_ROOT / "bytesched/core/channel").glob("*.py")),
             *sorted((REPO_ROOT / "bytesched/tuning").glob("*.py"))]
    assert len(files) > 5
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {n.split(".")[0] for n in names} & unsafe, f"{path} imports {names}"


# -- real processes, real Cores in rank-0 order ---------------------------------------------------
def run_processes(tmp_path: Path, *args: str, timeout: float = 90.0, **env: str) -> list[dict[str, Any]]:
    """Run ranks 0 and 1 of tests/scripts/tuning_ranks.py; their RESULT or ERROR lines."""
    base = {**os.environ, "BYTESCHED_TUNING": "1", "BYTESCHED_TUNING_MAX_TRIALS": "6",
            "BYTESCHED_TUNING_STEPS_PER_TRIAL": "10", "BYTESCHED_TUNING_WARMUP_STEPS": "2",
            "BYTESCHED_CHANNEL_PORT": str(free_port()), "BYTESCHED_JOB_TOKEN": TOKEN,
            "BYTESCHED_TUNING_LOG": str(tmp_path / "tuning.csv"), "PYTHONPATH": str(REPO_ROOT), **env}
    script = SCRIPTS / "tuning_ranks.py"
    with started([sys.executable, script, "0", "2", *args], env=base) as rank0, \
            started([sys.executable, script, "1", "2", *args], env=base) as rank1:
        outputs = []
        deadline = time.monotonic() + timeout
        for proc in (rank0, rank1):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"a rank did not finish within {timeout} s (killed)")
            outputs.append(out)
    results = []
    for rank, out in enumerate(outputs):
        lines = [line for line in out.splitlines() if line.startswith(("RESULT ", "ERROR "))]
        assert lines, f"rank {rank} printed no result:\n{out[-3000:]}"
        kind, _, payload = lines[-1].partition(" ")
        results.append({"ok": kind == "RESULT", **json.loads(payload)})
    return results


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_processes_with_cores_in_rank0_order_switch_together(tmp_path: Path) -> None:
    """Each switch changes how every rank partitions its gradients; with rank-0 ordering a rank
    that switched at another step would wait forever for sub-tasks it does not have."""
    rank0, rank1 = run_processes(tmp_path, "--steps", "90")
    assert rank0["ok"] and rank1["ok"], (rank0, rank1)
    assert rank0["applied"] == rank1["applied"] and len(rank0["applied"]) >= 4
    assert rank0["done"] and rank1["done"] and rank0["final"] == rank1["final"]
    best = load_best(tmp_path / "tuning.csv")
    assert [round(b, -3) for b in rank0["final"]] == [best.partition_bytes, best.credit_bytes]


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_processes_wait_for_a_late_switch_or_fail_on_a_lost_one(tmp_path: Path) -> None:
    rank0, rank1 = run_processes(tmp_path, "--steps", "60", "--delay-trial", "2", "--delay-s", "2")
    assert rank0["ok"] and rank1["ok"], (rank0, rank1)
    assert rank0["applied"] == rank1["applied"] and rank0["applied"][2][0] == 20

    rank0, rank1 = run_processes(tmp_path, "--steps", "60", "--drop-trial", "2", BYTESCHED_CHANNEL_TIMEOUT_S="3")
    assert not rank1["ok"] and rank1["type"] == "TuningProtocolError", rank1
    assert "reached step 20" in rank1["message"] and "did not arrive" in rank1["message"]
    assert not rank0["ok"] and rank0["type"] == "TuningProtocolError", rank0
    assert "confirmation of tuning trial" in rank0["message"]
