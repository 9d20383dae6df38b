"""The start-up plan in the PyTorch plugin, end to end: real 2-rank jobs (horovodrun over Gloo,
torchrun) with no sizes set, against the unscheduled baseline.

Each launch runs several cases of tests/scripts/torch_plan.py (module-scoped fixtures). The
plan's pieces without processes (the observed profile, the calibration's arithmetic, the
conditions it runs under) are in test_plan.py.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any

import pytest

from bytesched.runtime.path_trial import CORE_MARGIN
from conftest import SCRIPTS, require, require_executable, run_job
from test_torch_plugin import Launch, free_port, job_env

PLANNED_STEP = 2
STAY_OUT = ["inf", "inf"]
BUCKETS = 3  # WideMLP's 6 tensors under the default 1 MB fusion: 33 KB, the 8.4 MB weight, 360 KB
DEEP_FUSION = 16 * (384 * 384 + 384) * 4 // 4  # a quarter of DeepMLP's 16 layers (2.37 MB)
# A quarter of WideMLP (2.2 MB): the bound a plan that stays out over torch.distributed fuses up to
# (its three buckets stay three: none of two neighbours fits under it).
WIDE_FUSION = (32 * 256 + 256 + 256 * 8192 + 8192 + 8192 * 10 + 10) * 4 // 4


@dataclasses.dataclass
class PlanLaunch(Launch):
    """A launch of torch_plan.py: its CASE lines, plus each rank's PLAN report per case."""

    backend: str = ""

    def reports(self, case: str) -> dict[int, dict[str, Any]]:
        return self.json_lines("PLAN", case)

    def agreed(self, case: str) -> dict[str, Any]:
        """Unchanged results, and every rank applied the same sizes at the same steps."""
        self.check([f"{case}/same_as_unscheduled"])
        reports = self.reports(case)
        first = reports[0]
        for rank, report in reports.items():
            assert (report["set_params"], report["step"], report["params"], report["order"], report["fusion"],
                    report["buckets"], report["passes_through"], report["trial"], report["plan_trial"]) == \
                (first["set_params"], first["step"], first["params"], first["order"], first["fusion"],
                 first["buckets"], first["passes_through"], first["trial"], first["plan_trial"]), \
                f"{case}: rank {rank} applied {report['set_params']} (plan {report['params']} at step " \
                f"{report['step']}, order {report['order']}), rank 0 {first['set_params']} (plan {first['params']} " \
                f"at step {first['step']}, order {first['order']})"
        return first

    @property
    def backend_order(self) -> str:
        """The order mode the backend needs (Horovod orders collectives itself)."""
        return "immediate" if self.backend == "horovod" else "rank0"


def torch_plan(launcher: list[Any], backend: str, cases: str, timeout: float) -> PlanLaunch:
    env = {**job_env(), "BYTESCHED_LOG_LEVEL": "INFO"}
    env.pop("BYTESCHED_PARTITION_BYTES", None)
    env.pop("BYTESCHED_CREDIT_BYTES", None)
    result = run_job([*launcher, SCRIPTS / "torch_plan.py", "--backend", backend, "--cases", cases],
                     timeout=timeout, env=env)
    return PlanLaunch(2, result.stdout, result.returncode, backend=backend)


