"""Per-step figures of one rank: iteration time, communication and computation time, the overlap
coefficient α and utilisation (TicTac §3.2), and what the forward pass waited for.

A trace of the PyTorch plugin has the training loop's spans (:mod:`bytesched.plugins.torch.timeline`)
next to the sub-tasks, and then everything is measured. Step ``n`` is the optimizer's ``n``-th
``step()``, and its gradients are the ``n``-th instance of each tensor's task:

- the iteration time ``T`` of step n runs from its marker's begin (its first forward pass) to step
  n+1's (one full period of the training loop; the last step has none);
- the communication time ``N`` is the time within that period with some sub-task in flight (of
  any step: crossing the barrier, step n-1's communication runs during step n's forward pass);
- the computation time ``C`` is step n's forward time minus its forward waits, plus its backward
  time (first to last ready gradient); both lie in the period, so ``T >= max(N, C)`` and α <= 1;
- ``α = (N + C - T) / min(N, C)`` and ``U = 1 / (1 + ρ - α·min(ρ, 1))`` with ``ρ = N / C``
  (``U`` comes to ``C / T``);
- the forward waits of step n are the recorded blocks of its forward pass on a parameter whose
  update (from step n-1's communication) was pending: exact durations.

Traces of older versions (and of plugins that record no compute) lack those spans. Then a step is
a task instance, ``T`` runs from its first ready gradient to the next step's, ``N`` is the union
of the step's own in-flight spans, ``C`` must be given (``compute_s``; without it α and U are
not reported), and a forward wait is only bounded from above: the forward pass of step n+1 reads
tensor i no earlier than backward of step n ended (its last ready gradient) and not before tensor
i's communication finished, so at most
``finish_i - last_ready``. A given ``compute_s`` also overrides a measured ``C``. In both cases
``comm_free`` is the time in the period with nothing in flight (spent computing or idle), and the
last step, which has no period, reports the union of its own in-flight spans as ``N``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from .trace import LoopSpan, SubTaskRecord


@dataclass(frozen=True)
class ForwardWait:
    """The forward pass waited ``wait_s`` for ``tensor``: measured, or an upper bound."""

    tensor: str
    wait_s: float
    measured: bool


@dataclass
class StepSummary:
    """One step of one rank; times in seconds, None where the trace cannot tell."""

    rank: int
    step: int
    subtasks: int
    iteration_s: float | None
    comm_s: float
    comm_free_s: float | None
    backward_span_s: float  # first to last ready gradient
    queued_max_s: float
    compute_s: float | None = None  # measured, or the given override
    forward_wait_s: float | None = None  # all measured forward waits of this step
    alpha: float | None = None
    rho: float | None = None
    utilisation: float | None = None
    forward_waits: list[ForwardWait] = field(default_factory=list)


def union_length(spans: list[tuple[float, float]], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Total length of the union of ``spans`` clipped to ``[lo, hi]``."""
    total, reach = 0.0, lo
    for start, end in sorted(spans):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def overlap(comm_s: float, compute_s: float, iteration_s: float) -> tuple[float, float, float]:
    """(α, ρ, U) of TicTac §3.2 for communication ``N``, computation ``C`` and iteration ``T``."""
    if comm_s <= 0 or compute_s <= 0:
        raise ValueError(f"overlap needs positive communication and computation times, got N={comm_s}, "
                         f"C={compute_s}")
    alpha = (comm_s + compute_s - iteration_s) / min(comm_s, compute_s)
    rho = comm_s / compute_s
    return alpha, rho, 1.0 / (1.0 + rho - alpha * min(rho, 1.0))


def summarise_rank(records: list[SubTaskRecord], loop: Sequence[LoopSpan] = (), *,
                   compute_s: float | None = None, waits_per_step: int = 3) -> list[StepSummary]:
    """The steps of one rank's ``records`` and training-loop spans ``loop``, in order: keyed by the
    step markers when there are any, else by task instance."""
    by_step: dict[int, list[SubTaskRecord]] = defaultdict(list)
    for record in records:
        by_step[record.step].append(record)
    markers = {s.step: s for s in loop if s.kind == "step"}
    if markers:
        return _measured_steps(by_step, markers, loop, compute_s, waits_per_step)
    return _instance_steps(by_step, compute_s, waits_per_step)


