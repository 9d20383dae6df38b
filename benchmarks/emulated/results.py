"""The results file (JSON) and the statistics the report shows.

Every run is kept raw (config, round, samples/s); statistics are computed when reading, so the
report can always be regenerated from the JSON. Speedups are *pairwise*: each round ran every
configuration once, close together in time, and a candidate's speedup in a round is its
samples/s over the baseline's of the same round; the cell shows the median and range of those.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .configs import BASELINE

FORMAT = 1


def save(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def load(path: Path) -> dict[str, Any]:
    """A results file written by :func:`save`; ValueError naming the file if it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read benchmark results ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "groups" not in data:
        raise ValueError(f"{path}: not a `python -m benchmarks emulated` results file (format {FORMAT})")
    return data


@dataclass(frozen=True)
class Spread:
    """Median and range of a few repeats."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> "Spread | None":
        return cls(statistics.median(values), min(values), max(values), len(values)) if values else None


@dataclass(frozen=True)
class CellSummary:
    """One configuration of one group: measured, relative to the baseline, and predicted."""

    config: str
    throughput: Spread | None
    speedup: Spread | None
    predicted_throughput: float | None
    predicted_speedup: float | None
    cpu_per_step: Spread | None = None
    """Seconds of CPU the reporting rank's process used per step (None for files that did not record it)."""
    machine_busy: Spread | None = None
    """Share of the machine's cores busy during the timed steps."""

    @property
    def error(self) -> float | None:
        """Relative prediction error of the median throughput (0.1 = predicted 10% too low)."""
        if self.throughput is None or not self.predicted_throughput:
            return None
        return self.throughput.median / self.predicted_throughput - 1.0


def summarize(group: dict[str, Any]) -> list[CellSummary]:
    """The cells of one group of the results file, in its configuration order."""
    runs_of: dict[str, list[dict[str, Any]]] = {}
    for run in group["runs"]:
        runs_of.setdefault(run["config"], []).append(run)

    def throughput(name: str) -> dict[int, float]:
        return {run["round"]: run["samples_per_second"] for run in runs_of.get(name, [])}

    baseline = throughput(BASELINE)
    predicted = (group.get("prediction") or {}).get("configs", {})
    cells = []
    for name in group["configs"]:
        rounds = throughput(name)
        ratios = [value / baseline[r] for r, value in rounds.items() if r in baseline]
        guess = predicted.get(name, {})
        runs = runs_of.get(name, [])
        cpu = Spread.of([run["cpu_seconds"] / run["steps"] for run in runs if "cpu_seconds" in run])
        busy = Spread.of([run["machine_busy"] for run in runs if run.get("machine_busy") is not None])
        cells.append(CellSummary(name, Spread.of(list(rounds.values())), Spread.of(ratios),
                                 guess.get("samples_per_second"), guess.get("speedup"), cpu, busy))
    return cells


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results files as one report (e.g. the all-reduce matrix and a PS cell run apart).

    Their groups and skipped configurations are concatenated and each run's description kept in
    ``sources``; a model must have been scaled the same way in every file (ValueError if not),
    since the report describes each workload once. A cell (framework, model, bandwidth, ranks)
    measured again by a later file replaces every earlier group of that cell whose configurations
    it all has (in the place of the first of them), and those are listed in ``superseded`` (a
    cell is re-measured after a change that affects it; both stay on record in their files).
    Groups of one cell with other configurations (e.g. the policies measured apart) are kept,
    less the configurations the later file measured again (those are listed in ``superseded``
    too, with ``configs``): every configuration of a cell is reported from its latest run.
    Files are taken in the order they were measured (``meta.started``), whatever order they are
    given in.
    """
    merged: dict[str, Any] = {"format": FORMAT, "sources": [], "workloads": {}, "groups": [], "not_run": [],
                              "superseded": []}
    for part in sorted(parts, key=lambda part: part["meta"].get("started", "")):
        merged["sources"].append(part["meta"])
        for name, workload in part["workloads"].items():
            if merged["workloads"].setdefault(name, workload) != workload:
                raise ValueError(f"model {name!r} was scaled differently in the files being merged "
                                 f"({merged['workloads'][name]} and {workload}); report them separately")
        for group in part["groups"]:
            kept = merged["groups"]
            replaced = [i for i, old in enumerate(kept) if _replaces(group, old)]
            merged["superseded"] += [{"group": kept[i], "by": part["meta"]["command"]} for i in replaced]
            for i, old in enumerate(kept):
                again = _measured_again(group, old) if i not in replaced else set()
                if again:
                    merged["superseded"].append({"group": old, "by": part["meta"]["command"], "configs": sorted(again)})
                    kept[i] = _without(old, again)
            if not replaced:
                kept.append(group)
                continue
            kept[replaced[0]] = group  # in the place of the first group it replaces; the others go
            for i in reversed(replaced[1:]):
                del kept[i]
        merged["not_run"] += part["not_run"]
    return merged


def families(parts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``parts`` split into the sets :func:`merge` can report together, in the order measured: a
    file joins the first set whose models it shares were all scaled the same way (a 4-rank run may
    balance compute at its own all-reduce time, where the matrix balances it at 2 ranks'), else it
    starts a set of its own."""
    found: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []  # (models' scaling, files)
    for part in sorted(parts, key=lambda part: part["meta"].get("started", "")):
        for workloads, files in found:  # noqa: B007 - the break keeps both for below
            if all(workloads.get(name, workload) == workload for name, workload in part["workloads"].items()):
                break
        else:
            workloads, files = {}, []
            found.append((workloads, files))
        for name, workload in part["workloads"].items():
            workloads.setdefault(name, workload)
        files.append(part)
    return [files for _, files in found]


_CELL = ("framework", "model", "bits_per_second", "ranks")


def _same_cell(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    return all(later[k] == earlier[k] for k in _CELL)


def _replaces(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """``later`` measured ``earlier``'s cell again, with every configuration it had."""
    return _same_cell(later, earlier) and set(earlier.get("configs", ())) <= set(later.get("configs", ()))


def _measured_again(later: dict[str, Any], earlier: dict[str, Any]) -> set[str]:
    """The configurations of ``earlier`` (but the baseline, which its others are measured against)
    that ``later`` measured again in the same cell."""
    if not _same_cell(later, earlier):
        return set()
    return (set(earlier.get("configs", ())) & set(later.get("configs", ()))) - {BASELINE}


def _without(group: dict[str, Any], configs: set[str]) -> dict[str, Any]:
    """A copy of ``group`` without ``configs`` and their runs."""
    return {**group, "configs": [c for c in group["configs"] if c not in configs],
            "runs": [run for run in group.get("runs", []) if run["config"] not in configs]}
