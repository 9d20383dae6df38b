"""Options as the command line gives them (``"10Gbps"``, ``"300us"``, ``"4MB"``,
``"bandwidth=1,10,25Gbps"``) turned into the simulator's typed inputs, with errors that name
the option; numbers (bytes, seconds, bytes/s) pass through unchanged."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Iterable, Mapping, Sequence

from ..core.config import SIMULATED_POLICIES, ConfigError, SchedulingParams, format_size, parse_size
from .cluster import Cluster, WorkerSpec, format_bandwidth, parse_bandwidth, parse_duration, parse_worker_spec
from .plan import PLAN
from .simulator import VANILLA

_BANDWIDTH_FIELDS = ("bandwidth", "server_bandwidth")
_DURATION_FIELDS = ("overhead", "latency", "cycle_time")
_SIZE_FIELDS = ("fusion_threshold", "bucket_bytes", "vanilla_bucket_bytes")
_INT_FIELDS = ("workers", "servers", "bigarray_bound")
SWEEPABLE = ("bandwidth", "workers", "servers", "server_bandwidth", "overhead", "latency",
             "partition", "credit")


def make_cluster(cluster: Cluster | None = None, **options: Any) -> Cluster:
    """A :class:`Cluster` from ``cluster`` (or the defaults) with ``options`` applied; string
    values are parsed (``bandwidth="10Gbps"``, ``overhead="300us"``, ``worker_specs=["3:compute=2"]``)."""
    known = {f.name for f in fields(Cluster)}
    values: dict[str, Any] = {}
    for name, value in options.items():
        if name not in known:
            raise ConfigError(f"{name!r} is not a cluster option: expected one of {', '.join(sorted(known))}")
        if value is not None:
            values[name] = _parse_field(name, value)
    base = cluster or Cluster()
    return replace(base, **values) if values else base


def make_params(partition: str | float | None, credit: str | float | None) -> SchedulingParams:
    """Scheduling parameters from the command line's sizes (None: the defaults)."""
    part = None if partition is None else _size(partition, "partition")
    cred = SchedulingParams().credit_bytes if credit is None else _size(credit, "credit")
    return SchedulingParams(partition_bytes=part, credit_bytes=cred)


def _parse_field(name: str, value: Any) -> Any:
    if name in _BANDWIDTH_FIELDS:
        return parse_bandwidth(value, name=name)
    if name in _DURATION_FIELDS:
        return parse_duration(value, name=name)
    if name in _SIZE_FIELDS:
        return _size(value, name)
    if name in _INT_FIELDS:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={value!r} is not an integer") from None
        if isinstance(value, float) and value != number:
            raise ConfigError(f"{name}={value!r} is not an integer")
        return number
    if name == "worker_specs":
        specs = value.items() if isinstance(value, Mapping) else value
        return tuple(parse_worker_spec(s) if isinstance(s, str) else _spec_pair(s) for s in specs)
    return value


def _spec_pair(item: Any) -> tuple[int, WorkerSpec]:
    rank, spec = item
    return int(rank), spec if isinstance(spec, WorkerSpec) else WorkerSpec(**spec)


def _size(value: str | float, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return parse_size(str(value), name=name)


def policy_names(policies: Iterable[str] | str | None) -> list[str]:
    """Policy names from a list or a comma-separated string; None means every policy and the
    plan (what a job runs with no settings, :mod:`.plan`)."""
    if policies is None:
        return [*SIMULATED_POLICIES, PLAN]
    names = [p.strip() for p in (policies.split(",") if isinstance(policies, str) else policies) if p.strip()]
    unknown = [p for p in names if p not in SIMULATED_POLICIES and p not in (VANILLA, PLAN)]
    if unknown:
        raise ConfigError(f"policy {unknown[0]!r} is unknown: expected some of "
                          f"{', '.join([*SIMULATED_POLICIES, PLAN])}")
    return names


def parse_sweep(sweep: tuple[str, Sequence[Any]] | str) -> tuple[str, list[Any]]:
    """``("bandwidth", [...])`` or ``"bandwidth=1,10,25Gbps"`` (a unit on the last value applies
    to the bare numbers before it) -> the variable and its parsed values."""
    if isinstance(sweep, str):
        variable, eq, text = sweep.partition("=")
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not eq or not items:
            raise ConfigError(f"sweep {sweep!r}: expected VARIABLE=V1,V2,... e.g. bandwidth=1,10,25,40,100Gbps")
        unit = items[-1].lstrip("0123456789.eE+-")
        raw: list[Any] = [item + unit if unit and item.replace(".", "", 1).isdigit() else item for item in items]
    else:
        variable, raw = sweep[0], list(sweep[1])
    variable = variable.strip().replace("-", "_")
    if variable not in SWEEPABLE:
        raise ConfigError(f"cannot sweep {variable!r}: expected one of {', '.join(SWEEPABLE)}")
    if not raw:
        raise ConfigError(f"sweep of {variable!r} has no values")
    if variable in ("partition", "credit"):
        return variable, [_size(v, variable) for v in raw]
    return variable, [_parse_field(variable, v) for v in raw]


def format_value(variable: str, value: Any) -> str:
    if variable in _BANDWIDTH_FIELDS:
        return format_bandwidth(value)
    if variable in ("partition", "credit"):
        return format_size(value)
    if variable in _DURATION_FIELDS:
        return f"{value * 1e6:g}us"
    return str(value)
