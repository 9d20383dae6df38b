"""How the simulator models each all-reduce framework a job can run on (``bytesched simulate
--backend``): what vanilla is, and what the plugin's scheduled path is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """Cluster settings of one framework (None: the cluster's default), and whether its plugin
    batches while busy (the plan then weighs batching with every size)."""

    fusion_threshold: float | None = None
    """Fusion of what is submitted together, vanilla and scheduled alike (Horovod's cycle)."""
    bucket_bytes: float | None = None
    """The plugin's buckets on the scheduled path."""
    vanilla_bucket_bytes: float = 0.0
    """The framework's own buckets on the vanilla path (DDP's)."""
    batches: bool = False

    def cluster_options(self) -> dict[str, float]:
        """The cluster fields this framework sets (for :func:`~bytesched.sim.simulate`)."""
        options = {"fusion_threshold": self.fusion_threshold, "bucket_bytes": self.bucket_bytes,
                   "vanilla_bucket_bytes": self.vanilla_bucket_bytes}
        return {name: value for name, value in options.items() if value is not None}


DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's ``bucket_cap_mb`` default: 25 MiB."""
PLUGIN_BUCKET_BYTES = 1_000_000
"""The PyTorch plugin's ``BYTESCHED_FUSION_BYTES`` default: 1 MB."""

BACKENDS: dict[str, Backend] = {
    # Horovod's background loop fuses what is submitted within a cycle, up to its fusion buffer.
    "horovod": Backend(),
    # c10d runs every collective alone; DDP all-reduces 25 MiB buckets, each once its last
    # gradient is ready; the PyTorch plugin keeps 1 MB buckets and its followers start rank 0's
    # batches.
    "torch-distributed": Backend(fusion_threshold=0, bucket_bytes=PLUGIN_BUCKET_BYTES,
                                 vanilla_bucket_bytes=DDP_BUCKET_BYTES, batches=True),
}
