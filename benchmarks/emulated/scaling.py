"""The profile a cell actually runs: a shipped simulator profile with its sizes and times scaled.

The shipped profiles describe V100-class GPUs on fast networks (VGG16: 553 MB of gradients per
iteration). One 2-core machine cannot move that at a shaped 0.5 Gbit/s in seconds, so a cell
scales gradient sizes by ``size_scale`` and compute times by ``time_scale``; both the emulated
model and the simulator's prediction use the *same* scaled profile, so they describe one job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bytesched.sim.profile import ELEMENT_BYTES, Layer, ModelProfile, Tensor, load_profile


@dataclass(frozen=True)
class Scale:
    """How a profile was shrunk: sizes x ``size``, compute times x ``time``."""

    size: float = 1.0
    time: float = 1.0

    def __post_init__(self) -> None:
        for name in ("size", "time"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"scale {name}={value!r} must be a positive finite number")


def scaled_profile(name: str, scale: Scale) -> ModelProfile:
    """Profile ``name`` (shipped name or JSON path) with every tensor's bytes and every layer's
    times multiplied; a tensor keeps at least one float32 element so no parameter disappears."""
    profile = load_profile(name)
    layers = tuple(
        replace(layer,
                forward=layer.forward * scale.time,
                backward=layer.backward * scale.time,
                update=layer.update * scale.time,
                tensors=tuple(Tensor(t.name, _scaled_bytes(t.nbytes, scale.size)) for t in layer.tensors))
        for layer in profile.layers)
    source = dict(profile.source, scale={"size": scale.size, "time": scale.time})
    return replace(profile, layers=layers, source=source)


def _scaled_bytes(nbytes: int, factor: float) -> int:
    elements = max(1, round(nbytes * factor / ELEMENT_BYTES))
    return elements * ELEMENT_BYTES


def balanced_time_scale(profile: ModelProfile, communication_seconds: float) -> float:
    """The time scale that makes one iteration's compute last ``communication_seconds``
    (compute ~ communication is where scheduling matters most)."""
    compute = sum(layer.forward + layer.backward for layer in profile.layers)
    if compute <= 0:
        raise ValueError(f"profile {profile.name!r} has no compute time to scale")
    return communication_seconds / compute


def layer_sizes(layer: Layer) -> list[int]:
    """Elements of each of the layer's tensors (what the emulated layers allocate)."""
    return [t.nbytes // ELEMENT_BYTES for t in layer.tensors]
