"""The framework-agnostic life of a job in one process: the Core, its timeline, the rank-0 channel
with its fault detection, and one way to stop them all (:func:`shutdown`, at the end of a
:func:`running` block or at exit). A plugin supplies its :class:`Workers` and its hooks; see
:mod:`.lifecycle`.

The names below are what a plugin (or a tool) takes from here; the modules behind them are the
runtime's own. The start-up a plugin drives at each step boundary: a :class:`Startup` holding a
:class:`StartupPlan` (or a :class:`TuningWarmStart` beside a tuning session) and the
:class:`StartupController` that decides sizes, path and fusion from its outcome and the trials'
(:mod:`.path`); the plugin is the :class:`PathAdapter` the switches are applied to.
:data:`STAY_OUT` (the sizes a plugin opens with before its plan) and :data:`PASS_THROUGH_MARGIN`
are the simulator's plan's (:mod:`bytesched.sim.plan`), re-exported so that a plugin takes the
runtime's names alone.
"""

from bytesched.sim.plan import PASS_THROUGH_MARGIN, STAY_OUT

from .channel_ranks import ChannelRanks
from .forward_order import announce, order_by_graph
from .lifecycle import (ENGINE, PLUGIN, Ranks, Workers, channel_of, needs_channel, on_channel_failure, running,
                        shutdown, start_core, track, untrack)
from .path import Path, StartupController, Switch
from .path_trial import TRIAL_STEPS, TrialOutcome
from .plan_trial import wants_trial
from .startup import PathAdapter, Startup, step_until_settled
from .stall_watch import StallWatch
from .start_observer import Observer
from .startup_plan import PlanOutcome, StartupPlan, stay_out_fusion, wants_plan
from .tuning_warm_start import TuningWarmStart, wants_warm_start

__all__ = [
    # lifecycle
    "ENGINE", "PLUGIN", "Ranks", "Workers", "channel_of", "needs_channel", "on_channel_failure", "running",
    "shutdown", "start_core", "track", "untrack", "ChannelRanks", "StallWatch",
    # the first forward pass's order
    "announce", "order_by_graph",
    # the start-up plan, its trials, and tuning's warm start
    "Observer", "Startup", "PathAdapter", "StartupController", "Switch", "Path", "step_until_settled",
    "StartupPlan", "PlanOutcome", "wants_plan", "stay_out_fusion", "wants_trial", "TrialOutcome", "TRIAL_STEPS",
    "TuningWarmStart", "wants_warm_start", "STAY_OUT", "PASS_THROUGH_MARGIN",
]
