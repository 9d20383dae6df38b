"""bytesched's benchmarks: slow measurements kept out of the installed package and the test suite.

Run from a checkout, ``python -m benchmarks <name>`` (``--help`` lists them): the Core's own
throughput (``core``), the tuner's search cost (``tuning``), the simulator's speed (``sim``),
training on an emulated network (``emulated``), a fault-free soak (``soak``) and bytesched's
per-tensor cost over plain Horovod (``overhead``), the no-settings plan against a grid search in
the simulator (``plan``), the plan's share of the ideal's gain at GPU speed and at scale
(``scale``), a compiled model against compiled DDP (``compiled``) and ``bytesched check-gpu``
across a shaped link (``gpu-shaped``). The emulated network and
device they use live here too (:mod:`benchmarks.emulation`, ``csrc/emulated_device.cc``). Docs: docs/benchmarks.md.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout this package lives in (its parent must be on ``sys.path`` of every process a
benchmark starts: :func:`benchmarks.cli.main` puts it on ``PYTHONPATH``)."""
