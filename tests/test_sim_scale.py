"""``python -m benchmarks scale``: the share of the available gain and the table it reports."""

from __future__ import annotations

import pytest

from benchmarks.scale import GRID, HELD_OUT, markdown, share, stages_markdown, summary


def row(model: str, plan: float, ideal: float) -> dict[str, object]:
    return {"model": model, "arch": "ps", "workers": 8, "bandwidth": "25Gbps",
            "speedups": {"fifo": 1.0, "bytescheduler": plan, "plan": plan}, "ideal": ideal,
            "achievable": ideal, "plan_partition_bytes": 4e6, "plan_credit_bytes": 16e6,
            "plan_share": share(plan, ideal), "best_share": share(plan, ideal), "decoupled_share": share(plan, ideal),
            "achievable_share": 1.0, "breakdown": None}


def test_share_is_the_part_of_the_ideal_gain_a_speedup_captures() -> None:
    assert share(1.3, 1.6) == pytest.approx(0.5)
    assert share(1.0, 1.0) is None


def test_summary_counts_only_scenarios_with_at_least_five_percent_to_gain() -> None:
    rows = [row("a", 1.3, 1.6), row("b", 1.1, 1.2), row("c", 1.01, 1.02), row("d", 0.99, 1.5)]
    result = summary(rows)
    assert (result["scenarios"], result["counted"]) == (4, 3)
    assert result["median_share"] == pytest.approx(0.5)
    assert result["min_share"] == pytest.approx(-0.02)
    assert (result["below_0.3"], result["below_vanilla"]) == (1, 1)
    table = markdown({"rows": rows, "summary": result})
    # row c's own made-up speedups (1.01, ideal 1.02), printed as the table prints them: no measurement
    assert "| c | PS | 8 | 25 Gbit/s | 1.01x | 1.01x | - | 1.02x | 1.02x | - | 4 / 16 MB | - |" in table
    assert "Over the 3 of 4 scenarios" in table and "Over torch.distributed" not in table


def test_the_all_reduce_rows_over_torch_distributed_have_a_share_of_their_own() -> None:
    """Each all-reduce row's run over torch.distributed is weighed against its own ideal (DDP's);
    rows whose ideal gains under 5 % are left out, a run below DDP is counted."""
    over_torch = [{"speedup": 1.1, "ideal": 1.2, "batch_bytes": 1e8}, {"speedup": 1.0, "ideal": 1.5, "batch_bytes": 0},
                  {"speedup": 0.99, "ideal": 1.01, "batch_bytes": 0}]
    rows = [{**row(m, 1.1, 1.3), "arch": "allreduce", "torch_distributed": t} for m, t in zip("abc", over_torch)]
    result = summary([*rows, row("d", 1.3, 1.6)])
    assert result["torch_distributed_counted"] == 2
    assert result["median_share_over_torch_distributed"] == pytest.approx(0.25)
    assert result["min_share_over_torch_distributed"] == pytest.approx(0.0)
    assert result["torch_distributed_below_ddp"] == 1
    table = markdown({"rows": [*rows, row("d", 1.3, 1.6)], "summary": result})
    # the made-up runs of over_torch above, as the column prints them: no measurement
    assert "| 4 / 16 MB | 1.10x of 1.20x, batching |" in table and "| 4 / 16 MB | 1.00x of 1.50x |" in table
    assert "over the 2 whose ideal gains at least 5 %: median share 0.25, lowest 0.00; 1 below DDP." in table


def test_the_breakdown_says_what_share_each_stage_reaches() -> None:
    # Vanilla takes 15 ms where the ideal takes 10: a stage at 12 ms reaches half the gain.
    stages = [("ideal", 0.010), ("achievable", 0.010), ("free messages", 0.012), ("plan", 0.015)]
    broken_down = {**row("a", 1.0, 1.5), "breakdown": {
        "stages": [{"name": name, "iteration_time": seconds} for name, seconds in stages], "gaps": []}}
    result = summary([broken_down, row("b", 1.1, 1.2), row("c", 1.01, 1.02)])
    assert result["median_share_by_stage"] == pytest.approx({"achievable": 1.0, "free messages": 0.5, "plan": 0.0})
    assert stages_markdown(result).endswith(": achievable 1.00, free messages 0.50, plan 0.00.")
    assert summary([row("b", 1.1, 1.2)])["median_share_by_stage"] == {}
    assert stages_markdown(summary([row("b", 1.1, 1.2)])) == ""


def test_the_held_out_clusters_share_no_worker_count_or_bandwidth_with_the_grid() -> None:
    for arch in GRID.workers:
        assert not set(GRID.workers[arch]) & set(HELD_OUT.workers[arch])
    assert not set(GRID.bandwidths) & set(HELD_OUT.bandwidths)
    assert len(GRID.scenarios()) == 30
