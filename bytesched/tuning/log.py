"""The tuning log: one CSV row per trial, written as it happens, that a person can read.

::

    trial,partition_mb,credit_mb,batch_mb,samples_per_s,best_samples_per_s,source
    0,4.000,16.000,0.000,1210.4,1210.4,configured
    1,0.707,90.510,0.000,1302.9,1302.9,initial
    ...
    best,2.828,22.627,0.177,1344.0,1344.0,final

Sizes are in MB (10^6 bytes, to the kilobyte), throughput in samples per second as rank 0
measured it; ``batch_mb`` is the batching threshold (0: no batching; always 0 on a backend that
does not batch). ``source`` says why a point was tried: ``configured`` (the job's own sizes),
``loaded`` (a previous job's best), ``predicted`` (the simulator's warm start), ``initial`` (the
optimiser's first spread-out points) or ``bo`` (Expected Improvement). The last row, ``best``, is
what the job kept. Rows are flushed one by one, so a job killed mid-way leaves a usable log, and
:func:`load_best` then takes the fastest row. A log written before the batching column existed
(no ``batch_mb``) loads as no batching.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TextIO

from ..core.config import ConfigError, SchedulingParams

COLUMNS = ("trial", "partition_mb", "credit_mb", "batch_mb", "samples_per_s", "best_samples_per_s", "source")
UNBATCHED_COLUMNS = tuple(c for c in COLUMNS if c != "batch_mb")
"""The columns of a log written before the batching threshold was tuned."""
BEST_ROW = "best"


class TuningLog:
    """Appends trials to a CSV file (rank 0 only); the header is written on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file: TextIO = self.path.open("w", newline="")
        except OSError as exc:
            raise ConfigError(f"BYTESCHED_TUNING_LOG={str(path)!r} cannot be written: {exc.strerror}") from None
        self._writer = csv.writer(self._file)
        self._writer.writerow(COLUMNS)
        self._file.flush()

    def trial(self, trial: int | str, params: SchedulingParams, throughput: float, best: float, source: str) -> None:
        """One row: the trial's sizes, what it measured and the best so far."""
        self._writer.writerow([trial, _mb(params.partition_bytes), _mb(params.credit_bytes), _mb(params.batch_bytes),
                               f"{throughput:.1f}", f"{best:.1f}", source])
        self._file.flush()

    def best(self, params: SchedulingParams, throughput: float) -> None:
        """The closing row: what the job keeps."""
        self.trial(BEST_ROW, params, throughput, throughput, "final")

    def close(self) -> None:
        self._file.close()


def _mb(nbytes: float | None) -> str:
    return f"{(nbytes or 0) / 1e6:.3f}"


def _bytes(mb: str) -> int:
    return round(float(mb) * 1e6)


def load_best(path: str | Path) -> SchedulingParams:
    """The sizes a previous job kept: its ``best`` row, or its fastest trial if it was cut short.

    ConfigError naming the file (and line) if it is missing, empty or not a tuning log.
    """
    where = f"BYTESCHED_TUNING_LOAD={str(path)!r}"
    try:
        with Path(path).open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{where} is not a tuning log ({exc})") from None
    if not rows or tuple(rows[0]) not in (COLUMNS, UNBATCHED_COLUMNS):
        raise ConfigError(f"{where} is not a tuning log: its first line should be {','.join(COLUMNS)}")
    header = rows[0]
    parsed = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ConfigError(f"{where}, line {line}: expected {len(header)} columns, got {len(row)}")
        cells = dict(zip(header, row))
        try:
            speed = float(cells["samples_per_s"])
            params = SchedulingParams(partition_bytes=_bytes(cells["partition_mb"]),
                                      credit_bytes=_bytes(cells["credit_mb"]),
                                      batch_bytes=_bytes(cells.get("batch_mb", "0")))
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{where}, line {line}: {exc}") from None
        if row[0] == BEST_ROW:
            return params
        parsed.append((speed, params))
    if not parsed:
        raise ConfigError(f"{where} has no trials")
    return max(parsed, key=lambda item: item[0])[1]
