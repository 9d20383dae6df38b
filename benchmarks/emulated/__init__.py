"""``python -m benchmarks emulated``: measured throughput of real training stacks on an emulated network.

Each *cell* (framework x model x bandwidth x ranks x configuration) runs real Horovod/Gloo,
torch.distributed or ps-lite transfers between processes of the local host, inside network
namespaces whose links ``tc tbf`` shapes to the cell's bandwidth. Compute is either a real small
model or *emulated*: layers that own real parameter tensors with a simulator profile's sizes and
sleep for its per-layer times, so the CPUs stay free for communication. Before a group's runs a
calibration job times the framework's smallest and whole-gradient operation on that network;
every cell is then predicted by ``bytesched.sim`` on the same topology with those costs, the
simulator picks the sizes of ``bytescheduler-sim``, and the report compares prediction and
measurement.

Modules: :mod:`.scaling` (profile -> the scaled profile a cell runs), :mod:`.torch_compute` and
:mod:`.mxnet_compute` (the models), :mod:`.torch_worker` and :mod:`.mxnet_worker` (the ranks),
:mod:`.protocol` (worker options and result lines), :mod:`.usage` (a run's CPU),
:mod:`.configs` (vanilla and the policies), :mod:`.cells` (the matrix and its order),
:mod:`.calibration` (the measured per-operation cost and bandwidth), :mod:`.runner` (jobs on
``benchmarks.emulation``'s clusters),
:mod:`.prediction` (the simulator's view of a cell and its sizes), :mod:`.results` (JSON and
statistics), :mod:`.report` (markdown and plots), :mod:`.command` (the command line).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``python -m benchmarks emulated``. The command module (and the emulation and simulator it
    needs) is imported here, not at package import, so the worker entry scripts start lean."""
    from .command import register as register_command
    register_command(subparsers)
