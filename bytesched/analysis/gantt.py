"""Gantt chart of one rank's timeline (matplotlib, imported only here): a row per tensor, most
urgent (priority 0) at the top, queued time pale and in-flight time solid; above them, when
recorded, rows for forward and backward compute and forward waits; a dashed line where each step
began (its marker, or else its first ready gradient)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt

from .trace import LoopSpan, SubTaskRecord

LOOP_ROWS = {"forward": "C2", "backward": "C3", "forward wait": "C4"}
"""Training-loop rows drawn above the tensors, with their colours."""


def plot_rank(records: list[SubTaskRecord], loop: list[LoopSpan], path: str) -> None:
    """Draw ``records`` and ``loop`` (one rank's) to the PNG ``path``."""
    origin = min([r.ready for r in records] + [s.begin for s in loop])
    kinds = {s.kind for s in loop}
    labels = [kind for kind in LOOP_ROWS if kind in kinds]
    tensors = sorted({(r.priority, r.tensor) for r in records})
    row_of = {tensor: len(labels) + i for i, (_, tensor) in enumerate(tensors)}
    labels += [tensor for _, tensor in tensors]
    figure, axes = plt.subplots(figsize=(12, 1.2 + 0.28 * len(labels)))
    queued: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(labels))}
    flying: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(labels))}
    for r in records:
        queued[row_of[r.tensor]].append(((r.ready - origin) * 1e3, (r.start - r.ready) * 1e3))
        flying[row_of[r.tensor]].append(((r.start - origin) * 1e3, (r.finish - r.start) * 1e3))
    for y, kind in enumerate(k for k in LOOP_ROWS if k in kinds):
        spans = [((s.begin - origin) * 1e3, s.length * 1e3) for s in loop if s.kind == kind]
        axes.broken_barh(spans, (y - 0.3, 0.6), color=LOOP_ROWS[kind])
    for y in range(len(labels)):  # one call per row: a long trace has many thousands of spans
        axes.broken_barh(queued[y], (y - 0.3, 0.6), color="C1", alpha=0.3)
        axes.broken_barh(flying[y], (y - 0.3, 0.6), color="C0")
    begins = {s.step: s.begin for s in loop if s.kind == "step"}
    if not begins:
        for r in records:
            begins[r.step] = min(begins.get(r.step, r.ready), r.ready)
    for step, begin in sorted(begins.items()):
        axes.axvline((begin - origin) * 1e3, color="0.4", linestyle="--", linewidth=0.7)
        axes.text((begin - origin) * 1e3, -0.9, f"step {step}", fontsize=7, color="0.3")
    axes.set_yticks(range(len(labels)), labels, fontsize=7)
    axes.set_ylim(len(labels) - 0.5, -1.2)
    axes.set_xlabel("ms since the first recorded event")
    axes.set_title(f"rank {records[0].rank}: compute and forward waits (if recorded), then partitions queued "
                   "(pale) and in flight (solid) by priority")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


__all__ = ["plot_rank"]
