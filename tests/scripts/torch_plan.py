"""Run on 2 ranks under ``horovodrun --gloo`` (``--backend horovod``) or ``torchrun``
(``--backend dist``): ScheduledOptimizer with no sizes set, so the start-up plan chooses them.

Cases (``--cases``, in order), each training the 8.4 MB-weight "wide" MLP for 8 steps from the
same weights on the same data as the unscheduled baseline, which it must match bit for bit
(two-rank sums are exact, so how gradients are partitioned cannot change them):

- ``plan``: crossing the barrier, the plan as a user gets it (it measures this loopback network),
  with no trial of the sizes it picks (``BYTESCHED_PLAN_TRIAL=0`` in every case but the ``tried``
  ones: the default over Horovod, and over torch.distributed a trial would switch paths at step 8);
- ``barrier``: the same in barrier mode;
- ``forced``: rank 0's simulation is replaced by one that always picks 1 MB partitions under a
  2 MB credit (only rank 0 runs it), so the follower must apply sizes it never computed itself,
  and the wide weight is then cut in nine pieces on both ranks;
- ``tried``: the same sizes, tried against staying out (``BYTESCHED_PLAN_TRIAL=1``): six steps on
  them, six passing through, and every rank keeps the faster at the same step (whichever it is here);
  18 steps; ``tried-kept``: the same, the trial's margin set so that the sizes always win;
  ``tried-unfused`` (torch.distributed): as ``tried-kept`` on the 16-layer "deep" MLP, its fusion
  unweighed (as on a GPU), whose 16 buckets the trial's steps passing through fuse into 5 (as a
  plan that stays out would) and its return to the sizes lays out as 16 again;
- ``failed``: timing the all-reduce raises on every rank (as a backend error would): the job
  stays out of the way with a warning naming the reason;
- ``sized``: ``BYTESCHED_PARTITION_BYTES`` is set, so there is no plan at all;
- ``fused``: the 16-layer "deep" MLP (9.5 MB, 16 buckets), its optimizer offering its fusion bound
  to the plan as on a GPU (unweighed), ``BYTESCHED_STAY_OUT_PATH=predict``, and rank 0's simulation replaced
  by one that stays out: every rank merges its buckets into 5 tasks (the first one kept) at step 2 and passes through;
- ``reuse``: as ``failed``, then that optimizer is closed and a second one trains a fresh model
  on the same Core (through the Core: the first one passed its gradients to the library);
- ``late`` (torch.distributed): as ``failed``, and while that optimizer passes through, a second
  one is created on the same Core: refused on every rank, naming the way out.
- ``measured``: the default ``BYTESCHED_STAY_OUT_PATH`` (``auto``, which measures) and rank 0's
  simulation replaced by one that stays out: six steps through the Core, six passing through, and
  every rank keeps the faster path (whichever it is here) at the same step; 18 steps;
- ``kept-core`` and ``kept-core-barrier``: the same, with the trial's margin set so that the Core
  always wins, so the optimizer passes through for six steps and then comes back to the Core
  (crossing the barrier, and in barrier mode); ``kept-core-fused`` (torch.distributed): as
  ``kept-core`` on the "deep" MLP, its fusion unweighed (as on a GPU), so the plan fuses its 16
  buckets into 5, and they stay 5 when the trial comes back to the Core.

Every rank prints one ``PLAN {json}`` line per case: every ``Core.set_params`` call it made
(sizes as text, ``inf`` unlimited), the Core's order mode at the end, whether the optimizer passed
its gradients to the library's own path at the end, the step, sizes and fusion bound of
``optimizer.plan``, its number of buckets at the end and after each time they were fused or laid
out again, its summary, and the path trial's and the plan trial's outcomes (``[core ms, own ms,
passes through]``, or null).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Callable

import torch

import bytesched.plugins.torch.optimizer as optimizer_module
import bytesched.runtime.path_trial as path_trial_module
import bytesched.runtime.startup_plan as plan_module
import bytesched.runtime.start_observer as observer_module
from bytesched.core import Core, SchedulingParams
from bytesched.core.config import format_size
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.plugins.torch.native import NativeCore
from bytesched.plugins.torch.pipeline import UpdatePipeline
from bytesched.sim.plan import STAY_OUT, Plan, make_plan
from plan_cases import timed_but_fixed
from torch_harness import OPTIMIZERS, Reporter, new_model, snapshot, train
from torch_suites import DistributedFlavor, Flavor, HorovodFlavor, run_baseline

STEPS = 8
TRIAL_STEPS = 18  # the plan at step 2, six steps through the Core, six passing through, four after
# Path-trial cases: the margin the Core must beat passing through by (None: the library's own).
TRIAL_MARGINS = {"measured": None, "kept-core": -math.inf, "kept-core-barrier": -math.inf,
                 "kept-core-fused": -math.inf}
# Plan-trial cases: the margin the plan's sizes must beat staying out by.
SIZED_TRIAL_MARGINS = {"tried": None, "tried-kept": -math.inf, "tried-unfused": -math.inf}
CORE_MARGIN = path_trial_module.CORE_MARGIN
FORCED = SchedulingParams(partition_bytes=1_000_000, credit_bytes=2_000_000)
SET_PARAMS: list[list[str]] = []
LAYOUTS: list[int] = []  # the optimizer's number of buckets after each fuse() or unfuse()
measure_network = observer_module.measure_network
stay_out_bound = optimizer_module._stay_out_bound
pass_through_margin = optimizer_module._pass_through_margin
weighs_fusion = optimizer_module._weighs_fusion


def recording(set_params: Callable[[Any, SchedulingParams], None]) -> Callable[[Any, SchedulingParams], None]:
    """``set_params`` of a Core class, recording each call's sizes in SET_PARAMS first."""
    def record(core: Any, params: SchedulingParams) -> None:
        SET_PARAMS.append([format_size(params.partition_bytes), format_size(params.credit_bytes)])  # type: ignore[arg-type]
        set_params(core, params)
    return record


