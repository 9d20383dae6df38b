"""Diagnostic tools beside the layers, each behind a subcommand of the ``bytesched`` console script.

- :mod:`.check_gpu` and :mod:`.gpucheck`: ``bytesched check-gpu``, two ranks that check bytesched's
  results bit for bit against an unscheduled all-reduce and time it against DDP;
- :mod:`.profile_command`, :mod:`.profiler` and :mod:`.models`: ``bytesched profile``, a
  simulator profile of a torch model (the paper's three, or the user's), by counting FLOPs or by
  timing it.

They use the plugins and the simulator as a user would; nothing in the layers imports them.
The command-line modules import no torch until a command runs.
"""
