"""``python -m benchmarks gpu-shaped``: ``bytesched check-gpu`` with its two ranks' traffic crossing a
shaped link, so that a GPU job is bound by communication as on a real cluster's network.

``bytesched check-gpu`` puts two ranks on one machine (sharing one GPU over Gloo), where their
all-reduces cross an unshaped loopback and cost little next to the compute. Here the whole check
runs inside a network namespace whose loopback a token-bucket filter limits to ``--bandwidth``
(:func:`benchmarks.emulation.shaped_loopback`): both ranks and both directions share that rate,
like hosts on one hub (the simulator's ``--topology shared``), so a two-rank ring all-reduce of
``S`` bytes moves ``2 S`` through it. The check is unchanged: bit-identical parameters against an
all-reduce after backward, then DDP against bytesched (barrier mode and crossing the barrier, each
round a job with no settings, whose start-up plan and path trial run in the warm-up), real compute
on the GPU (or on the CPU with ``--device cpu``, where the suite runs it).

Needs root and the ``ip`` and ``tc`` tools (iproute2); the namespace is deleted when the check
ends, whatever happens. Docs: docs/gpu.md, "A communication-bound case".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .emulation import ShapingUnavailable, format_rate, parse_rate, shaped_loopback, unavailable_reason
from .provenance import command_line, revision

NAME = "gpu-shaped"
CHECK_OPTIONS = ("device", "models", "batch", "steps", "rounds", "warmup", "equivalence_steps")
"""The options passed on to ``bytesched check-gpu`` unchanged (each as ``--name``)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help="bytesched check-gpu across a shaped link (root, iproute2)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--bandwidth", required=True,
                        help="the shared link's rate, e.g. 10gbit, 2.5gbit, 500mbit (both ranks, both directions)")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="where the ranks compute (auto: cuda when present, else cpu)")
    parser.add_argument("--models", help="comma-separated, as bytesched check-gpu takes them (default: its own)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per iteration (default 32)")
    parser.add_argument("--steps", type=int, default=10, help="timed iterations per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations before each round (default 3)")
    parser.add_argument("--equivalence-steps", type=int, default=10, help="training steps compared (default 10)")
    parser.add_argument("--timeout", type=float, default=540.0,
                        help="seconds before the check is stopped (default 540)")
    parser.add_argument("--json", type=Path, help="also write the report, with the link and the command, here")
    parser.set_defaults(func=main)


def check_argv(args: argparse.Namespace) -> list[str]:
    """The ``bytesched check-gpu`` command line (run as a module, so a checkout needs no install)."""
    argv = [sys.executable, "-m", "bytesched.tools.check_gpu", "--json", "--timeout", repr(args.timeout)]
    for name in CHECK_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def link_floor_ms(gradient_bytes: int, bits_per_second: int) -> float:
    """The least time one iteration's all-reduce takes on the shared link: a two-rank all-reduce
    sends each rank's whole gradient out once (half in its reduce-scatter, half in its all-gather,
    the least any algorithm moves), and both ranks send through the one link."""
    return 2 * gradient_bytes * 8 / bits_per_second * 1e3


def _report(stdout: str) -> dict[str, Any]:
    """check-gpu's JSON report: the object that starts a line of its output (a rank may print
    before it)."""
    start = 0 if stdout.startswith("{") else stdout.index("\n{") + 1
    report, _ = json.JSONDecoder().raw_decode(stdout, start)
    return dict(report)


def main(args: argparse.Namespace) -> int:
    try:
        rate = parse_rate(args.bandwidth)
    except ValueError as error:
        print(f"benchmarks {NAME}: --bandwidth: {error}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason is not None:
        print(f"benchmarks {NAME}: the shaped link cannot be made here: {reason}", file=sys.stderr)
        return 2
    link = f"one shared loopback shaped to {format_rate(rate)} (both ranks, both directions)"
    print(f"network: {link}", flush=True)
    try:
        with shaped_loopback(rate) as ns:
            # a little longer than the check's own timeout, which stops its ranks and reports
            result = subprocess.run([*ns.exec_prefix(), *check_argv(args)], capture_output=True, text=True,
                                    timeout=args.timeout + 60)
    except ShapingUnavailable as error:
        print(f"benchmarks {NAME}: the shaped link cannot be made here: {error}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"benchmarks {NAME}: bytesched check-gpu did not end within {args.timeout + 60:.0f} s",
              file=sys.stderr)
        return 2
    if result.returncode not in (0, 1):  # 1: it ran, and some parameter differed
        print(result.stdout[-4000:] + result.stderr[-4000:], file=sys.stderr)
        print(f"benchmarks {NAME}: bytesched check-gpu failed (exit code {result.returncode})", file=sys.stderr)
        return 2
    report = _report(result.stdout)
    report["link"] = {"bits_per_second": rate, "topology": "shared loopback", "text": link}
    for row in report["timing"]:
        row["link_floor_ms"] = link_floor_ms(row["gradient_bytes"], rate)
    report["meta"] = {"command": command_line(NAME), "revision": revision()}
    from bytesched.tools.gpucheck import format_report  # imports torch
    print(format_report(report))
    print("\nThe link's floor per iteration (each rank's gradients out and in once, through the one link):")
    for row in report["timing"]:
        print(f"{row['model']:<13}{row['gradient_bytes'] / 1e6:,.1f} MB: {row['link_floor_ms']:,.1f} ms "
              f"(DDP at {row['ddp_ms'] / row['link_floor_ms']:.2f}x of it)")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return result.returncode
