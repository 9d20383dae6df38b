"""The framework-agnostic Core: CommTask, the scheduling state machine, policies, the runtime
Core thread, configuration, the rank-0 channel and the timeline. Imports no framework."""

from .config import OFF, Config, ConfigError, SchedulingParams, UNLIMITED, from_env, parse_size
from .core import Core, CoreShutdownError, get_core, init, shutdown
from .scheduler import Scheduler, SchedulingError, Stats
from .task import CommTask, SubTask, filled_runs, fusion_runs, split_elements

__all__ = [
    "OFF", "Config", "ConfigError", "SchedulingParams", "UNLIMITED", "from_env", "parse_size",
    "Core", "CoreShutdownError", "get_core", "init", "shutdown",
    "Scheduler", "SchedulingError", "Stats", "CommTask", "SubTask", "filled_runs", "fusion_runs", "split_elements",
]
