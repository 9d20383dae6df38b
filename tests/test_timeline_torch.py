"""A real two-rank PyTorch job with ``BYTESCHED_TIMELINE``: the plugin's step markers, compute spans
and forward waits are in each rank's trace, and ``bytesched timeline`` reports a forward wait that
the job provoked (rank 1's backward pauses before the first layer's gradient in one step) with
about the length of that pause."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bytesched.analysis.trace import read_trace
from bytesched.cli import main

from bytesched.launch.ports import free_port
from conftest import SCRIPTS, require_executable, run_job

STEPS, DELAY_STEP, DELAY_S = 8, 4, 0.4
TENSORS = 6  # three Linear layers: weight and bias each


@pytest.fixture(scope="module")
def job_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch_timeline")
    # Fusion off: one task per tensor, so that each gradient's arrival is on the timeline; no plan,
    # whose staying out would pass the gradients to torch.distributed, off the Core and its trace.
    env = dict(os.environ, BYTESCHED_TIMELINE=str(out / "tl.json"), BYTESCHED_CHANNEL_PORT=str(free_port()),
               BYTESCHED_FUSION_BYTES="1", BYTESCHED_PLAN="0")
    env.pop("BYTESCHED_ORDER", None)
    torchrun = require_executable("torchrun")
    result = run_job([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                      SCRIPTS / "torch_timeline.py", str(STEPS), str(DELAY_STEP), str(DELAY_S)], timeout=180, env=env)
    assert result.returncode == 0 and result.stdout.count("DONE") == 2, result.stdout[-3000:]
    return out


@pytest.mark.multiproc
def test_each_rank_records_step_markers_compute_spans_and_forward_waits(job_trace: Path) -> None:
    trace = read_trace([str(job_trace / "tl.json")])
    assert trace.ranks == [0, 1] and trace.notes == []
    for rank in (0, 1):
        loop = [s for s in trace.loop if s.rank == rank]
        markers = sorted((s for s in loop if s.kind == "step"), key=lambda s: s.step)
        assert [m.step for m in markers] == list(range(STEPS))
        for before, after in zip(markers, markers[1:]):
            assert before.begin < before.end <= after.begin
        for m in markers:
            forward = [s for s in loop if s.kind == "forward" and s.step == m.step]
            backward = [s for s in loop if s.kind == "backward" and s.step == m.step]
            assert len(forward) == 1 and len(backward) == 1, (rank, m.step, forward, backward)
            assert m.begin == forward[0].begin < forward[0].end <= backward[0].begin <= backward[0].end <= m.end
            # Task instance n is step n: its gradients reached the Core (a little after the ready
            # proxy saw them) after this backward pass began and before the next one did.
            ready = [r.ready for r in trace.records if r.rank == rank and r.step == m.step]
            next_backward = min((s.begin for s in loop if s.kind == "backward" and s.step == m.step + 1),
                                default=float("inf"))
            assert len(ready) == TENSORS and all(backward[0].begin <= t < next_backward for t in ready), (rank, m)
            for wait in (s for s in loop if s.kind == "forward wait" and s.step == m.step):
                assert forward[0].begin <= wait.begin <= wait.end <= forward[0].end and wait.tensor
        assert not [s for s in loop if s.kind == "forward wait" and s.step == 0]  # nothing pending yet


@pytest.mark.multiproc
def test_the_report_shows_the_provoked_forward_wait_and_measured_overlap(
        job_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timeline", str(job_trace / "tl.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["not_recorded"] == []
    steps = {(s["rank"], s["step"]): s for s in report["steps"]}
    waited = steps[0, DELAY_STEP + 1]["forward_waits"][0]
    assert waited["tensor"] in ("0.weight", "0.bias") and waited["measured"]
    assert DELAY_S * 0.6 <= waited["wait_s"] <= DELAY_S + 0.25, waited
    for (_rank, step), s in steps.items():
        if step == STEPS - 1:
            assert s["iteration_s"] is None and s["alpha"] is None
            continue
        assert 0 < s["compute_s"] <= s["iteration_s"] and 0 <= s["comm_s"] <= s["iteration_s"]
        if s["comm_s"] == 0:  # nothing in flight in this period (possible on a loaded machine)
            assert s["alpha"] is None
            continue
        assert s["alpha"] <= 1 + 1e-9
        assert s["utilisation"] == pytest.approx(s["compute_s"] / s["iteration_s"])
    assert main(["timeline", str(job_trace / "tl.json")]) == 0
    text = capsys.readouterr().out
    assert f"0.weight {waited['wait_s'] * 1e3:.1f}" in text or f"0.bias {waited['wait_s'] * 1e3:.1f}" in text
    assert "not in the timeline" not in text
