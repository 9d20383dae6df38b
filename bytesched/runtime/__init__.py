"""The framework-agnostic life of a job in one process: the Core, its timeline, the rank-0 channel
with its fault detection, and one way to stop them all (:func:`shutdown`, at the end of a
:func:`running` block or at exit). A plugin supplies its :class:`Workers` and its hooks; see
:mod:`.lifecycle`."""

from .lifecycle import (ENGINE, PLUGIN, Ranks, Workers, channel_of, needs_channel, on_channel_failure, running,
                        shutdown, start_core, track, untrack)

__all__ = ["ENGINE", "PLUGIN", "Ranks", "Workers", "channel_of", "needs_channel", "on_channel_failure", "running",
           "shutdown", "start_core", "track", "untrack"]
