"""``bytesched profile``: make a model profile for the simulator from a real torch model."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Callable, Sequence

from bytesched.sim.devices import DEVICES

from .model_names import PAPER_MODELS

_DEFAULT_BATCH = {"vgg16": 32, "resnet50": 32, "transformer": 64}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` subcommand."""
    p = subparsers.add_parser(
        "profile", help="make a simulator profile of a torch model (FLOPs on a named GPU, or timed on a real device)",
        description="Write a model profile (layers in forward order with forward/backward time and "
                    "gradient bytes) for `bytesched simulate --profile`. See docs/simulator.md.")
    p.add_argument("model", help=f"{', '.join(PAPER_MODELS)}, or MODULE:CALLABLE returning a torch.nn.Module "
                                 "(or a (module, make_inputs(batch, device)) pair)")
    p.add_argument("--batch", type=int, help="samples per worker (default 32; transformer 64 sentence pairs)")
    p.add_argument("--input-shape", help="shape of one sample for a MODULE:CALLABLE model, e.g. 3,224,224")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--measure", action="store_true",
                     help="time the model with hooks on the device named by --on (CUDA: with CUDA events)")
    how.add_argument("--device", default="V100",
                     help=f"count FLOPs and convert at this GPU's peak ({', '.join(DEVICES)})")
    p.add_argument("--on", default="auto", metavar="DEVICE",
                   help="with --measure: cpu, cuda, cuda:N, or auto (default: the current CUDA device if any, "
                        "else cpu)")
    p.add_argument("--precision", default="fp32",
                   help="fp32, tf32, fp16, bf16 (default fp32): the peak to convert FLOPs at; with --measure, "
                        "the arithmetic timed (tf32 matmuls on CUDA; fp16/bf16 autocast forward)")
    p.add_argument("--efficiency", type=float, default=0.5, help="fraction of the peak sustained (default 0.5)")
    p.add_argument("--repeat", type=int, default=5, help="timed steps with --measure (median per layer)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing with --measure")
    p.add_argument("--name", help="profile name (default: the model's)")
    p.add_argument("-o", "--output", help="write the JSON here (default: print it)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        from . import profiler  # imports torch
        name = args.name or args.model.rsplit(":", 1)[-1]
        model, make_inputs, description = _load_model(args.model, args.input_shape)
        batch = args.batch or _DEFAULT_BATCH.get(args.model, 32)
        if args.measure:
            profile = profiler.measure_profile(name, model, make_inputs, batch, repeat=args.repeat,
                                               warmup=args.warmup, device=args.on, precision=args.precision,
                                               description=description)
        else:
            profile = profiler.flops_profile(name, model, make_inputs, batch, device=args.device,
                                             precision=args.precision, efficiency=args.efficiency,
                                             description=description)
    except (ValueError, ImportError, AttributeError, TypeError) as error:
        print(f"bytesched profile: {error}", file=sys.stderr)
        return 2
    if args.output:
        profile.save(args.output)
        print(f"{profile.name}: {len(profile.layers)} layers, {profile.num_tensors} tensors, "
              f"{profile.nbytes / 1e6:.1f} MB of gradients, {profile.compute_time * 1e3:.2f} ms of compute "
              f"per iteration at batch {profile.batch_size} -> {args.output}")
    else:
        print(json.dumps(profile.to_json(), indent=1))
    return 0


def _load_model(spec: str, input_shape: str | None) -> tuple[Any, Callable[[int, str], Sequence[Any]], str]:
    """A built-in model, or ``module:callable`` from the user's code; with a description."""
    if spec in PAPER_MODELS:
        from .models import BUILDERS, DESCRIPTIONS
        return (*BUILDERS[spec](), DESCRIPTIONS[spec])
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        raise ValueError(f"model {spec!r}: expected one of {', '.join(PAPER_MODELS)} or MODULE:CALLABLE")
    built = getattr(importlib.import_module(module_name), attribute)()
    if isinstance(built, tuple):
        return (*built, spec)
    if input_shape is None:
        raise ValueError(f"model {spec!r} returned a module without an input factory: "
                         f"give --input-shape (one sample, e.g. 3,224,224)")
    try:
        shape = tuple(int(d) for d in input_shape.split(","))
    except ValueError:
        raise ValueError(f"--input-shape {input_shape!r}: expected comma-separated integers, e.g. 3,224,224") from None
    import torch

    def make_inputs(batch: int, device: str) -> tuple[Any, ...]:
        return (torch.randn(batch, *shape, device=device),)

    return built, make_inputs, f"{spec}, one sample of shape ({input_shape})"
