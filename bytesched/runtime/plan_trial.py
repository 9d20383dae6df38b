"""Whether a start-up plan's sizes are kept, decided by timing them against staying out.

The plan predicts from one observed step and two timed operations; where the network is noisy
while it times them, or the simulator misses a cost (the Core's work per partition, the channel's
announcements), sizes predicted to gain can lose (docs/plan.md, "2-13, where sizes were chosen").
A job that keeps sizes should have seen them win. So, after a sized plan, every rank runs
:data:`~.path_trial.TRIAL_STEPS` steps on its sizes, then as many staying out (no partitioning, no credit limit) on the
framework's own path (passing through), the first step of each left out, and keeps the sizes
only if they ran faster by :data:`~.path_trial.CORE_MARGIN`: otherwise it stays on the
framework's own path, the baseline a user runs without bytesched (in the fusion a plan that
stays out would give the plugin, :attr:`~.plan.StartupPlan.stay_out_fusion`). By default a
parameter server's plan is tried, and a torch.distributed job's on the CPU (:func:`wants_trial`
says why).

Rank 0's medians decide, broadcast to every rank (a parameter server's workers have no
collective but the rank-0 channel's broadcast): in synchronous data-parallel training every rank
runs at the slowest one's pace, so every rank's step lasts as long as rank 0's. A broadcast that
fails in the backend leaves the job where the trial ends, on the framework's own path, with a
warning naming the reason, as the plan's own broadcast does (:mod:`.startup_plan`); one over the rank-0
channel raises, since ranks that cannot hear each other cannot agree on anything. The controller
(:mod:`.path`) counts the trial's steps and decides; :mod:`.startup` carries the medians.
"""

from __future__ import annotations

from bytesched.core import Config


def wants_trial(config: Config, arch: str, announced_on_cpu: bool = False) -> bool:
    """Whether a plan's sizes are tried: ``BYTESCHED_PLAN_TRIAL``, or where unset, on a parameter
    server (``arch="ps"``) and over an all-reduce whose followers wait for rank 0's announced order
    with the gradients on the CPU (``announced_on_cpu``: torch.distributed), not over Horovod.

    Why the backends differ: a sized plan that lost was measured on a parameter server, never
    over Horovod. Over torch.distributed every partition also waits for rank 0's announcement,
    which the simulator does not model, so untried sizes need a larger predicted gain
    (:data:`~.plan.RANK0_ORDER_MARGIN`) than tried ones (:data:`~.plan.RANK0_TRIED_MARGIN`), and
    tried sizes ran faster than staying out. On a GPU it is not the default there: every sized
    plan measured there lost, and none was measured with a trial. Over Horovod a trial that keeps
    the sizes can leave the job slower than the same sizes untried, for as long as it was
    measured (Horovod's response cache takes part). The figures: docs/plan.md ("What it costs")
    and docs/experiments/plan-trial.md."""
    if config.plan_trial is not None:
        return config.plan_trial
    return arch == "ps" or announced_on_cpu
