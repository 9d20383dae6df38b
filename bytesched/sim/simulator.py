"""One simulated training run: a model profile on a cluster under one policy, in virtual time.

:func:`run` wires the pieces for one policy (or the vanilla baseline) and measures the
steady-state iteration time:

- every class of identical workers gets a real :class:`~bytesched.core.scheduler.Scheduler`:
  rank 0's class with the policy from :func:`~bytesched.core.policies.make_policy`, the others
  as followers exactly as the runtime Core builds them (all-reduce: ``immediate``, since
  Horovod runs a collective once every rank submitted it; PS: ``rank0`` order, so that every
  worker's uplink carries rank 0's schedule, or ``immediate`` for a policy that never holds a
  sub-task back, as :func:`~bytesched.core.policies.order_mode` decides);
- the backend is :class:`~bytesched.sim.allreduce.Allreduce` or
  :class:`~bytesched.sim.ps.ParameterServer` over a processor-sharing fabric;
- ``vanilla`` is what frameworks do without bytesched: whole tensors in readiness order (the
  ``fifo`` policy), the global barrier, Horovod's tensor fusion for all-reduce, and the
  framework's own key placement for PS. Every other policy crosses the barrier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..core.config import SchedulingParams
from ..core.policies import CreditPolicy, FollowOrderPolicy, ImmediatePolicy, Policy, make_policy, order_mode
from ..core.policies.tictac import Layer as TicTacLayer, TicTacGraph, TicTacPolicy
from ..core.scheduler import Scheduler
from ..core.task import SubTask, fusion_runs, split_elements
from .allreduce import ALLREDUCE, Allreduce, CollectiveCost
from .decoupled import DecoupledAllreduce
from .cluster import Cluster, WorkerSpec
from .engine import EventLoop
from .network import Fabric, FullDuplexFabric, SharedMediumFabric
from .profile import ELEMENT_BYTES, ModelProfile
from .ps import Assignment, ParameterServer, plugin_layout
from .worker import Backend, SimCommTask, TensorPlan, WorkerClass

VANILLA = "vanilla"
"""The baseline every speedup is relative to (see the module docstring)."""

DEFAULT_WARMUP = 2
DEFAULT_ITERATIONS = 2
ASYNC_WARMUP = 6
ASYNC_ITERATIONS = 12
"""At least this many iterations of an asynchronous job are simulated before measuring and
measured: its workers, started apart, settle into a steady state of their own relative timing
over several steps (the throughput-prediction paper drops its first 50 simulated steps of 1000;
here each step is deterministic)."""


class SimulationError(RuntimeError):
    """The simulated job cannot make progress (e.g. a policy deadlocks)."""


@dataclass
class Trace:
    """What rank 0 did, for plots and tests: its finished sub-tasks (with ready, start and
    finish times) and its compute spans ``(iteration, "forward"|"backward", layer, start, end)``."""

    subtasks: list[SubTask]
    compute: list[tuple[int, str, int, float, float]]


@dataclass
class RunResult:
    """One policy's simulated run."""

    policy: str
    iteration_time: float
    iteration_starts: list[float]
    """When rank 0 began each iteration's forward pass."""
    backward_starts: list[float]
    """When rank 0 finished each iteration's forward pass (and began its backward)."""
    partition_bytes: float
    credit_bytes: float | None
    """None if the policy has no credit window (fifo, p3's stop-and-wait, vanilla)."""
    subtasks_per_iteration: float
    leader_policy: Policy
    """Rank 0's policy object after the run (what it learned, e.g. Prophet's profile)."""
    trace: Trace | None = None
    decoupled: bool = False
    """Each all-reduce ran as a reduce-scatter and, in the next forward pass, an all-gather."""
    batch_bytes: float = 0.0
    """Pieces under this many bytes started in batches while busy (0: none did)."""


# -- backends as the workers see them -----------------------------------------------------------
class _AllreduceBackend:
    def __init__(self, ring: Allreduce) -> None:
        self.ring = ring

    def start(self, klass: int, sub: SubTask, task: SimCommTask, done: Callable[[], None]) -> None:
        self.ring.submit(sub, done)

    def start_batch(self, klass: int, batch: Sequence[SubTask], done: Callable[[], None]) -> None:
        self.ring.submit_collective(batch[0].key, sum(sub.nbytes for sub in batch), ALLREDUCE, done)


