"""Local launchers for multi-process jobs (the MXNet parameter-server launcher lives in ``ps``)."""

from bytesched.launch.ps import EXIT_TIMEOUT, LaunchError, build_parser, launch_ps, run

__all__ = ["EXIT_TIMEOUT", "LaunchError", "build_parser", "launch_ps", "run"]
