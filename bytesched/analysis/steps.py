"""Per-step figures of one rank: iteration time, communication time, the overlap coefficient α and
utilisation (TicTac §3.2), and the tensors the next forward pass may have waited for.

What the timeline holds is the communication side only: when each gradient partition became
ready (backward produced it), started and finished. So:

- a *step* is a task instance: the n-th gradient of every tensor belongs to step n;
- the iteration time ``T`` of step n is the time from its first ready gradient to step n+1's
  (one full period of the training loop; the last step has none);
- the communication time ``N`` is the length of the union of step n's in-flight spans;
- the computation time ``C`` is not in the timeline (no compute spans): it is given by the user
  (``--compute-ms``, e.g. the iteration time of a single-rank run without communication), and
  only then are ``α = (N + C - T) / min(N, C)`` and ``U = 1 / (1 + ρ - α·min(ρ, 1))`` with
  ``ρ = N / C`` (equal to ``C / T``) reported. ``comm_free`` (time in the period with nothing in
  flight, necessarily spent computing or idle) is a lower bound of ``C`` that needs no input;
- the forward pass of step n+1 reads tensor i no earlier than backward of step n ended (its last
  ready gradient) and not before tensor i's communication finished, so ``finish_i - last_ready``
  bounds from above how long forward waited for tensor i. The timeline has no forward events, so
  an upper bound is what it can tell.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .trace import SubTaskRecord


@dataclass(frozen=True)
class ForwardWait:
    """How long after backward ended a tensor's communication finished (see module doc)."""

    tensor: str
    priority: int
    wait_bound_s: float


@dataclass
class StepSummary:
    """One step of one rank; times in seconds, None where the trace cannot tell."""

    rank: int
    step: int
    subtasks: int
    iteration_s: float | None
    comm_s: float
    comm_free_s: float | None
    backward_span_s: float  # first to last ready gradient: the part of backward the trace sees
    queued_max_s: float
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


def summarise_rank(records: list[SubTaskRecord], *, compute_s: float | None = None,
                   waits_per_step: int = 3) -> list[StepSummary]:
    """The steps of one rank's ``records``, in order."""
    by_step: dict[int, list[SubTaskRecord]] = defaultdict(list)
    for record in records:
        by_step[record.step].append(record)
    all_flights = [(r.start, r.finish) for r in records]
    steps = sorted(by_step)
    first_ready = {s: min(r.ready for r in by_step[s]) for s in steps}
    summaries = []
    for i, s in enumerate(steps):
        subs = by_step[s]
        last_ready = max(r.ready for r in subs)
        nxt = first_ready[steps[i + 1]] if i + 1 < len(steps) and steps[i + 1] == s + 1 else None
        iteration = None if nxt is None else nxt - first_ready[s]
        summary = StepSummary(
            rank=subs[0].rank, step=s, subtasks=len(subs), iteration_s=iteration,
            comm_s=union_length([(r.start, r.finish) for r in subs]),
            comm_free_s=None if nxt is None else iteration - union_length(all_flights, first_ready[s], nxt),
            backward_span_s=last_ready - first_ready[s], queued_max_s=max(r.queued for r in subs),
            forward_waits=_forward_waits(subs, last_ready, waits_per_step))
        if compute_s is not None and iteration is not None and summary.comm_s > 0:
            summary.alpha, summary.rho, summary.utilisation = overlap(summary.comm_s, compute_s, iteration)
        summaries.append(summary)
    return summaries


def _forward_waits(subs: list[SubTaskRecord], backward_end: float, keep: int) -> list[ForwardWait]:
    """The ``keep`` tensors whose communication ended longest after backward did."""
    finish: dict[str, float] = {}
    priority: dict[str, int] = {}
    for r in subs:
        finish[r.tensor] = max(finish.get(r.tensor, r.finish), r.finish)
        priority[r.tensor] = r.priority
    waits = [ForwardWait(t, priority[t], end - backward_end) for t, end in finish.items() if end > backward_end]
    return sorted(waits, key=lambda w: -w.wait_bound_s)[:keep]


__all__ = ["ForwardWait", "StepSummary", "overlap", "summarise_rank", "union_length"]
