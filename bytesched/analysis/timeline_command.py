"""``bytesched timeline``: why was this job not faster? Per step and rank: iteration,
communication and computation time, α and utilisation, the tensors the forward pass waited for
longest, and the sub-tasks that stalled with the rank that held them up."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from bytesched.core.timeline import timeline_path

from .stalls import Stall, find_stalls
from .steps import StepSummary, summarise_rank
from .trace import Trace, TraceError, read_trace

MISSING = {
    "forward": "compute spans (forward, backward): C is taken from --compute-ms, and without it alpha and "
               "utilisation are not reported; forward waits are upper bounds (communication end minus "
               "backward end)",
    "step": "step markers: a step is a task instance, its period the time between first ready gradients",
}
"""What a rank's trace lacks when it has no span of that kind (a trace of an older version)."""


def not_recorded(trace: Trace) -> list[str]:
    """What some rank of ``trace`` did not record, naming the ranks."""
    lacking = []
    for kind, what in MISSING.items():
        ranks = [r for r in trace.ranks if kind not in trace.kinds(r)]
        if ranks:
            lacking.append(f"{what} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})")
    return lacking


@dataclass
class Report:
    """Everything ``bytesched timeline`` prints."""

    ranks: list[int]
    steps: list[StepSummary]
    stall_threshold_s: float
    stalls: list[Stall]
    notes: list[str]
    not_recorded: list[str]


def analyse(trace: Trace, *, compute_s: float | None = None, stall_factor: float = 5.0) -> Report:
    """Summarise every rank's steps and find the stalls across ranks; ``compute_s`` overrides the
    measured computation time of every step."""
    steps = []
    for rank in trace.ranks:
        steps += summarise_rank([r for r in trace.records if r.rank == rank],
                                [s for s in trace.loop if s.rank == rank], compute_s=compute_s)
    threshold, stalls = find_stalls(trace.records, factor=stall_factor)
    return Report(trace.ranks, steps, threshold, stalls, trace.notes, not_recorded(trace))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_report(report: Report) -> None:
    """The human-readable report."""
    for note in report.notes:
        print(f"note: {note}")
    for rank in report.ranks:
        print(f"rank {rank}")
        print(f"  {'step':>4} {'subtasks':>8} {'iter ms':>8} {'comm ms':>8} {'comp ms':>8} {'no-comm ms':>10} "
              f"{'queued max':>10} {'alpha':>6} {'util':>5}  forward waited for (ms; '<=': an upper bound)")
        for s in (s for s in report.steps if s.rank == rank):
            waits = ", ".join(f"{w.tensor} {'' if w.measured else '<='}{_ms(w.wait_s)}"
                              for w in s.forward_waits) or "-"
            print(f"  {s.step:>4} {s.subtasks:>8} {_ms(s.iteration_s):>8} {_ms(s.comm_s):>8} {_ms(s.compute_s):>8} "
                  f"{_ms(s.comm_free_s):>10} {_ms(s.queued_max_s):>10} {_num(s.alpha):>6} {_num(s.utilisation):>5}  "
                  f"{waits}")
    if report.stalls:
        print(f"stalled sub-tasks (in flight >= {_ms(report.stall_threshold_s)} ms):")
        for st in report.stalls:
            why = (f"waited for rank {st.waited_for}, which started it {_ms(st.lateness_s)} ms later"
                   if st.waited_for is not None else "no rank started it late: slow transfer")
            print(f"  {st.tensor} step {st.step} [{st.partition}] on rank {st.rank}: "
                  f"{_ms(st.in_flight_s)} ms in flight; {why}")
    else:
        print(f"no stalled sub-tasks (none in flight >= {_ms(report.stall_threshold_s)} ms)")
    if report.not_recorded:
        print("not in the timeline: " + "; ".join(report.not_recorded))


def run(args: argparse.Namespace) -> int:
    """Read, analyse, print (and plot)."""
    if args.compute_ms is not None and args.compute_ms <= 0:
        print(f"bytesched timeline: --compute-ms must be > 0, got {args.compute_ms}", file=sys.stderr)
        return 2
    try:
        trace = read_trace(args.files)
        report = analyse(trace, compute_s=None if args.compute_ms is None else args.compute_ms / 1e3,
                         stall_factor=args.stall_factor)
    except (TraceError, ValueError) as error:
        print(f"bytesched timeline: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print_report(report)
    if args.plot:
        from .gantt import plot_rank
        for rank in trace.ranks:
            path = timeline_path(args.plot, rank, len(trace.ranks))
            plot_rank([r for r in trace.records if r.rank == rank], [s for s in trace.loop if s.rank == rank],
                      str(path))
            print(f"wrote {path}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bytesched timeline``."""
    parser = subparsers.add_parser("timeline", help="summarise BYTESCHED_TIMELINE traces: overlap, waits, stalls",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+",
                        help="timeline files (one per rank, or the BYTESCHED_TIMELINE value itself: "
                             "tl.json stands for tl.0.json, tl.1.json, ...)")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="computation time of one iteration, overriding the measured one; only needed "
                             "for traces without compute spans (older versions, the MXNet plugin), e.g. "
                             "the iteration time of one rank without communication")
    parser.add_argument("--stall-factor", type=float, default=5.0,
                        help="a sub-task stalled if in flight this many times the median")
    parser.add_argument("--plot", metavar="PNG", help="draw a Gantt chart per rank (out.png -> out.0.png, out.1.png)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
