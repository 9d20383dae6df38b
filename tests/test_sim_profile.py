"""Model profiles: the JSON format, the shipped profiles, and making profiles from torch models."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bytesched.sim import Layer, ModelProfile, ProfileError, Tensor, load_profile, shipped_profiles
from bytesched.sim.profile import from_json

from conftest import require

torch = require("torch")
from torch import nn  # noqa: E402 - once torch is known here

from bytesched.cli import main as cli  # noqa: E402 - once torch is known here
from bytesched.sim.devices import get_device  # noqa: E402 - once torch is known here
from bytesched.tools.models import BUILDERS  # noqa: E402 - once torch is known here
from bytesched.tools.profiler import _trace, find_layers, flops_profile, measure_profile  # noqa: E402 - once torch is known here


def tiny() -> nn.Module:
    """Used by the command-line test as ``test_sim_profile:tiny``."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


def tiny_inputs(batch: int, device: str) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, 8, 8, device=device),)


# -- the format -----------------------------------------------------------------------------------
def test_json_round_trip(tmp_path: Path) -> None:
    profile = ModelProfile("m", (Layer("a", 0.001, 0.002, (Tensor("a.w", 400), Tensor("a.b", 8)), update=1e-4),
                                 Layer("b", 0.0, 0.003, ())), batch_size=7, description="d", source={"k": 1})
    path = tmp_path / "m.json"
    profile.save(path)
    assert load_profile(path) == profile
    assert profile.nbytes == 408 and profile.num_tensors == 2
    assert profile.compute_time == pytest.approx(0.0061)


@pytest.mark.parametrize("data, message", [
    ([], "is a JSON object"),
    ({"layers": []}, "non-empty list"),
    ({"layers": [{"name": "x", "forward": -1, "backward": 0}]}, "forward time must be"),
    ({"layers": [{"name": "x", "forward": "1ms", "backward": 0}]}, "forward must be a number"),
    ({"layers": [{"name": "x", "forward": 0, "backward": 0, "tensors": [{"name": "w", "bytes": 6}]}]}, "multiple of 4"),
    ({"layers": [{"name": "x", "forward": 0, "backward": 0,
                  "tensors": [{"name": "w", "bytes": 4}, {"name": "w", "bytes": 4}]}]}, "used twice"),
    ({"layers": [{"name": "x", "forward": 0, "backward": 0, "tensors": [{"bytes": 4}]}]}, "needs 'name' and 'bytes'"),
    ({"format": 9, "layers": []}, "format 9"),
])
def test_malformed_profiles_name_the_culprit(data: object, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        from_json(data, origin="bad.json")


def test_loading_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="shipped ones are .*resnet50.*transformer.*vgg16"):
        load_profile("alexnet")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ProfileError, match="broken.json: not valid JSON"):
        load_profile(broken)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.json")


# -- the shipped profiles -------------------------------------------------------------------------
def test_shipped_profiles_have_the_architectures_parameters() -> None:
    assert {"vgg16", "resnet50", "transformer"} <= set(shipped_profiles())
    parameters = {"vgg16": 138_357_544, "resnet50": 25_557_032, "transformer": 93_324_544}
    for name, count in parameters.items():
        profile = load_profile(name)
        assert profile.nbytes == 4 * count, name
        assert profile.source["device"] == "V100" and profile.source["efficiency"] == 0.5


def test_vgg16_compute_times_are_its_flops_at_the_stated_rate() -> None:
    """Forward FLOPs of each layer from its shape (2 per multiply-add), at 50% of 15.7 TFLOPS."""
    profile = load_profile("vgg16")
    rate = get_device("V100").flops_per_second("fp32", 0.5)
    batch, side, channels, expected = 32, 224, 3, []
    for widths in ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)):
        for width in widths:
            expected.append(2 * 9 * channels * width * side * side * batch)
            channels = width
        side //= 2
    expected += [2 * 25088 * 4096 * batch, 2 * 4096 * 4096 * batch, 2 * 4096 * 1000 * batch]
    assert [round(layer.forward * rate) for layer in profile.layers] == pytest.approx(expected, rel=1e-9)
    # backward: weight and input gradients (2x), but the first layer has no input gradient (1x)
    assert profile.layers[0].backward == pytest.approx(profile.layers[0].forward)
    for layer in profile.layers[1:]:
        assert layer.backward == pytest.approx(2 * layer.forward)


