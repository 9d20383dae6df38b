"""``bytesched check-gpu``: two ranks on the local GPU check that bytesched trains exactly like
an unscheduled all-reduce and time it against DistributedDataParallel (see
:mod:`.gpucheck`). Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import sys

from .model_names import CHECK_MODELS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bytesched check-gpu``."""
    parser = subparsers.add_parser(
        "check-gpu", help="check bytesched's results and speed against DDP on the local GPU (2 ranks)",
        description="Two ranks share GPU 0 over Gloo (one GPU each over NCCL when there are two or more): "
                    "bit-identical parameters against an unscheduled all-reduce for SGD and Adam in "
                    "barrier mode and crossing the barrier, then milliseconds per iteration of DDP and of "
                    "bytesched on each model. Exit code 1 if any parameter differs. See docs/gpu.md.")
    add_arguments(parser)
    parser.set_defaults(func=main)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check's options (shared by the subcommand and ``python -m``)."""
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="where the ranks compute (auto: cuda when present, else cpu)")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(CHECK_MODELS)} "
                                         "(default: resnet50,vgg16,transformer on cuda, cnn on cpu)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per iteration (default 32)")
    parser.add_argument("--steps", type=int, default=10, help="timed iterations per round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration; the median is "
                                                               "reported (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations before each timed round of "
                                                              "bytesched, once before DDP's (default 3: the "
                                                              "start-up plan applies from the third)")
    parser.add_argument("--equivalence-steps", type=int, default=10, help="training steps compared (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are stopped")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    for name in ("batch", "steps", "rounds", "equivalence_steps"):
        if getattr(args, name) < 1:
            print(f"bytesched check-gpu: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.warmup < 0 or args.timeout <= 0:
        print("bytesched check-gpu: --warmup must be >= 0 and --timeout > 0", file=sys.stderr)
        return 2
    from . import gpucheck  # imports torch
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else ()
    options = gpucheck.CheckOptions(device=args.device, models=models, batch=args.batch, steps=args.steps,
                                    rounds=args.rounds, warmup=args.warmup,
                                    equivalence_steps=args.equivalence_steps, timeout_s=args.timeout)
    try:
        report = gpucheck.run_check(options)
    except gpucheck.CheckError as error:
        print(f"bytesched check-gpu: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else gpucheck.format_report(report))
    return 0 if gpucheck.all_identical(report) else 1


def command_line(argv: list[str] | None = None) -> int:
    """``python -m bytesched.tools.check_gpu [options]``."""
    parser = argparse.ArgumentParser(prog="python -m bytesched.tools.check_gpu",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(command_line())