# Every Core the plugin may make: the Python one and, over torch.distributed, the native one.
Core.set_params = recording(Core.set_params)  # type: ignore[method-assign]
NativeCore.set_params = recording(NativeCore.set_params)  # type: ignore[method-assign]


def recording(relayout: Callable[..., None]) -> Callable[..., None]:
    """``UpdatePipeline.fuse`` or ``unfuse``, recording how many buckets it left."""
    def record(pipeline: UpdatePipeline, *args: Any) -> None:
        relayout(pipeline, *args)
        LAYOUTS.append(len(pipeline.buckets))
    return record


UpdatePipeline.fuse = recording(UpdatePipeline.fuse)  # type: ignore[method-assign]
UpdatePipeline.unfuse = recording(UpdatePipeline.unfuse)  # type: ignore[method-assign]


def forced_plan(*args: Any, **options: Any) -> Plan:
    """Rank 0's simulation, replaced: always the FORCED sizes (the real one runs first, so the
    case pays what a real plan costs)."""
    real = make_plan(*args, **options)
    return Plan("bytescheduler", FORCED, real.search_iteration_time, real.stay_out_iteration_time,
                real.search_iteration_time)


def staying_out_plan(*args: Any, **options: Any) -> Plan:
    """Rank 0's simulation, replaced (after the real one): always stay out of the way, with sizes
    predicted to gain 10 %: on the CPU that keeps bytesched's path, on a GPU it passes through."""
    real = make_plan(*args, **options)
    stay_out = real.stay_out_iteration_time
    return Plan("fifo", STAY_OUT, stay_out, stay_out, stay_out / 1.1, real.pass_through_margin)


def failing_network(*args: Any) -> Any:
    raise RuntimeError("the all-reduce failed (injected by the test)")


def run_case(flavor: Flavor, backend: str, report: Reporter, case: str, expected: list[torch.Tensor]) -> None:
    SET_PARAMS.clear()
    LAYOUTS.clear()
    os.environ.pop("BYTESCHED_PARTITION_BYTES", None)
    os.environ.pop("BYTESCHED_STAY_OUT_PATH", None)
    os.environ["BYTESCHED_PLAN_TRIAL"] = "1" if case in SIZED_TRIAL_MARGINS else "0"
    staying_out = ("fused", *TRIAL_MARGINS)
    forced = ("forced", *SIZED_TRIAL_MARGINS)
    plan_module.make_plan = forced_plan if case in forced else staying_out_plan if case in staying_out else make_plan  # type: ignore[assignment]
    margin = {**TRIAL_MARGINS, **SIZED_TRIAL_MARGINS}.get(case)
    path_trial_module.CORE_MARGIN = CORE_MARGIN if margin is None else margin
    observer_module.measure_network = (failing_network if case in ("failed", "reuse", "late")  # type: ignore[assignment]
                                       else timed_but_fixed(measure_network) if case in forced else measure_network)
    optimizer_module._stay_out_bound = gpu_stay_out_bound if case == "fused" else stay_out_bound  # type: ignore[assignment]
    optimizer_module._pass_through_margin = (  # type: ignore[assignment]
        gpu_pass_through_margin if case == "fused" else pass_through_margin)
    optimizer_module._weighs_fusion = (  # type: ignore[assignment]
        gpu_weighs_fusion if case in ("fused", "kept-core-fused", "tried-unfused") else weighs_fusion)
    if case == "sized":  # no plan, so no trial to choose either
        os.environ.pop("BYTESCHED_PLAN_TRIAL")
        os.environ["BYTESCHED_PARTITION_BYTES"] = "2MB"
    if case == "reuse":
        train_once(flavor, backend, report, "reuse/first", expected)
    if case == "late":
        train_once(flavor, backend, report, case, expected, then=create_another)
        return
    if case == "fused":  # on a GPU, predicting
        os.environ["BYTESCHED_STAY_OUT_PATH"] = "predict"
    if case in ("tried-unfused", "kept-core-fused"):
        train_once(flavor, backend, report, case, run_baseline(flavor, "deep", "sgd", steps=TRIAL_STEPS), "deep",
                   steps=TRIAL_STEPS)
    elif case in TRIAL_MARGINS or case in SIZED_TRIAL_MARGINS:
        train_once(flavor, backend, report, case, run_baseline(flavor, "wide", "sgd", steps=TRIAL_STEPS),
                   steps=TRIAL_STEPS)
    elif case == "fused":
        train_once(flavor, backend, report, case, run_baseline(flavor, "deep", "sgd", steps=STEPS), "deep")
    else:
        train_once(flavor, backend, report, case, expected)