def test_shipped_resnet50_is_what_bytesched_profile_makes() -> None:
    model, make_inputs = BUILDERS["resnet50"]()
    shipped = load_profile("resnet50")
    made = flops_profile("resnet50", model, make_inputs, 32, device="V100", precision="fp32", efficiency=0.5,
                         description=shipped.description)
    assert made.to_json() == shipped.to_json()


# -- making profiles --------------------------------------------------------------------------------
def test_layers_are_parameter_owners_in_call_order() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(4, 4)
            self.attention = nn.MultiheadAttention(4, 2)  # applies out_proj functionally
            self.stem = nn.Linear(4, 4)  # declared last, called first

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            x, _ = self.attention(x, x, x)
            return self.head(x)

    layers = find_layers(Block(), (torch.randn(3, 1, 4),))
    assert [layer.path for layer in layers] == ["stem", "attention", "head"]
    assert [name for name, _ in layers[1].params] == [
        "attention.in_proj_weight", "attention.in_proj_bias", "attention.out_proj.weight", "attention.out_proj.bias"]


def test_measured_profile_of_a_real_model() -> None:
    profile = measure_profile("tiny", tiny(), tiny_inputs, 4, repeat=3, warmup=1)
    assert [layer.name for layer in profile.layers] == ["0", "3"]
    assert [[t.nbytes for t in layer.tensors] for layer in profile.layers] == [[4 * 108, 4 * 4], [4 * 2560, 4 * 10]]
    assert all(layer.forward >= 0 and layer.backward >= 0 for layer in profile.layers)
    assert profile.compute_time > 0
    assert profile.source["method"] == "measured"


class DeferredClock:
    """Readings that are numbers only after ``settle``, as CUDA events are."""

    def __init__(self) -> None:
        self.settled = False

    def read(self) -> list[float]:
        self.settled = False
        return [time.perf_counter()]

    def value(self, reading: list[float]) -> float:
        assert self.settled, "a reading was used before the step was settled"
        return reading[0]

    def settle(self) -> None:
        self.settled = True


def test_a_clock_read_in_hooks_is_resolved_once_the_step_finished() -> None:
    """How GPU time is taken: hooks only record, and the numbers are read after the step."""
    model = tiny()
    owners, steps = _trace(model, tiny_inputs(4, "cpu"), DeferredClock(), steps=2, warmup=1)
    assert len(owners) == 2 and len(steps) == 2
    assert all(len(forward) == len(backward) == 2 and min(forward + backward) >= 0 for forward, backward in steps)


def test_measured_profile_with_autocast_and_precision_errors() -> None:
    profile = measure_profile("tiny", tiny(), tiny_inputs, 4, repeat=1, warmup=0, device="cpu", precision="bf16")
    assert profile.source["precision"] == "bf16" and profile.source["clock"] == "wall"
    with pytest.raises(ValueError, match="tf32 needs a CUDA device"):
        measure_profile("tiny", tiny(), tiny_inputs, 4, device="cpu", precision="tf32")
    with pytest.raises(ValueError, match="precision 'fp8' is unknown"):
        measure_profile("tiny", tiny(), tiny_inputs, 4, device="cpu", precision="fp8")
    assert torch.backends.cuda.matmul.allow_tf32 is False  # restored
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            measure_profile("tiny", tiny(), tiny_inputs, 4, device="cuda")
    with pytest.raises(ValueError, match="expected cpu, cuda or cuda:N"):
        measure_profile("tiny", tiny(), tiny_inputs, 4, device="meta")


def test_profile_command_for_user_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.json"
    assert cli(["profile", "test_sim_profile:tiny", "--input-shape", "3,8,8", "--batch", "4",
                "--device", "A100", "--precision", "tf32", "--efficiency", "0.4", "-o", str(out)]) == 0
    profile = load_profile(out)
    assert profile.batch_size == 4 and profile.source["device"] == "A100"
    assert profile.layers[1].forward == pytest.approx(2 * 256 * 10 * 4 / (156e12 * 0.4))
    assert cli(["profile", "test_sim_profile:tiny", "--batch", "4"]) == 2
    assert "give --input-shape" in capsys.readouterr().err
    assert cli(["profile", "vgg16", "--device", "K80"]) == 2
    assert "device 'K80' is unknown" in capsys.readouterr().err


def test_profile_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["profile", "test_sim_profile:tiny", "--input-shape", "3,8,8", "--batch", "2",
                "--measure", "--repeat", "1", "--warmup", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["source"]["method"] == "measured" and len(data["layers"]) == 2