@pytest.fixture(scope="module")
def horovod_job() -> PlanLaunch:
    require("horovod.torch", "Horovod built with PyTorch")
    launcher = [require_executable("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable]
    return torch_plan(launcher, "horovod", "plan,barrier,forced,failed,sized,fused,kept-core-barrier,tried-kept",
                      timeout=240)


@pytest.fixture(scope="module")
def dist_job() -> PlanLaunch:
    launcher = [require_executable("torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port())]
    return torch_plan(launcher, "dist", "plan,forced,failed,fused,reuse,late,measured,kept-core,kept-core-fused,"
                      "tried,tried-unfused", timeout=270)


@pytest.fixture(params=["horovod", "dist"])
def job(request: pytest.FixtureRequest) -> PlanLaunch:
    return request.getfixturevalue(f"{request.param}_job")


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_plan_runs_by_default_and_every_rank_applies_rank0s_choice_at_step_2(job: PlanLaunch) -> None:
    """No sizes set: both ranks stay out of the way from step 0, apply the same planned sizes at
    step 2 (passing through if those stay out), and train the same bits as the unscheduled
    baseline; rank 0 logs what it measured."""
    agreed = job.agreed("plan")
    assert agreed["step"] == PLANNED_STEP
    assert agreed["set_params"] == [STAY_OUT, agreed["params"]]
    stays_out = agreed["params"] == STAY_OUT
    assert stays_out or not agreed["passes_through"]
    # Staying out over torch.distributed: from step 2 the path trial runs the Core's path in the
    # buckets' backward order on every rank, as DDP does, instead of rank 0's announcements.
    assert agreed["order"] == ("sequence" if stays_out and job.backend == "dist" else job.backend_order)
    # On the CPU the plan fuses only over torch.distributed, whose buckets pass through.
    assert (agreed["fusion"], agreed["buckets"]) == \
        (WIDE_FUSION if stays_out and job.backend == "dist" else None, BUCKETS)
    rank0 = job.reports("plan")[0]["summary"]
    assert re.search(r"measured 3 gradients \(8\.\d MB, compute \d+ ms\) and the all-reduce .*; chose .*, "
                     r"predicted \d\.\d\dx over staying out", rank0), rank0
    assert "bytesched plan: measured" in job.output


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_followers_apply_sizes_only_rank0_computed(job: PlanLaunch) -> None:
    """Rank 0's simulation always picks 1 MB / 2 MB: the follower applies exactly that at step 2
    (so the 8.4 MB weight is cut alike on both ranks: in rank-0 order, a mismatch would deadlock)."""
    agreed = job.agreed("forced")
    assert agreed["set_params"] == [STAY_OUT, ["1MB", "2MB"]]
    assert agreed["step"] == PLANNED_STEP
    assert agreed["order"] == job.backend_order and not agreed["passes_through"]  # sized: through the Core
    assert (agreed["fusion"], agreed["buckets"]) == (None, BUCKETS)  # sized: the tasks stay as they are


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_plan_that_cannot_be_measured_stays_out_of_the_way_with_a_warning(job: PlanLaunch) -> None:
    agreed = job.agreed("failed")
    assert agreed["set_params"] == [STAY_OUT, STAY_OUT]
    # Staying out: the library's own path from step 2 (over torch.distributed the buckets in
    # backward's order on every rank, as DDP does, with no announcement from rank 0).
    assert agreed["passes_through"]
    assert (agreed["fusion"], agreed["buckets"]) == (WIDE_FUSION if job.backend == "dist" else None, BUCKETS)
    assert "timing the backend's all-reduce failed: the all-reduce failed (injected by the test)" in \
        job.reports("failed")[0]["summary"]
    assert "[bytesched WARNING] bytesched plan: staying out of the way" in job.output


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_plan_that_stays_out_on_a_gpu_fuses_every_ranks_buckets_alike(job: PlanLaunch) -> None:
    """The optimizer offers its fusion bound, unweighed, and its pass-through margin as on a GPU,
    the job predicts its path (BYTESCHED_STAY_OUT_PATH=predict), and the plan stays out: from step 2 every
    rank keeps DeepMLP's first bucket and merges the other 15 into 4, each closed once it holds a
    quarter of the model (5 in all), with the baseline's bits, and passes through although sizes were predicted
    to gain 10 % (predicting on the CPU keeps bytesched's path; the 5 buckets are what passing
    through all-reduces over torch.distributed)."""
    agreed = job.agreed("fused")
    assert agreed["set_params"] == [STAY_OUT, STAY_OUT] and agreed["step"] == PLANNED_STEP
    assert (agreed["fusion"], agreed["buckets"]) == (DEEP_FUSION, 5) and agreed["passes_through"]
    assert job.reports("fused")[0]["summary"].endswith(
        "; the best sizes predicted 1.10x; passing through; gradients fused into tasks filled to 2.36544MB")
    assert job.reports("fused")[1]["summary"] == ("rank 0's plan: no partitioning, no credit limit, "
                                                  "gradients fused into tasks filled to 2.36544MB, passing through")


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_plan_in_barrier_mode(horovod_job: PlanLaunch) -> None:
    agreed = horovod_job.agreed("barrier")
    assert agreed["step"] == PLANNED_STEP and agreed["set_params"] == [STAY_OUT, agreed["params"]]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_explicit_sizes_win_over_the_plan(horovod_job: PlanLaunch) -> None:
    """BYTESCHED_PARTITION_BYTES set: no plan, and the sizes are never switched."""
    agreed = horovod_job.agreed("sized")
    assert agreed["step"] is None and agreed["set_params"] == [] and agreed["buckets"] == BUCKETS


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_an_optimizer_created_after_another_closed_trains_on_the_same_core(dist_job: PlanLaunch) -> None:
    """The first optimizer stays out of the way and passes through; once it is closed, a second
    one (a fresh model) trains on the same Core in rank-0 order, and both end with the baseline's
    bits."""
    dist_job.check(["reuse/first/same_as_unscheduled", "reuse/same_as_unscheduled"])
    assert [dist_job.reports("reuse/first")[0]["passes_through"], dist_job.reports("reuse")[0]["order"]] == \
        [True, "rank0"]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_no_optimizer_joins_a_core_whose_optimizer_passes_through_on_torch_distributed(dist_job: PlanLaunch) -> None:
    """Its collectives would interleave with the passing optimizer's in a different order on each
    rank: refused on every rank, naming the way out."""
    dist_job.check(["late/same_as_unscheduled", "late/refused"])


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_path_trial_keeps_the_faster_path_on_every_rank_at_the_same_step(dist_job: PlanLaunch) -> None:
    """No BYTESCHED_STAY_OUT_PATH (auto, which measures) and a plan that stays out: six steps
    through the Core, six passing through, then every rank keeps the same path, chosen from the
    slowest rank's medians, with the baseline's bits (over Horovod, the next test's trial runs the
    same code)."""
    agreed = dist_job.agreed("measured")
    assert agreed["set_params"] == [STAY_OUT, STAY_OUT] and agreed["step"] == PLANNED_STEP
    core_ms, own_ms, passes = agreed["trial"]
    assert core_ms > 0 and own_ms > 0
    assert passes == (not core_ms < own_ms * (1 - CORE_MARGIN)) == agreed["passes_through"]
    assert "bytesched: the plan stayed out of the way; path trial: " in dist_job.output


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_path_trial_that_keeps_the_core_comes_back_from_passing_through(job: PlanLaunch) -> None:
    """The trial's margin makes the Core win: after six steps passing through, every rank hooks
    its gradients back on the Core's path (over torch.distributed in the buckets' sequence; over
    Horovod in barrier mode), and the last four steps still match the baseline bit for bit."""
    case = "kept-core" if job.backend == "dist" else "kept-core-barrier"
    agreed = job.agreed(case)
    assert agreed["trial"][2] is False and not agreed["passes_through"]
    assert agreed["order"] == ("sequence" if job.backend == "dist" else job.backend_order)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_path_trial_that_keeps_the_core_keeps_the_plans_fused_buckets(dist_job: PlanLaunch) -> None:
    """The plan stayed out and fused DeepMLP's 16 buckets into 5; the path trial's return to the
    Core keeps those 5, which is the sequence every rank agreed on (in other buckets the Core's
    tasks would not be in it, and the job would stop)."""
    agreed = dist_job.agreed("kept-core-fused")
    assert agreed["trial"][2] is False and not agreed["passes_through"] and agreed["order"] == "sequence"
    assert agreed["layouts"] == [5] and agreed["buckets"] == 5 and agreed["fusion"] == DEEP_FUSION


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_sized_plans_trial_keeps_the_faster_on_every_rank_at_the_same_step(job: PlanLaunch) -> None:
    """The forced 1 MB / 2 MB plan is tried: six steps on the sizes through the Core, six staying
    out and passing through, then every rank keeps what rank 0's medians chose at step 14 (over
    torch.distributed whichever was faster here; over Horovod the trial's margin makes the sizes
    win, so the gradients come back to the Core), with the baseline's bits. Over
    torch.distributed the steps passing through fuse the buckets as a plan that stays out would
    (WideMLP's three stay three), and a return to the sizes lays them out again."""
    case = "tried" if job.backend == "dist" else "tried-kept"
    agreed = job.agreed(case)
    sized_ms, staying_out_ms, passes = agreed["plan_trial"]
    assert sized_ms > 0 and staying_out_ms > 0
    assert passes == (False if case == "tried-kept" else not sized_ms < staying_out_ms * (1 - CORE_MARGIN))
    sized = ["1MB", "2MB"]
    assert agreed["set_params"] == [STAY_OUT, sized, STAY_OUT] + ([] if passes else [sized])
    expected = (STAY_OUT, PLANNED_STEP + 6) if passes else (sized, PLANNED_STEP + 12)
    assert (agreed["params"], agreed["step"]) == expected
    assert agreed["passes_through"] == passes and agreed["order"] == job.backend_order
    assert agreed["layouts"] == ([] if job.backend == "horovod" else [BUCKETS] + ([] if passes else [BUCKETS]))
    assert "bytesched plan trial: " in job.output


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_a_sized_plans_trial_times_staying_out_in_fused_buckets_and_returns_to_the_sizes_unfused(
        dist_job: PlanLaunch) -> None:
    """Over torch.distributed, DeepMLP's 16 buckets: the trial's six steps passing through run
    them fused into 5, as a plan that stays out would give them; the sizes win (the trial's margin
    says so), and the Core's path gets its 16 buckets back, with the baseline's bits."""
    agreed = dist_job.agreed("tried-unfused")
    assert agreed["plan_trial"][2] is False and not agreed["passes_through"]
    assert agreed["set_params"] == [STAY_OUT, ["1MB", "2MB"], STAY_OUT, ["1MB", "2MB"]]
    assert agreed["layouts"] == [5, 16] and agreed["buckets"] == 16
    assert agreed["fusion"] is None  # the sizes' outcome keeps the plugin's own bound
