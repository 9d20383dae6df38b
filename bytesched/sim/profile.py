"""Model profiles: what the simulator knows about a model (paper §4.1's chain of layers).

A profile lists the layers in forward order; each has its forward and backward compute time on
one device and the byte sizes of its gradient tensors (float32, so a multiple of 4 bytes). The
JSON form is what ``bytesched profile`` writes and ``bytesched simulate --profile`` reads; the
shipped profiles live in ``bytesched/sim/profiles/``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

ELEMENT_BYTES = 4
"""Gradients are float32: partitions are cut on 4-byte element boundaries."""

FORMAT_VERSION = 1


class ProfileError(ValueError):
    """A profile is malformed; the message names the file, the layer and the field."""


@dataclass(frozen=True)
class Tensor:
    """One gradient tensor of a layer (a weight or a bias)."""

    name: str
    nbytes: int


@dataclass(frozen=True)
class Layer:
    """One layer: compute times in seconds on one device, its gradients, and its optimizer
    update time (the work the global barrier also waits for)."""

    name: str
    forward: float
    backward: float
    tensors: tuple[Tensor, ...]
    update: float = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes of all gradients of this layer."""
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class ModelProfile:
    """A model as the simulator sees it: a chain of layers, in forward order."""

    name: str
    layers: tuple[Layer, ...]
    batch_size: int = 1
    description: str = ""
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self, origin=self.name)

    @property
    def nbytes(self) -> int:
        """Bytes of all gradients (what one iteration communicates per worker)."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def compute_time(self) -> float:
        """Forward + backward + update time of one iteration on one device."""
        return sum(layer.forward + layer.backward + layer.update for layer in self.layers)

    @property
    def num_tensors(self) -> int:
        return sum(len(layer.tensors) for layer in self.layers)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form (see :func:`from_json`)."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "description": self.description,
            "batch_size": self.batch_size,
            "source": self.source,
            "layers": [
                {"name": layer.name, "forward": layer.forward, "backward": layer.backward,
                 "update": layer.update,
                 "tensors": [{"name": t.name, "bytes": t.nbytes} for t in layer.tensors]}
                for layer in self.layers
            ],
        }

    def save(self, path: str | Path) -> None:
        """Write the profile as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def from_json(data: Any, *, origin: str = "<profile>") -> ModelProfile:
    """Build a profile from its JSON form, with errors that name ``origin`` and the culprit."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile is a JSON object, got {type(data).__name__}")
    version = data.get("format", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ProfileError(f"{origin}: format {version!r} is not supported (expected {FORMAT_VERSION})")
    layers_data = data.get("layers")
    if not isinstance(layers_data, list) or not layers_data:
        raise ProfileError(f"{origin}: 'layers' must be a non-empty list of layers in forward order")
    layers = []
    for i, entry in enumerate(layers_data):
        where = f"{origin}: layer {i}"
        if not isinstance(entry, dict):
            raise ProfileError(f"{where} is not an object")
        where = f"{origin}: layer {i} ({entry.get('name', '?')!r})"
        tensors_data = entry.get("tensors", [])
        if not isinstance(tensors_data, list):
            raise ProfileError(f"{where}: 'tensors' must be a list of {{'name', 'bytes'}} objects")
        tensors = []
        for t in tensors_data:
            if not isinstance(t, dict) or "name" not in t or "bytes" not in t:
                raise ProfileError(f"{where}: tensor {t!r} needs 'name' and 'bytes'")
            tensors.append(Tensor(str(t["name"]), _integer(t["bytes"], f"{where}: tensor {t['name']!r} bytes")))
        layers.append(Layer(
            name=str(entry.get("name", f"layer{i}")),
            forward=_seconds(entry.get("forward"), f"{where}: forward"),
            backward=_seconds(entry.get("backward"), f"{where}: backward"),
            update=_seconds(entry.get("update", 0.0), f"{where}: update"),
            tensors=tuple(tensors),
        ))
    try:
        return ModelProfile(
            name=str(data.get("name", origin)),
            layers=tuple(layers),
            batch_size=_integer(data.get("batch_size", 1), f"{origin}: batch_size"),
            description=str(data.get("description", "")),
            source=dict(data.get("source", {})),
        )
    except ProfileError as error:
        raise ProfileError(f"{origin}: {error}") from None


def shipped_profiles() -> list[str]:
    """Names of the profiles that come with bytesched (``vgg16``, ``resnet50``, ...)."""
    folder = resources.files("bytesched.sim") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str | Path) -> ModelProfile:
    """A shipped profile by name, or a profile JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {str(path)!r} does not exist")
        text, origin = path.read_text(), str(path)
    else:
        resource = resources.files("bytesched.sim") / "profiles" / f"{name_or_path}.json"
        if not resource.is_file():
            raise ProfileError(f"no profile named {str(name_or_path)!r}: shipped ones are "
                               f"{', '.join(shipped_profiles())}, or give a path to a .json file")
        text, origin = resource.read_text(), f"{name_or_path}.json"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProfileError(f"{origin}: not valid JSON ({error})") from None
    return from_json(data, origin=origin)


def _validate(profile: ModelProfile, *, origin: str) -> None:
    if not profile.layers:
        raise ProfileError("a profile needs at least one layer")
    if profile.batch_size < 1:
        raise ProfileError(f"batch_size must be >= 1, got {profile.batch_size}")
    seen: set[str] = set()
    for layer in profile.layers:
        for value, what in ((layer.forward, "forward"), (layer.backward, "backward"), (layer.update, "update")):
            if not (math.isfinite(value) and value >= 0):
                raise ProfileError(f"layer {layer.name!r}: {what} time must be a finite number of seconds >= 0, "
                                   f"got {value!r}")
        for tensor in layer.tensors:
            if tensor.name in seen:
                raise ProfileError(f"layer {layer.name!r}: tensor name {tensor.name!r} is used twice")
            seen.add(tensor.name)
            if tensor.nbytes < 0 or tensor.nbytes % ELEMENT_BYTES:
                raise ProfileError(f"layer {layer.name!r}: tensor {tensor.name!r} has {tensor.nbytes} bytes, "
                                   f"expected a non-negative multiple of {ELEMENT_BYTES} (float32 gradients)")


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where} must be a number of seconds, got {value!r}")
    return float(value)


def _integer(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{where} must be an integer, got {value!r}")
    return value
