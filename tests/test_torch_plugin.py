"""The PyTorch plugin end to end: real multi-process jobs on Gloo, CPU.

Each launch costs seconds of start-up, so one launch runs many checks (tests/scripts/torch_*.py)
and prints a ``CASE <name> OK|FAIL rank=<r> <detail>`` line per check; a module-scoped fixture
runs each launch once and the tests below assert on their share of the lines. Every case must be
reported OK by every rank, and every expected case must be there.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from bytesched.core.config import NATIVE_POLICIES, POLICIES
from bytesched.launch.ports import free_port
from conftest import SCRIPTS, require, require_executable, run_job

OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop")
# torchrun passes both ranks' output through unprefixed, so two lines can run together: a case's
# detail ends at the end of the line or where the next CASE/TIME/DONE line starts.
CASE_RE = re.compile(r"CASE (\S+) (OK|FAIL) rank=(\d+) ?(.*?)(?=CASE |TIME |DONE |$)", re.MULTILINE)


@dataclass
class Launch:
    """What one multi-process run reported."""

    ranks: int
    output: str
    returncode: int
    cases: dict[str, dict[int, tuple[bool, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for match in CASE_RE.finditer(self.output):
            name, verdict, rank, detail = match.groups()
            self.cases.setdefault(name, {})[int(rank)] = (verdict == "OK", detail)

    def json_lines(self, tag: str, case: str) -> dict[int, dict[str, Any]]:
        """Each rank's ``<tag> {json}`` line for ``case`` (a script's own report), by rank; every
        rank must have printed one. Each object is decoded from where it starts to where it ends,
        since two ranks' lines can run together (see CASE_RE)."""
        decoder = json.JSONDecoder()
        reports = [decoder.raw_decode(self.output, m.end() - 1)[0] for m in re.finditer(rf"{tag} \{{", self.output)]
        by_rank = {r["rank"]: r for r in reports if r["case"] == case}
        assert sorted(by_rank) == list(range(self.ranks)), \
            f"{case}: {tag} from ranks {sorted(by_rank)}; output tail:\n{self.output[-3000:]}"
        return by_rank

    def check(self, names: list[str]) -> None:
        """Every name reported OK by every rank (one message listing all problems)."""
        problems = []
        for name in names:
            by_rank = self.cases.get(name, {})
            missing = sorted(set(range(self.ranks)) - set(by_rank))
            failed = {rank: detail for rank, (ok, detail) in by_rank.items() if not ok}
            if missing:
                problems.append(f"{name}: no report from rank(s) {missing}")
            if failed:
                problems.append(f"{name}: FAIL {failed}")
        if problems:
            tail = self.output[-3000:]
            pytest.fail("\n".join(problems) + f"\n--- exit code {self.returncode}, output tail:\n{tail}",
                        pytrace=False)


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["BYTESCHED_CHANNEL_PORT"] = str(free_port())
    env.pop("BYTESCHED_ORDER", None)
    return env


def horovod(ranks: int, *args: str, timeout: float) -> Launch:
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    result = run_job([horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo",
                      sys.executable, SCRIPTS / "torch_hvd_equivalence.py", *args], timeout=timeout, env=job_env())
    return Launch(ranks, result.stdout, result.returncode)


@pytest.fixture(scope="module")
def hvd2() -> Launch:
    return horovod(2, "--suite", "full", "--deadlock-runs", "50", timeout=420)


@pytest.fixture(scope="module")
def hvd3() -> Launch:
    return horovod(3, "--suite", "ranks3", "--tolerance", "1e-6", timeout=240)


@pytest.fixture(scope="module")
def dist2() -> Launch:
    torchrun = require_executable("torchrun")
    result = run_job([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                      SCRIPTS / "torch_dist_equivalence.py"], timeout=420, env=job_env())
    return Launch(2, result.stdout, result.returncode)


def matrix_names() -> list[str]:
    names = [f"{opt}/{policy}/split" for opt in OPTIMIZERS for policy in POLICIES]
    return names + [f"{OPTIMIZERS[0]}/{POLICIES[0]}/default"]


TIED = ["tied/sgd/default", "tied/sgd/split", "tied/adam/split"]
HABITS = ["loop/lr_scheduler", "loop/model.zero_grad", "loop/synchronize_clip", "loop/synchronize_amp_clip",
          "mode/barrier", "mode/barrier_clip_without_synchronize", "mode/barrier_amp_without_synchronize",
          "opt/adagrad"]
CHECKPOINT = [f"checkpoint/{opt}/{what}" for opt in ("sgd", "adam")
              for what in ("same_as_unscheduled", "resume_from_scheduled", "resume_from_unscheduled")]
DEADLOCK = [f"no_deadlock/seed={seed}" for seed in range(50)]
PASSING = ["pass/sgd", "pass/adam", "pass/lr_scheduler", "pass/model.zero_grad", "pass/synchronize_clip",
           "pass/synchronize_amp_clip", "pass/backward_passes_per_step=2", "pass/barrier",
           "pass/barrier_clip_without_synchronize", "pass/barrier_amp_without_synchronize",
           "pass/barrier_backward_passes_per_step=2", "off/adam", "off/barrier_clip_without_synchronize"]


