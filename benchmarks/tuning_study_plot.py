"""Charts of the tuning study (matplotlib, imported only here): search costs in the style of the
paper's Figure 14, and the simulated landscapes the searches walk."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt
import numpy as np

_LABELS = {"bo": "BO", "bo-warm": "BO, warm start", "random": "random", "grid": "grid", "sgd": "SGD+momentum"}


def plot_search_costs(result: dict[str, Any], path: str) -> None:
    """Mean trials to reach the target per scenario (groups) and search (bars), sd as error bars."""
    scenarios = result["scenarios"]
    methods = result["settings"]["methods"]
    width = 0.8 / len(methods)
    figure, axes = plt.subplots(figsize=(9, 4))
    for k, method in enumerate(methods):
        x = np.arange(len(scenarios)) + (k - (len(methods) - 1) / 2) * width
        means = [s["methods"][method]["mean"] for s in scenarios]
        sds = [s["methods"][method]["sd"] for s in scenarios]
        axes.bar(x, means, width, yerr=sds, capsize=3, label=_LABELS.get(method, method), color=f"C{k}")
    axes.set_xticks(range(len(scenarios)), [f"{s['label']}\n@{s['scenario']['bandwidth']}" for s in scenarios])
    settings = result["settings"]
    axes.set_ylabel(f"trials to within {settings['tolerance']:.0%} of grid optimum")
    axes.set_title(f"Search cost in the simulator (mean ± sd over {settings['seeds']} seeds, "
                   f"{settings['noise']:.0%} measurement noise)")
    axes.set_ylim(bottom=0)
    axes.legend(ncol=len(methods), fontsize="small", loc="upper left")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_landscapes(result: dict[str, Any], path: str) -> None:
    """Throughput relative to the best lattice point, one heat map per scenario; the grid
    optimum is circled and the points within tolerance of it are outlined. A lattice with a
    batching axis is shown at the grid optimum's batching threshold."""
    scenarios = result["scenarios"]
    figure, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4), squeeze=False)
    for axis, s in zip(axes[0], scenarios):
        values = np.array(s["iterations_per_s"])
        title = f"{s['label']} @{s['scenario']['bandwidth']}"
        if values.ndim == 3:
            batch = s["grid_optimum"]["point"][2]
            values = values[:, :, batch]
            threshold = s["lattice"]["batch_bytes"][batch]
            title += f"\nbatching under {threshold / 1e6:g} MB" if threshold else "\nno batching"
        relative = values / np.max(s["iterations_per_s"])
        image = axis.imshow(relative, origin="lower", cmap="viridis", vmin=max(0.0, relative.min()), vmax=1.0)
        target = (1 - result["settings"]["tolerance"]) * s["grid_optimum"]["iterations_per_s"]
        axis.contour(values >= target, levels=[0.5], colors="white", linewidths=1)
        gi, gj = s["grid_optimum"]["point"][:2]
        axis.plot(gj, gi, "o", markerfacecolor="none", markeredgecolor="red", markersize=10)
        lattice = s["lattice"]
        ticks = list(range(0, len(lattice["partition_bytes"]), 2))
        axis.set_yticks(ticks, [f"{lattice['partition_bytes'][i] / 1e6:g}" for i in ticks])
        axis.set_xticks(ticks, [f"{lattice['credit_bytes'][j] / 1e6:g}" for j in ticks], rotation=45)
        axis.set_ylabel("partition (MB)")
        axis.set_xlabel("credit (MB)")
        axis.set_title(title, fontsize="small")
        figure.colorbar(image, ax=axis, fraction=0.046, label="throughput / best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
