"""bytesched.sim: a discrete-event simulator that runs the real scheduler in virtual time.

It predicts iteration time, throughput and speedup over the vanilla framework for a model
profile on a described cluster, under every policy, by driving the same
:class:`~bytesched.core.scheduler.Scheduler` and policies the runtime Core uses::

    from bytesched.sim import simulate
    report = simulate("vgg16", arch="ps", workers=16, bandwidth="10Gbps", partition="4MB")
    print(report.table())

See docs/simulator.md for the model, its assumptions and limits. Nothing here imports torch
(profiles of torch models are made by ``bytesched profile``, :mod:`bytesched.tools.profiler`), nor
matplotlib until a plot is drawn.
"""

from .cluster import Cluster, WorkerSpec, parse_bandwidth, parse_duration
from .options import make_cluster, make_params
from .predict import Prediction, PolicyPrediction, Report, predict, simulate
from .profile import Layer, ModelProfile, ProfileError, Tensor, load_profile, shipped_profiles
from .simulator import VANILLA, RunResult, SimulationError, Trace, run

__all__ = [
    "simulate", "predict", "run", "Report", "Prediction", "PolicyPrediction", "RunResult", "Trace",
    "Cluster", "WorkerSpec", "make_cluster", "make_params", "parse_bandwidth", "parse_duration",
    "ModelProfile", "Layer", "Tensor", "load_profile", "shipped_profiles", "ProfileError",
    "SimulationError", "VANILLA",
]
