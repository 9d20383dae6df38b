"""Reading what a job recorded: ``bytesched timeline`` summarises the Chrome traces that
``BYTESCHED_TIMELINE`` writes (per-step overlap, waits, stalls). Imports no framework; matplotlib
only when a plot is drawn."""
