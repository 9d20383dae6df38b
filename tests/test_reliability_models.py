"""Models that differ between ranks (wrong use of the API), on 2 real Horovod ranks.

- Another registration order and forward order on rank 1 (so other priorities and another order
  of ready gradients): harmless, because all-reduces are matched by parameter name. The result must
  be bit-identical to plain ``hvd.DistributedOptimizer``, and ``BYTESCHED_CHECK`` must not mistake
  the other order for divergence (it compared parameters by position before).
- A parameter on one rank only, or of another shape: before, the ranks waited forever for the
  missing collective (stall warnings only); now every rank refuses at construction, naming the
  parameter and the ranks.

One launch runs the three cases (see tests/scripts/reliability_models.py).
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import SCRIPTS, require, require_executable, run_job

MISMATCH = "the model differs between ranks: "


@pytest.fixture(scope="module")
def output() -> str:
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BYTESCHED_")}
    # Small partitions and credit so that the window binds and the two ranks' orders really differ.
    env.update(BYTESCHED_PARTITION_BYTES="512", BYTESCHED_CREDIT_BYTES="1024", BYTESCHED_CHECK="2",
               BYTESCHED_STALL_WARNING_S="5")
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      SCRIPTS / "reliability_models.py", "--case", "order", "--case", "extra", "--case", "shape"],
                     timeout=120, env=env)
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_other_forward_and_registration_order_trains_like_plain_horovod(output: str) -> None:
    found = dict(((int(r), s), p) for r, s, p in re.findall(r"ORDER rank=(\d) scheduled=(\w+) plain=(\w+)", output))
    assert {rank for rank, _ in found} == {0, 1}, output[-4000:]
    assert all(scheduled == plain for (_, scheduled), plain in found.items()), found
    assert len(set(found.values())) == 1, f"ranks ended with different parameters: {found}"
    assert "ParameterDivergence" not in output and "stall:" not in output, output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(150)
@pytest.mark.parametrize("case, culprit", [
    ("extra", "parameter 'gate' (32,) float32 exists on rank(s) 1 but not on rank 0"),
    ("shape", "parameter 'head.weight' is (4, 32) float32 on rank 0 but (4, 16) float32 on rank(s) 1"),
])
def test_parameter_missing_or_reshaped_on_one_rank_is_named_on_every_rank(output: str, case: str,
                                                                          culprit: str) -> None:
    for rank in (0, 1):
        assert f"REFUSED case={case} rank={rank} ModelMismatch: {MISMATCH}{culprit}." in output, output[-4000:]
    assert f"ACCEPTED case={case}" not in output


def test_first_mismatch_names_the_first_differing_parameter_and_every_rank() -> None:
    from bytesched.plugins.torch.consistency import first_mismatch
    same = {"a": "(2,) float32", "b": "(3,) float32"}
    assert first_mismatch([same, dict(reversed(same.items())), same]) is None
    assert first_mismatch([same, {"a": "(2,) float32"}, {"a": "(2,) float32"}]) == \
        "parameter 'b' (3,) float32 exists on rank 0 but not on rank(s) 1, 2"
    assert first_mismatch([same, same, {**same, "b": "(3,) float16"}]) == \
        "parameter 'b' is (3,) float32 on rank 0 but (3,) float16 on rank(s) 2"