def _measured_steps(by_step: dict[int, list[SubTaskRecord]], markers: dict[int, LoopSpan], loop: Sequence[LoopSpan],
                    compute_override: float | None, keep: int) -> list[StepSummary]:
    spans: dict[tuple[str, int], list[LoopSpan]] = defaultdict(list)
    for span in loop:
        spans[span.kind, span.step].append(span)
    all_flights = [(r.start, r.finish) for subs in by_step.values() for r in subs]
    rank = next(iter(markers.values())).rank
    has_compute = any(s.kind == "forward" for s in loop)  # else step markers only (the MXNet plugin)
    summaries = []
    for n in sorted(markers):
        begin = markers[n].begin
        nxt = markers[n + 1].begin if n + 1 in markers else None
        subs = by_step.get(n, [])
        if has_compute:
            waits = spans["forward wait", n]
            waited = sum(w.length for w in waits)
            backward_s = sum(b.length for b in spans["backward", n])
            compute: float | None = sum(f.length for f in spans["forward", n]) - waited + backward_s
            wait_s: float | None = waited
            longest = [ForwardWait(w.tensor or "?", w.length, True)
                       for w in sorted(waits, key=lambda w: -w.length)[:keep]]
        else:
            last_ready = max((r.ready for r in subs), default=begin)
            backward_s = last_ready - min((r.ready for r in subs), default=begin)
            compute, wait_s, longest = None, None, _wait_bounds(subs, last_ready, keep)
        summaries.append(_summary(rank, n, subs, begin, nxt, all_flights, backward_s,
                                  compute if compute_override is None else compute_override, longest, wait_s,
                                  measured=True))
    return summaries


def _instance_steps(by_step: dict[int, list[SubTaskRecord]], compute_s: float | None,
                    keep: int) -> list[StepSummary]:
    all_flights = [(r.start, r.finish) for subs in by_step.values() for r in subs]
    steps = sorted(by_step)
    first_ready = {s: min(r.ready for r in by_step[s]) for s in steps}
    summaries = []
    for i, s in enumerate(steps):
        subs = by_step[s]
        last_ready = max(r.ready for r in subs)
        nxt = first_ready[steps[i + 1]] if i + 1 < len(steps) and steps[i + 1] == s + 1 else None
        summaries.append(_summary(subs[0].rank, s, subs, first_ready[s], nxt, all_flights,
                                  last_ready - first_ready[s], compute_s, _wait_bounds(subs, last_ready, keep), None,
                                  measured=False))
    return summaries


def _summary(rank: int, step: int, subs: list[SubTaskRecord], begin: float, nxt: float | None,
             all_flights: list[tuple[float, float]], backward_s: float, compute_s: float | None,
             waits: list[ForwardWait], wait_s: float | None, measured: bool) -> StepSummary:
    """One row: the step's period runs from ``begin`` to ``nxt`` (None: the last step); a
    ``measured`` step (with markers) counts as ``N`` all communication in its period."""
    iteration = None if nxt is None else nxt - begin
    own_comm = union_length([(r.start, r.finish) for r in subs])
    in_period = None if nxt is None else union_length(all_flights, begin, nxt)
    summary = StepSummary(
        rank=rank, step=step, subtasks=len(subs), iteration_s=iteration,
        comm_s=in_period if measured and in_period is not None else own_comm,
        comm_free_s=None if iteration is None or in_period is None else iteration - in_period,
        backward_span_s=backward_s, queued_max_s=max((r.queued for r in subs), default=0.0),
        compute_s=compute_s, forward_wait_s=wait_s, forward_waits=waits)
    if compute_s is not None and compute_s > 0 and iteration is not None and summary.comm_s > 0:
        summary.alpha, summary.rho, summary.utilisation = overlap(summary.comm_s, compute_s, iteration)
    return summary


def _wait_bounds(subs: list[SubTaskRecord], backward_end: float, keep: int) -> list[ForwardWait]:
    """The ``keep`` tensors whose communication ended longest after backward did."""
    finish: dict[str, float] = {}
    for r in subs:
        finish[r.tensor] = max(finish.get(r.tensor, r.finish), r.finish)
    waits = [ForwardWait(t, end - backward_end, False) for t, end in finish.items() if end > backward_end]
    return sorted(waits, key=lambda w: -w.wait_s)[:keep]


__all__ = ["ForwardWait", "StepSummary", "overlap", "summarise_rank", "union_length"]
