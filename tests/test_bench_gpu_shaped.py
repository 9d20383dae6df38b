"""``python -m benchmarks gpu-shaped`` on the CPU: bytesched check-gpu inside a namespace whose
loopback is shaped, so the ranks' all-reduces are bound by the link.

The check itself is tested in tests/test_gpucheck.py; here what the shaped link adds: the check
still ends bit-identical, the report names the link, DDP's measured iterations are never faster
than what the token bucket lets through (a bound of physics, not of the machine's speed), and the
namespace is gone afterwards. Bad options and a host that cannot shape are named.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_shaped
from benchmarks.emulation.network import tbf_burst
from conftest import require_shaping, run_job

RATE = 100_000_000
"""The link's bits per second: the check's small CNN (about 0.15 MB of gradients) then needs at
least 25 ms per iteration on it."""


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_the_check_runs_across_the_shaped_link_and_the_link_bounds_ddp(tmp_path: Path) -> None:
    require_shaping()
    out = tmp_path / "shaped.json"
    steps = 4
    result = run_job([sys.executable, "-m", "benchmarks", "gpu-shaped", "--bandwidth", "100mbit", "--device", "cpu",
                      "--models", "cnn", "--rounds", "1", "--steps", str(steps), "--equivalence-steps", "2",
                      "--json", out], timeout=280)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "network: one shared loopback shaped to 100 Mbit/s" in result.stdout
    report = json.loads(out.read_text())
    assert report["link"]["bits_per_second"] == RATE
    assert "python -m benchmarks gpu-shaped --bandwidth 100mbit" in report["meta"]["command"]
    assert all(row["identical"] == row["tensors"] for row in report["equivalence"]), report["equivalence"]
    (row,) = report["timing"]
    assert row["model"] == "cnn" and row["link_floor_ms"] == gpu_shaped.link_floor_ms(row["gradient_bytes"], RATE)
    # one round of DDP: every step sent each rank's gradient out once, less what the full bucket let by at once
    least_s = (2 * row["gradient_bytes"] * steps - tbf_burst(RATE)) * 8 / RATE
    assert row["ddp_ms"] * steps / 1e3 >= least_s, (row, least_s)
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "-lo" not in "".join(line for line in listing.splitlines() if line.startswith("bytesched-")), listing


def _args(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {"bandwidth": "1gbit", "device": "cpu", "models": "cnn", "batch": 32, "steps": 1,
                                 "rounds": 1, "warmup": 0, "equivalence_steps": 1, "timeout": 10.0, "json": None}
    values.update(given)
    return argparse.Namespace(**values)


def test_a_bad_bandwidth_and_a_host_that_cannot_shape_are_named(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_shaped.main(_args(bandwidth="fast")) == 2
    assert "--bandwidth: rate 'fast' is not a bandwidth" in capsys.readouterr().err
    monkeypatch.setattr(gpu_shaped, "unavailable_reason", lambda: "creating network namespaces needs root")
    assert gpu_shaped.main(_args()) == 2
    assert "the shaped link cannot be made here: creating network namespaces needs root" in capsys.readouterr().err


def test_the_check_is_given_every_option_it_takes() -> None:
    argv = gpu_shaped.check_argv(_args(models="resnet50,vgg16", rounds=5, timeout=300.0))
    assert argv[1:5] == ["-m", "bytesched.tools.check_gpu", "--json", "--timeout"]
    pairs = dict(zip(argv[6::2], argv[7::2]))
    assert pairs == {"--device": "cpu", "--models": "resnet50,vgg16", "--batch": "32", "--steps": "1",
                     "--rounds": "5", "--warmup": "0", "--equivalence-steps": "1"}
