"""The simulator's prediction for a group of cells: the same scaled profile, rank count,
bandwidth, architecture and topology as the measured job, every configuration as the policy
(and sizes) it runs."""

from __future__ import annotations

from typing import Any

from ...sim.predict import simulate
from ...sim.simulator import VANILLA
from ...sim.profile import ModelProfile
from .cells import Group


def predict_group(group: Group, profile: ModelProfile, topology: str) -> dict[str, Any]:
    """Predicted samples/s and speedup per configuration of ``group``, the ideal (zero
    overhead, perfect overlap) speedup, and the cluster the simulator modelled.

    ``topology`` is the simulator's (``full-duplex`` or ``shared``). Configurations the simulator
    cannot tell apart (Horovod autotune) are predicted as the policy they run.
    """
    options: dict[str, Any] = {"workers": group.ranks, "arch": group.framework.arch,
                               "bandwidth": group.bits_per_second / 8, "topology": topology}
    if group.framework.arch == "ps":
        options["servers"] = group.ranks
    defaults = {c.simulated_as for c in group.configurations
                if c.params.partition_bytes is None and c.simulated_as != VANILLA}
    base = simulate(profile, policies=sorted(defaults) or [VANILLA], **options).predictions[0]
    explicit = {c.params: simulate(profile, policies=[c.simulated_as], partition=c.params.partition_bytes,
                                   credit=c.params.credit_bytes, **options).predictions[0]
                for c in group.configurations if c.params.partition_bytes is not None}
    vanilla = base.vanilla.iteration_time
    out: dict[str, Any] = {"cluster": base.cluster.describe(), "compute_time": base.compute_time,
                           "communication_time": base.communication_time,
                           "ideal_speedup": vanilla / base.ideal_time,
                           "ideal_samples_per_second": base.samples_per_second(base.ideal_time), "configs": {}}
    for config in group.configurations:
        source = explicit.get(config.params, base)
        result = source.result(config.simulated_as)
        out["configs"][config.name] = {"policy": config.simulated_as, "samples_per_second": result.throughput,
                                       "speedup": vanilla / result.iteration_time}
    return out