# ------------------------------------------------------------------------------------- Horovod

@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_bit_identical_for_every_optimizer_and_policy(hvd2: Launch) -> None:
    """30 steps of a small CNN on 2 ranks: the same bits as plain hvd.DistributedOptimizer."""
    hvd2.check(matrix_names())


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_tied_container_owned_and_loss_only_parameters(hvd2: Launch) -> None:
    hvd2.check(TIED)


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_settings_loop_habits_and_barrier_mode(hvd2: Launch) -> None:
    """backward_passes_per_step, fp16 compression, pre-divide, Sum; LR scheduler, model.zero_grad,
    Horovod's clipping and AMP idioms; barrier mode, also clipping/AMP without synchronize()."""
    hvd2.check(["hvd/backward_passes_per_step=2", "hvd/fp16_compression", "hvd/gradient_predivide_factor=2",
                "hvd/op=Sum", *HABITS])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_checkpoint_round_trip_and_eval(hvd2: Launch) -> None:
    hvd2.check([*CHECKPOINT, "eval/after_step"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_unsupported_cases_name_the_escape_hatch(hvd2: Launch) -> None:
    """LBFGS, step(closure), clipping and AMP between backward and step raise BarrierCrossingError
    naming synchronize() and cross_barrier=False; LBFGS runs in barrier mode."""
    hvd2.check(["unsupported/lbfgs", "unsupported/step_closure", "unsupported/clip_between_backward_and_step",
                "unsupported/amp_between_backward_and_step", "unsupported/lbfgs_in_barrier_mode"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_passes_through_once_the_plan_stays_out(hvd2: Launch) -> None:
    """A plan that stays out hands the gradients to hvd.DistributedOptimizer's own hooks from its
    step on: the same bits as plain Horovod under every loop habit, and LBFGS in barrier mode; with
    scheduling off (BYTESCHED_POLICY=off), from the first step."""
    hvd2.check([*PASSING, "pass/lbfgs_in_barrier_mode"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_horovod_no_deadlock_with_randomly_delayed_backward(hvd2: Launch) -> None:
    hvd2.check(DEADLOCK)
    assert hvd2.returncode == 0, hvd2.output[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_horovod_three_ranks_within_tolerance(hvd3: Launch) -> None:
    """Three-rank sums depend on the order of addition: equal within 1e-6 (RMSprop 1e-4, see
    torch_suites.LOOSER_ON_3_RANKS), on a CNN without ReLU/max-pool decisions to flip."""
    hvd3.check([f"{opt}/bytescheduler/split" for opt in OPTIMIZERS] + ["tied/sgd/default", "tied/sgd/split"])
    assert hvd3.returncode == 0, hvd3.output[-3000:]


# ------------------------------------------------------------------------------- torch.distributed

@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_bit_identical_for_every_optimizer_and_policy(dist2: Launch) -> None:
    """Followers obey rank 0's order: the same bits as a hand-written all-reduce, on the native
    Core (the default for the policies it implements) and on the Python Core."""
    dist2.check(matrix_names() + ["core/auto", "core/off"]
                + [f"python/{opt}/{policy}/split" for opt in ("sgd", "adam") for policy in NATIVE_POLICIES])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_tied_habits_checkpoint_and_eval(dist2: Launch) -> None:
    dist2.check([*TIED, "dist/backward_passes_per_step=2", *HABITS, *CHECKPOINT, "eval/after_step"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_own_all_reduce_right_after_step_meets_no_gradient(dist2: Launch) -> None:
    """The script's all-reduce on the default group right after step(), while gradients are in
    flight: exact sums and the same bits (bytesched reduces in a group of its own)."""
    dist2.check(["loop/all_reduce_after_step", "loop/all_reduce_after_step/sums"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_passes_through_once_the_plan_stays_out(dist2: Launch) -> None:
    """A plan that stays out all-reduces the buckets from backward's hooks in one order on every
    rank from its step on: the same bits as the hand-written all-reduce under every loop habit (with
    scheduling off, from the first step); a gradient clipped while in flight is named."""
    dist2.check([*PASSING, "pass/clip_without_synchronize"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_batching_while_busy_keeps_the_bits(dist2: Launch) -> None:
    """Partitions that become ready while others are in flight start as one all-reduce of up to
    8,000 bytes on every rank (rank 0 announces the batches): the same bits as the hand-written
    all-reduce, on the Python Core and on the native one."""
    dist2.check(["batch/sgd", "batch/adam", "batch/started", "batch/native/sgd", "batch/native/adam",
                 "batch/native/started"])


@pytest.mark.multiproc
@pytest.mark.timeout(480)
def test_distributed_no_deadlock_with_randomly_delayed_backward(dist2: Launch) -> None:
    dist2.check(DEADLOCK)
    assert dist2.returncode == 0, dist2.output[-3000:]
