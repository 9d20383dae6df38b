"""Peak throughput of the devices profiles can be computed for (vendor data sheets, dense math).

A FLOP-derived profile's compute time is ``FLOPs / (peak * efficiency)``: the efficiency says
what fraction of the peak a training step really sustains (memory-bound layers, kernel launch
gaps), so it is recorded in every profile made this way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """Peak dense TFLOPS per precision."""

    name: str
    peak_tflops: dict[str, float]

    def flops_per_second(self, precision: str, efficiency: float) -> float:
        """Sustained FLOP/s at ``efficiency`` of the ``precision`` peak."""
        if precision not in self.peak_tflops:
            raise ValueError(f"device {self.name}: precision {precision!r} is unknown: "
                             f"expected one of {', '.join(self.peak_tflops)}")
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency={efficiency!r} must be in (0, 1]")
        return self.peak_tflops[precision] * 1e12 * efficiency


DEVICES: dict[str, Device] = {
    # NVIDIA Tesla V100 SXM2 (the ByteScheduler paper's testbed GPU).
    "V100": Device("V100", {"fp32": 15.7, "fp16": 125.0}),
    # NVIDIA A100 SXM4: TF32 and FP16/BF16 tensor cores, dense.
    "A100": Device("A100", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    # NVIDIA H100 SXM5, dense.
    "H100": Device("H100", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
    # NVIDIA H200 SXM, dense: the H100's compute with faster, larger memory (HBM3e).
    "H200": Device("H200", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}),
}


def get_device(name: str) -> Device:
    """The device called ``name`` (case-insensitive), with an error listing the known ones."""
    for key, device in DEVICES.items():
        if key.lower() == name.lower():
            return device
    raise ValueError(f"device {name!r} is unknown: expected one of {', '.join(DEVICES)}")
