"""A training step as the Core saw it, turned into the simulator's model profile.

The Core knows, for every CommTask, its size and the moment its tensor became ready; over one
step that is the backward pass seen from the network: the gaps between consecutive ready times
are the layers' backward compute, and the time from the step's start to the first ready tensor
is the forward pass (plus the loss and the last layer's backward). That is all the simulator
needs to weigh schedules against each other (paper §4.1's chain of layers), measured on the
job's own hardware instead of read from a shipped profile.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bytesched.core import SubTask
from bytesched.sim.profile import ELEMENT_BYTES, Layer, ModelProfile, Tensor


class NothingObserved(RuntimeError):
    """The observed step had no communication to plan for."""


@dataclass
class ObservedTask:
    """One CommTask of the observed step."""

    name: str
    t_ready: float
    nbytes: int


class StepRecorder:
    """Collects the CommTasks whose sub-tasks finish while it is the Core's observer
    (:meth:`Core.observe`); called on the Core thread, read once the Core stopped calling it."""

    def __init__(self) -> None:
        self.tasks: dict[tuple[str, int], ObservedTask] = {}

    def __call__(self, sub: SubTask) -> None:
        task = sub.task
        seen = self.tasks.get((task.name, task.instance))
        if seen is None:
            self.tasks[(task.name, task.instance)] = ObservedTask(task.name, task.t_ready, sub.nbytes)
        else:
            seen.nbytes += sub.nbytes

    def step(self, start: float, end: float) -> list[ObservedTask]:
        """The tasks whose tensors became ready in ``[start, end)``, in the order they did."""
        return sorted((t for t in self.tasks.values() if start <= t.t_ready < end), key=lambda t: t.t_ready)


def measured_profile(tasks: list[ObservedTask], start: float, name: str = "measured") -> ModelProfile:
    """A profile with one layer per task of a step that began at ``start``: backward order is
    the order the tasks became ready, each layer's backward time the gap since the previous one
    (the first gets the median gap), and the forward time before the first ready tensor is
    spread over the layers in proportion to their backward times (a layer's forward costs
    roughly a fixed share of its backward)."""
    if not tasks:
        raise NothingObserved("no gradient was communicated in the observed step")
    gaps = [later.t_ready - earlier.t_ready for earlier, later in zip(tasks, tasks[1:])]
    first = statistics.median(gaps) if gaps else 0.0
    backward = [first, *gaps]
    forward_total = max(tasks[0].t_ready - start - first, 0.0)
    total = sum(backward)
    forward = [forward_total * b / total for b in backward] if total > 0 else \
        [forward_total / len(tasks)] * len(tasks)
    layers = [Layer(f"{index}:{task.name}", forward=f, backward=b,
                    tensors=(Tensor(f"{index}:{task.name}", -(-task.nbytes // ELEMENT_BYTES) * ELEMENT_BYTES),))
              for index, (task, f, b) in enumerate(zip(tasks, forward, backward))]
    layers.reverse()  # forward order: the last tensor backward produced is the first layer's
    return ModelProfile(name, tuple(layers),
                        description="one training step as bytesched's Core observed it")