class _PSBackend:
    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps

    def start(self, klass: int, sub: SubTask, task: SimCommTask, done: Callable[[], None]) -> None:
        plan = task.plan
        update = plan.update * sub.nbytes / plan.nbytes if plan.nbytes else 0.0
        if plan.pieces is not None:
            server = plan.pieces[sub.index][1]
        else:
            server = self.ps.assignment.place(plan.key_base + sub.index, sub.nbytes)
        self.ps.start(klass, sub, server, update, done)


# -- building blocks --------------------------------------------------------------------------
def tensor_plans(profile: ModelProfile, partition_bytes: float,
                 priorities: Sequence[int] | None = None) -> list[TensorPlan]:
    """Every gradient tensor in forward order, with its priority (its forward position unless
    ``priorities`` gives one per tensor) and the number of its first key (partitions are keys)."""
    count = profile.num_tensors
    if priorities is not None and len(priorities) != count:
        raise ValueError(f"priorities has {len(priorities)} entries; {profile.name!r} has {count} tensors")
    plans = []
    key = 0
    index = 0
    for layer_index, layer in enumerate(profile.layers):
        for tensor in layer.tensors:
            share = tensor.nbytes / layer.nbytes if layer.nbytes else 0.0
            plans.append(TensorPlan(
                name=tensor.name, layer=layer_index, nbytes=tensor.nbytes,
                priority=index if priorities is None else int(priorities[index]),
                key_base=key, update=layer.update * share))
            key += len(split_elements(tensor.nbytes // ELEMENT_BYTES, ELEMENT_BYTES, partition_bytes))
            index += 1
    return plans


def fuse(plans: Sequence[TensorPlan], bucket_bytes: float) -> list[TensorPlan]:
    """The tasks of a job whose plugin fuses tensors (the PyTorch plugin's and MXNet over
    Horovod's buckets): runs of consecutive tensors holding at most ``bucket_bytes`` together, a
    larger tensor alone. A bucket is ready with its earliest layer's gradient and has its most
    urgent member's priority."""
    runs = [[plans[i] for i in run] for run in fusion_runs([plan.nbytes for plan in plans], bucket_bytes)]
    return [run[0] if len(run) == 1 else TensorPlan(
        name=f"{run[0].name}+{len(run) - 1}", layer=min(p.layer for p in run), nbytes=sum(p.nbytes for p in run),
        priority=min(p.priority for p in run), key_base=run[0].key_base, update=sum(p.update for p in run),
        layers=tuple(sorted({p.layer for p in run}))) for run in runs]


def make_fabric(cluster: Cluster, loop: EventLoop, classes: Sequence[tuple[WorkerSpec, list[int]]]) -> Fabric:
    """The cluster's network, one flow slot per class of identical workers."""
    multiplicity = [len(ranks) for _, ranks in classes]
    servers = cluster.num_servers if cluster.arch == "ps" else 1
    if cluster.topology == "shared":
        return SharedMediumFabric(loop, cluster.bandwidth, multiplicity, servers)
    bandwidths = [cluster.bandwidth_of(spec) for spec, _ in classes]
    return FullDuplexFabric(loop, bandwidths, multiplicity, servers, cluster.server_capacity)


def collective_cost(cluster: Cluster, fabric: Fabric) -> CollectiveCost:
    """The cost of one all-reduce on ``cluster`` (its algorithm, overhead and latency)."""
    return CollectiveCost(fabric, cluster.workers, overhead=cluster.overhead, latency=cluster.latency,
                          algorithm=cluster.collective)


def transfer_estimate(cluster: Cluster, fabric: Fabric, nbytes: int, partition_bytes: float,
                      pieces: int | None = None) -> float:
    """Seconds to communicate one tensor alone (TicTac's time oracle for a transfer), in
    ``pieces`` messages (default: equal pieces of ``partition_bytes``)."""
    if pieces is None:
        pieces = len(split_elements(nbytes // ELEMENT_BYTES, ELEMENT_BYTES, partition_bytes))
    if cluster.arch == "allreduce":
        return pieces * collective_cost(cluster, fabric).seconds(nbytes / pieces)
    return pieces * 2 * (cluster.overhead + cluster.latency) + 2 * fabric.ps_lower_bound(nbytes, cluster.workers)


def _tictac_graph(profile: ModelProfile, plans: Sequence[TensorPlan], cluster: Cluster, fabric: Fabric,
                  partition_bytes: float, compute_scale: float) -> TicTacGraph:
    comms: list[dict[str, float]] = [{} for _ in profile.layers]
    for plan in plans:
        pieces = None if plan.pieces is None else len(plan.pieces)
        comms[plan.layer][plan.name] = transfer_estimate(cluster, fabric, plan.nbytes, partition_bytes, pieces)
    return TicTacGraph.layer_chain([
        TicTacLayer(forward=layer.forward * compute_scale, backward=layer.backward * compute_scale, comms=comms[i])
        for i, layer in enumerate(profile.layers)])


# -- one run ----------------------------------------------------------------------------------
def run(profile: ModelProfile, cluster: Cluster, policy: str, params: SchedulingParams | None = None, *,
        iterations: int = DEFAULT_ITERATIONS, warmup: int = DEFAULT_WARMUP,
        priorities: Sequence[int] | None = None, trace: bool = False, decoupled: bool = False) -> RunResult:
    """Simulate under ``policy`` (or :data:`VANILLA`) until rank 0 has finished the forward
    pass of iteration ``warmup + iterations``; the iteration time is the mean time between the
    ends of successive forward passes over the last ``iterations`` of them. (With
    ``warmup=0, iterations=1`` that is one backward pass, its communication and the next
    forward pass: the quantity Theorem 1 of the paper minimises.)

    ``priorities`` overrides the tensors' priorities (forward order by default), e.g. to try
    every transmission order; ``trace`` keeps rank 0's sub-tasks and compute spans. With
    ``decoupled`` (all-reduce, not vanilla) every sub-task the policy starts is a reduce-scatter and
    the all-gathers follow in the next forward pass, in buckets of the partition size
    (:mod:`~bytesched.sim.decoupled`).
    """
    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations={iterations} must be >= 1 and warmup={warmup} >= 0")
    if decoupled and (cluster.arch != "allreduce" or policy == VANILLA):
        raise ValueError(f"a decoupled all-reduce needs an all-reduce cluster and a policy, not {cluster.arch} "
                         f"under {policy}")
    params = params or SchedulingParams()
    if decoupled and params.batch_bytes > 0:  # a batch is one whole all-reduce, as torch.distributed runs it
        raise ValueError(f"batching while busy (batch_bytes={params.batch_bytes}) is not modelled with a decoupled "
                         f"all-reduce")
    vanilla = policy == VANILLA
    policy_name = "fifo" if vanilla else policy
    leader_policy = make_policy(policy_name, params)
    partition_bytes = leader_policy.partition_bytes()
    plans = tensor_plans(profile, partition_bytes, priorities)
    buckets = cluster.vanilla_bucket_bytes if vanilla else cluster.bucket_bytes
    if cluster.arch == "allreduce" and buckets > 0:
        plans = fuse(plans, buckets)

    loop = EventLoop()
    classes = cluster.worker_classes()
    fabric = make_fabric(cluster, loop, classes)
    if cluster.arch == "allreduce":
        ring = Allreduce(loop, collective_cost(cluster, fabric), len(classes),
                         fusion_threshold=cluster.fusion_threshold, cycle_time=cluster.cycle_time)
        backend: Backend = DecoupledAllreduce(ring, partition_bytes) if decoupled else _AllreduceBackend(ring)
    else:
        assignment = Assignment(cluster.assignment, cluster.num_servers, cluster.bigarray_bound)
        if not vanilla and cluster.assignment == "mxnet":
            plans = plugin_layout(plans, cluster.num_servers, cluster.bigarray_bound, partition_bytes)
        backend = _PSBackend(ParameterServer(loop, fabric, assignment, len(classes), overhead=cluster.overhead,
                                             latency=cluster.latency, asynchronous=cluster.asynchronous))

    # All-reduce runs as over Horovod, or, batching while busy, as over torch.distributed: every
    # rank starts rank 0's batches, in its order. An asynchronous store's workers each start on
    # readiness.
    batching = not vanilla and cluster.arch == "allreduce" and params.batch_bytes > 0
    need = "ps" if cluster.arch == "ps" and not cluster.asynchronous else "rank0" if batching else "immediate"
    follow_rank0 = not vanilla and order_mode(leader_policy, need=need, world_size=cluster.workers) == "rank0"
    workers: list[WorkerClass] = []
    for index, (spec, _ranks) in enumerate(classes):
        if index == 0:
            policy_object: Policy = leader_policy
        elif follow_rank0:
            policy_object = FollowOrderPolicy(make_policy(policy_name, params))
        else:
            policy_object = ImmediatePolicy(make_policy(policy_name, params))
        if isinstance(policy_object, TicTacPolicy):
            policy_object.set_graph(_tictac_graph(profile, plans, cluster, fabric, partition_bytes, spec.compute))
        workers.append(WorkerClass(index, loop, profile, plans, Scheduler(policy_object), backend,
                                   compute_scale=spec.compute, barrier=vanilla,
                                   update_on_device=cluster.arch == "allreduce",
                                   gather=backend if isinstance(backend, DecoupledAllreduce) else None,
                                   batches=backend if batching and isinstance(backend, _AllreduceBackend) else None))
    leader = workers[0]
    if follow_rank0:
        leader.followers = workers[1:]
    if trace:
        leader.compute_spans = []
        leader.finished_subtasks = []

    if cluster.asynchronous:
        warmup, iterations = max(warmup, ASYNC_WARMUP), max(iterations, ASYNC_ITERATIONS)
    total = warmup + iterations
    # Synchronous workers keep pace with rank 0: its iterations are the job's. Asynchronous ones
    # each keep their own: the job's iteration is their steps' harmonic mean (its samples/s is the
    # sum of theirs), once every one has done ``total``.
    measured = workers if cluster.asynchronous else [leader]
    behind = [len(measured)]

    def reached(k: int) -> None:
        if k == total:
            behind[0] -= 1
            if not behind[0]:
                loop.stop()
    for worker in measured:
        worker.on_backward_start = reached
    for index, worker in enumerate(workers):
        if cluster.asynchronous:  # spread the workers' steps over one step's compute
            loop.call_at(index / len(workers) * worker.compute_time, worker.begin)
        else:
            worker.begin()
    if not loop.run():
        raise SimulationError(_stall_report(policy, workers, loop.now))

    started = leader.scheduler.stats.subtasks_started
    steps = [(w.backward_starts[total] - w.backward_starts[warmup]) / iterations for w in measured]
    return RunResult(
        policy=policy,
        iteration_time=len(steps) / sum(1 / step for step in steps),
        iteration_starts=list(leader.iteration_starts),
        backward_starts=list(leader.backward_starts),
        partition_bytes=partition_bytes,
        credit_bytes=params.credit_bytes if isinstance(leader_policy, CreditPolicy) else None,
        subtasks_per_iteration=started / total,
        leader_policy=leader_policy,
        trace=Trace(leader.finished_subtasks or [], leader.compute_spans or []) if trace else None,
        decoupled=decoupled,
        batch_bytes=params.batch_bytes if batching else 0.0,
    )


def _stall_report(policy: str, workers: Sequence[WorkerClass], now: float) -> str:
    parts = []
    for worker in workers:
        stuck = worker.scheduler.unfinished()
        if stuck:
            names = ", ".join(t.name for t in stuck[:3]) + (" ..." if len(stuck) > 3 else "")
            parts.append(f"worker class {worker.index}: {len(stuck)} tasks unfinished ({names})")
    detail = "; ".join(parts) or "no task unfinished (a compute chain stopped)"
    return f"policy {policy!r}: the simulated job stalled at t={now:.6f}s: {detail}"
