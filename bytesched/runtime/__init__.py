"""The framework-agnostic life of a job in one process: the Core, its timeline, the rank-0 channel
with its fault detection, and their shutdown at exit. A plugin supplies its :class:`Ranks` and its
hooks; see :mod:`.lifecycle`."""

from .lifecycle import Ranks, channel_of, needs_channel, on_channel_failure, start_core

__all__ = ["Ranks", "channel_of", "needs_channel", "on_channel_failure", "start_core"]
