"""Charts of a :class:`~bytesched.sim.predict.Report` (matplotlib, imported only here)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt

from .cluster import format_bandwidth
from .options import format_value
from .simulator import VANILLA

if TYPE_CHECKING:
    from .predict import Report


def plot_report(report: "Report", path: str) -> None:
    """Throughput per policy (left) and speedup over vanilla (right); bars for one cluster,
    lines against the swept variable for a sweep. The ideal lower bound is drawn dashed."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    first = report.predictions[0]
    policies = [r.policy for r in first.results]
    if report.sweep_variable is None:
        _bars(report, left, right, policies)
    else:
        _lines(report, left, right, policies)
    c = first.cluster
    where = f"{c.workers} workers, {c.arch}" + (f" ({c.num_servers} servers)" if c.arch == "ps" else "")
    if report.sweep_variable != "bandwidth":
        where += f", {format_bandwidth(c.bandwidth)}"
    figure.suptitle(f"{first.profile.name}: {where}, {c.topology}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bars(report: "Report", left: plt.Axes, right: plt.Axes, policies: list[str]) -> None:
    p = report.predictions[0]
    x = range(len(policies))
    colors = ["0.55" if name == VANILLA else f"C{i}" for i, name in enumerate(policies)]
    left.bar(x, [r.throughput for r in p.results], color=colors)
    left.axhline(p.samples_per_second(p.ideal_time), linestyle="--", color="k", label="ideal")
    left.set_ylabel("throughput (samples/s)")
    left.legend(loc="lower right")
    right.bar(x, [r.speedup for r in p.results], color=colors)
    right.axhline(p.vanilla.iteration_time / p.ideal_time, linestyle="--", color="k", label="ideal")
    right.axhline(1.0, color="0.3", linewidth=0.8)
    right.set_ylabel("speedup over vanilla")
    right.legend(loc="lower right")
    for axes in (left, right):
        axes.set_xticks(list(x), policies, rotation=20)


def _lines(report: "Report", left: plt.Axes, right: plt.Axes, policies: list[str]) -> None:
    variable = report.sweep_variable or ""
    x = list(range(len(report.predictions)))
    labels = [format_value(variable, p.sweep_value) for p in report.predictions]
    for i, name in enumerate(policies):
        style: dict[str, Any] = {"color": "0.45", "linestyle": ":"} if name == VANILLA else {"color": f"C{i}"}
        left.plot(x, [p.result(name).throughput for p in report.predictions], marker="o", label=name, **style)
        right.plot(x, [p.result(name).speedup for p in report.predictions], marker="o", label=name, **style)
    left.plot(x, [p.samples_per_second(p.ideal_time) for p in report.predictions], "k--", label="ideal")
    right.plot(x, [p.vanilla.iteration_time / p.ideal_time for p in report.predictions], "k--", label="ideal")
    left.set_ylabel("throughput (samples/s)")
    right.set_ylabel("speedup over vanilla")
    for axes in (left, right):
        axes.set_xticks(x, labels)
        axes.set_xlabel(variable)
        axes.grid(alpha=0.3)
    right.legend(fontsize=8)
