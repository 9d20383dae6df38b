"""``bytesched check-gpu`` on the CPU: the half of the GPU check that runs without a GPU.

Two real ranks over Gloo train the check's CNN with an all-reduce after backward and under
ScheduledOptimizer (SGD and Adam, barrier mode and crossing the barrier, through the Core and with
the start-up plan: where it stays out it times the Core's path against the framework's and keeps
one) and must end with the same bits; then DDP and bytesched are timed, each bytesched round with
the plan it made (the figures are not judged here: a benchmark's business). Bad options and a
check that runs out of time end with an error that names them.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import run_job

CHECK = [sys.executable, "-m", "bytesched.tools.check_gpu"]
PLAN = r"(no partitioning, no credit limit|\S+ partitions, \S+ credit)(, .*)?"
"""What a start-up plan's description looks like."""


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_the_cpu_half_is_bit_identical_and_reports_every_configuration() -> None:
    result = run_job([*CHECK, "--device", "cpu", "--json", "--steps", "2", "--rounds", "2", "--warmup", "3",
                      "--equivalence-steps", "6"], timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads(result.stdout[re.search(r"^\{", result.stdout, re.MULTILINE).start():])
    assert report["backend"] == "gloo" and report["world_size"] == 2
    cases = {(row["optimizer"], row["mode"]) for row in report["equivalence"]}
    assert cases == {(o, m) for o in ("sgd", "adam") for m in ("barrier", "cross", "barrier+plan", "cross+plan")}
    for row in report["equivalence"]:
        assert row["tensors"] == 8 and row["identical"] == 8 and row["max_abs_diff"] == 0.0, row
        if row["mode"].endswith("+plan"):  # the plan applied from the third of 16 steps, then the trial
            assert re.fullmatch(PLAN, row["path"]) and _trial_if_staying_out(row["path"]), row
        else:
            assert row["path"] == "the Core, sizes as configured", row
    [timing] = report["timing"]
    assert timing["model"] == "cnn" and timing["gradients"] == 8
    assert all(timing[f"{c}_ms"] > 0 for c in ("ddp", "barrier", "cross"))
    assert timing["cross_vs_ddp"] == pytest.approx(timing["ddp_ms"] / timing["cross_ms"])
    for mode in ("barrier", "cross"):  # each round a job of its own: its plan and trial in the warm-up
        assert timing["rounds_path"][mode][-1] == timing[f"{mode}_plan"] and len(timing["rounds_path"][mode]) == 2
        for path in timing["rounds_path"][mode]:
            assert re.fullmatch(PLAN, path) and _trial_if_staying_out(path), timing


def _trial_if_staying_out(path: str) -> bool:
    """A plan that stays out ran its path trial to the end and says what it kept."""
    return not path.startswith("no partitioning, no credit limit") or bool(
        re.search(r"; path trial: [\d.]+ ms per step on the Core, [\d.]+ passing through: "
                  r"(passing through|keeping the Core)$", path))


@pytest.mark.parametrize("argv, message", [
    (["--models", "cnn,alexnet"], "unknown model(s) alexnet"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--timeout", "0.5"], "still running after 0 s (--timeout)"),
])
def test_bad_options_and_a_late_rank_are_named(argv: list[str], message: str) -> None:
    result = run_job([*CHECK, "--device", "cpu", *argv], timeout=120)
    assert result.returncode == 2 and message in result.stdout, result.stdout[-2000:]