def gpu_stay_out_bound(config: Any, device: torch.device, backend: Any, model_bytes: int) -> int | None:
    """The optimizer's stay-out fusion bound as on a GPU, here on the CPU."""
    return stay_out_bound(config, torch.device("cuda"), backend, model_bytes)


def gpu_pass_through_margin(config: Any, device: torch.device) -> float:
    """The optimizer's pass-through margin as on a GPU, here on the CPU."""
    return pass_through_margin(config, torch.device("cuda"))


def gpu_weighs_fusion(device: torch.device) -> bool:
    """Whether the plan weighs its fusion, as on a GPU (it does not)."""
    return weighs_fusion(torch.device("cuda"))


def create_another(flavor: Flavor, backend: str, report: Reporter, case: str) -> None:
    """Create a second ScheduledOptimizer on the Core whose first one passes through: refused."""
    model = new_model("wide")
    try:
        ScheduledOptimizer(model, OPTIMIZERS["sgd"](model.parameters()))
    except RuntimeError as error:
        report.result(f"{case}/refused", "create every ScheduledOptimizer before the first step" in str(error),
                      f"message={str(error)[:200]!r}")
    else:
        report.result(f"{case}/refused", False, "a second optimizer was created")


def train_once(flavor: Flavor, backend: str, report: Reporter, case: str, expected: list[torch.Tensor],
               model_name: str = "wide", then: Callable[[Flavor, str, Reporter, str], None] | None = None,
               steps: int = STEPS) -> None:
    model = new_model(model_name)
    inner = OPTIMIZERS["sgd"](model.parameters())
    if backend == "horovod":
        inner = flavor.baseline(model, inner)
    optimizer = ScheduledOptimizer(model, inner, cross_barrier=not case.endswith("barrier"))
    train(model, optimizer, model_name, flavor.rank, steps=steps)
    optimizer.synchronize()
    got = snapshot(model)
    outcome = optimizer.plan
    order = optimizer.core.start_order
    passing = optimizer.passes_through
    buckets = len(optimizer._pipeline.buckets)
    trial, plan_trial = optimizer.path_trial, optimizer.plan_trial
    if then is not None:
        then(flavor, backend, report, case)
    optimizer.close()
    report.same(f"{case}/same_as_unscheduled", expected, got)
    print("PLAN " + json.dumps({
        "case": case, "rank": flavor.rank, "set_params": SET_PARAMS, "order": order, "passes_through": passing,
        "step": None if outcome is None else outcome.step,
        "params": None if outcome is None else [format_size(outcome.params.partition_bytes),  # type: ignore[arg-type]
                                                format_size(outcome.params.credit_bytes)],
        "fusion": None if outcome is None else outcome.fusion_bytes, "buckets": buckets, "layouts": LAYOUTS,
        "summary": None if outcome is None else outcome.summary,
        "trial": None if trial is None else [trial.core_ms, trial.own_ms, trial.passes_through],
        "plan_trial": None if plan_trial is None else [plan_trial.core_ms, plan_trial.own_ms,
                                                       plan_trial.passes_through]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("horovod", "dist"), required=True)
    parser.add_argument("--cases", required=True, help="comma-separated: plan, barrier, forced, failed, sized, "
                                                       "fused, reuse, late, measured, kept-core, "
                                                       "kept-core-barrier, kept-core-fused, tried, tried-kept, "
                                                       "tried-unfused")
    args = parser.parse_args()
    flavor: Flavor = HorovodFlavor() if args.backend == "horovod" else DistributedFlavor()
    torch.set_num_threads(1)
    report = Reporter(flavor.rank)
    expected = run_baseline(flavor, "wide", "sgd", steps=STEPS)
    for case in args.cases.split(","):
        report.run(case, lambda: run_case(flavor, args.backend, report, case, expected))
    report.finish()


if __name__ == "__main__":
    main()
