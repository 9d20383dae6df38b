"""Gantt chart of one rank's timeline (matplotlib, imported only here): a row per tensor, most
urgent (priority 0) at the top, queued time pale and in-flight time solid, a dashed line where
each step's first gradient became ready."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402

from .trace import SubTaskRecord  # noqa: E402


def plot_rank(records: list[SubTaskRecord], path: str) -> None:
    """Draw ``records`` (one rank's) to the PNG ``path``."""
    origin = min(r.ready for r in records)
    rows = sorted({(r.priority, r.tensor) for r in records})
    row_of = {tensor: i for i, (_, tensor) in enumerate(rows)}
    figure, axes = plt.subplots(figsize=(12, 1.2 + 0.28 * len(rows)))
    queued: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(rows))}
    flying: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(rows))}
    for r in records:
        queued[row_of[r.tensor]].append(((r.ready - origin) * 1e3, (r.start - r.ready) * 1e3))
        flying[row_of[r.tensor]].append(((r.start - origin) * 1e3, (r.finish - r.start) * 1e3))
    for y in range(len(rows)):  # one call per row: a long trace has many thousands of spans
        axes.broken_barh(queued[y], (y - 0.3, 0.6), color="C1", alpha=0.3)
        axes.broken_barh(flying[y], (y - 0.3, 0.6), color="C0")
    for step in sorted({r.step for r in records}):
        first = min(r.ready for r in records if r.step == step)
        axes.axvline((first - origin) * 1e3, color="0.4", linestyle="--", linewidth=0.7)
        axes.text((first - origin) * 1e3, -0.9, f"step {step}", fontsize=7, color="0.3")
    axes.set_yticks(range(len(rows)), [tensor for _, tensor in rows], fontsize=7)
    axes.set_ylim(len(rows) - 0.5, -1.2)
    axes.set_xlabel("ms since the first ready gradient")
    axes.set_title(f"rank {records[0].rank}: queued (pale) and in flight (solid), by priority")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


__all__ = ["plot_rank"]
