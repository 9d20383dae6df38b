"""``python -m benchmarks core`` runs end to end and reports every figure (timings are not asserted:
they belong in docs/benchmarks.md, measured on a quiet machine)."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["core", "--subtasks", "2000", "--tensors", "20", "--partitions", "3",
                 "--producers", "2", "--repeats", "2", "--idle-seconds", "0.2", *args]) == 0
    return capsys.readouterr().out


def test_json_output_has_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    result = json.loads(run(capsys, "--json"))
    assert result["benchmark"] == "core"
    assert result["workload"] == {"tensors": 20, "partitions": 3, "piece_bytes": 4000, "producers": 2, "repeats": 2}
    rates = result["subtasks_per_s"]
    assert set(rates) == {"reference", "core_1_producer", "core_concurrent"}
    for name, rate in rates.items():
        per_step = 20 * 3 * (2 if name == "core_concurrent" else 1)
        assert rate["subtasks"] >= 2000 and rate["subtasks"] % per_step == 0, name
        for runs, median in (("runs", "median"), ("cpu_runs", "cpu_median")):
            assert len(rate[runs]) == 2 and all(r > 0 for r in rate[runs]), (name, runs)
            assert abs(rate[median] - statistics.median(rate[runs])) <= 1, (name, median)
    assert rates["core_concurrent"]["producers"] == 2
    assert result["idle"]["seconds"] == 0.2
    assert 0 <= result["idle"]["core_thread_cpu_percent"] < 100
    assert set(result["machine"]) == {"python", "cpus", "load_average_1min"}
    assert len(result["machine"]["load_average_1min"]) == 2  # before and after


def test_text_output_names_each_measurement(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys)
    for label in ("wall time", "CPU time", "bare deque+heap loop (reference)", "Core, 1 producer",
                  "Core, 2 producers", "Core thread CPU while idle"):
        assert label in out


def test_bench_lists_its_benchmarks_and_rejects_bad_counts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "core" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["core", "--repeats", "0"])
    assert exit_.value.code == 2 and "'0' must be positive" in capsys.readouterr().err
