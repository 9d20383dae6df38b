"""Every ``BYTESCHED_*`` environment variable is read and validated here, and nowhere else.

Other modules receive a typed :class:`Config`; they never look at ``os.environ``. A bad value
raises :class:`ConfigError` naming the variable, the value and the accepted form, so that a
typo in a launch script fails at start-up instead of silently changing how a job runs.
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

log = logging.getLogger("bytesched")

POLICIES = ("bytescheduler", "fifo", "p3", "prophet", "tictac")
"""The policies a job can run (``BYTESCHED_POLICY``). ``tictac`` orders by the graph the plugins
trace from the first forward pass (TIC; the simulator builds it from its profile, with durations:
TAC)."""
OFF = "off"
"""``BYTESCHED_POLICY=off``: no scheduling (:attr:`Config.scheduling` is False)."""
SCHEDULING_OFF = f"scheduling is off (BYTESCHED_POLICY={OFF})"
"""How messages name that setting."""
SIMULATED_POLICIES = POLICIES
"""The policies the simulator can run: every one a job can."""
ORDER_MODES = ("auto", "rank0", "immediate")
STAY_OUT_PATHS = ("auto", "measure", "predict")
NATIVE_MODES = ("auto", "on", "off")
NATIVE_POLICIES = ("bytescheduler", "fifo")
"""The policies the native Scheduler (csrc/scheduler.cc) implements; the others keep the Python Core."""
"""How a start-up plan that stays out of the way picks its path (``BYTESCHED_STAY_OUT_PATH``)."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

UNLIMITED = math.inf
"""Partition or credit size meaning "no limit" (accepted in the environment as ``inf``)."""
STAY_OUT_FUSION_BYTES = 25_000_000
"""Where the start-up plan stays out of the way (or scheduling is off), a plugin that offers its
fusion bound gets this one by default (DistributedDataParallel's ``bucket_cap_mb``), or a quarter
of the model if that is smaller (:func:`bytesched.runtime.startup_plan.stay_out_fusion`), and fills its
tasks to it as DDP fills its buckets (:func:`bytesched.core.task.filled_runs`). With nothing to
schedule, small tasks buy a little earlier communication, which the simulator credits, and cost
bytesched's own work and the library's per collective, which it does not model: fewer, larger
tasks ran faster on a GPU and cost less CPU over torch.distributed (docs/plan.md, "2 on";
``BYTESCHED_STAY_OUT_FUSION_BYTES`` sets another)."""
PIECE_BYTES = 4_000_000
"""The parameter bytes of one piece of a compiled model's graph (``BYTESCHED_PIECE_BYTES``)."""

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9,
    "kib": 2**10, "mib": 2**20, "gib": 2**30,
    "k": 10**3, "m": 10**6, "g": 10**9,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
SIZE_FORM = "a byte count such as 4000000, 4MB, 4MiB, 512KB (or 'inf' for no limit)"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the variable and the accepted form."""


def parse_size(text: str, *, name: str = "size") -> float:
    """Parse a byte size: ``4000000``, ``4MB`` (10^6), ``4MiB`` (2^20), ``inf``.

    Returns an int number of bytes, or :data:`UNLIMITED`. ``name`` is used in the error.
    """
    if text.strip().lower() in ("inf", "infinity", "unlimited"):
        return UNLIMITED
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ConfigError(f"{name}={text!r} is not a size: expected {SIZE_FORM}")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise ConfigError(f"{name}={text!r} must be at least 1 byte: expected {SIZE_FORM}")
    if value > 2**50:
        raise ConfigError(f"{name}={text!r} is absurdly large (> 1 PiB): expected {SIZE_FORM} or 'inf'")
    return int(value)


def format_size(nbytes: float) -> str:
    """Human-readable size for logs and tables (``inf`` for unlimited)."""
    if nbytes == UNLIMITED:
        return "inf"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{int(nbytes)}B"


@dataclass(frozen=True)
class SchedulingParams:
    """The two knobs of Algorithm 1 that the tuner searches: partition size and credit size.

    ``partition_bytes=None`` means "the policy's own default" (4 MB for bytescheduler, P3's
    160 KB slices for p3), so choosing a policy does not also require choosing its slice size.
    """

    partition_bytes: float | None = None
    credit_bytes: float = 16_000_000
    batch_bytes: float = 0
    """Batching while busy (:class:`~bytesched.core.scheduler.Scheduler`): sub-tasks smaller than
    this that become ready while others are in flight start together as one backend operation of
    at most this many bytes; 0: never."""

    def __post_init__(self) -> None:
        for name in ("partition_bytes", "credit_bytes"):
            value = getattr(self, name)
            if value is None and name == "partition_bytes":
                continue
            if not (value == UNLIMITED or (isinstance(value, (int, float)) and value >= 1)):
                raise ConfigError(f"{name}={value!r} must be a positive number of bytes or UNLIMITED")
        batch = self.batch_bytes
        if not (batch == UNLIMITED or (isinstance(batch, (int, float)) and batch >= 0)):
            raise ConfigError(f"batch_bytes={self.batch_bytes!r} must be 0 (off), a number of bytes or UNLIMITED")


@dataclass(frozen=True)
class Config:
    """Validated bytesched settings (see :data:`VARIABLES` for the environment variables)."""

    params: SchedulingParams = field(default_factory=SchedulingParams)
    policy: str = "bytescheduler"
    order: str = "auto"
    timeline: str | None = None
    log_level: str = "WARNING"
    fusion_bytes: float = 1_000_000
    fusion_fixed: bool = False
    """Keep ``fusion_bytes`` even where the start-up plan stays out of the way (which fuses the
    PyTorch plugin's tasks into larger buckets): :func:`from_env` sets it when
    ``BYTESCHED_FUSION_BYTES`` is given."""
    stay_out_fusion_bytes: float = STAY_OUT_FUSION_BYTES
    """Where the PyTorch plugin stays out of the way, each task it merges its buckets into is closed
    once it holds this many bytes, as DDP fills its buckets (:data:`STAY_OUT_FUSION_BYTES`), unless
    ``fusion_fixed``."""
    piece_bytes: float = PIECE_BYTES
    """A compiled model's graphs are split into pieces holding about this many bytes of parameters
    (the PyTorch plugin, :mod:`bytesched.plugins.torch.compiled`)."""
    channel_host: str = "127.0.0.1"
    channel_port: int | None = None  # None: rank 0 picks a free port and the plugin shares it
    channel_timeout_s: float = 60.0
    job_token: str = ""
    stall_warning_s: float = 60.0
    stall_timeout_s: float = 0.0
    fault_timeout_s: float = 60.0
    check_every: int = 0
    plan: bool = False
    """Choose partition and credit sizes at start-up from the job's own measured step
    (:mod:`bytesched.runtime.startup_plan`). :func:`from_env` switches it on unless ``BYTESCHED_PLAN=0``
    or the job sets a size; a Config built in code keeps its explicit ``params``."""
    plan_trial: bool | None = None
    """Sizes the start-up plan chose are kept only if they ran faster than staying out and passing
    through, timed side by side (:mod:`bytesched.runtime.plan_trial`); None: the backend's default
    (:func:`bytesched.runtime.plan_trial.wants_trial`)."""
    tuning: bool = False
    tuning_max_trials: int = 15
    tuning_steps_per_trial: int = 50
    tuning_warmup_steps: int = 10
    tuning_seed: int = 0
    tuning_xi: float = 0.03
    tuning_log: str | None = None
    tuning_load: str | None = None
    tuning_profile: str | None = None
    tuning_bandwidth: str | None = None
    tuning_floor: tuple[int, int] | None = None  # None: the architecture's own lattice
    stay_out_path: str = "auto"
    """Where the start-up plan stays out of the way, how the PyTorch plugin picks between the Core's
    path and the framework's own (:mod:`bytesched.runtime.path_trial`): ``measure`` times both,
    ``predict`` follows the plan's prediction (on a GPU: always the framework's), ``auto`` (the
    default) measures."""
    native: str = "auto"
    """Where the PyTorch plugin's hot path over torch.distributed runs (``BYTESCHED_NATIVE``):
    ``auto`` natively wherever it can (CPU gradients, a policy in :data:`NATIVE_POLICIES`),
    ``on`` natively or an error naming why not, ``off`` through the Python Core."""
    scheduling: bool = True
    """False (``BYTESCHED_POLICY=off``): every plugin hands its gradients to the framework's own
    path from the first step, as after a start-up plan that stays out and passes through, so a job
    can take bytesched out without changing its code. Its Core is made (with ``fifo``) but is given
    no task."""

    def __post_init__(self) -> None:
        _check_runtime_policy("policy", self.policy)
        if self.order not in ORDER_MODES:
            raise ConfigError(f"order={self.order!r} is unknown: expected one of {', '.join(ORDER_MODES)}")
        if self.stay_out_path not in STAY_OUT_PATHS:
            raise ConfigError(f"stay_out_path={self.stay_out_path!r} is unknown: expected one of "
                              f"{', '.join(STAY_OUT_PATHS)}")
        if not self.scheduling:
            _check_nothing_to_schedule(self)

    def with_params(self, params: SchedulingParams) -> "Config":
        """A copy with other scheduling parameters (configs are immutable)."""
        return replace(self, params=params)


def _check_nothing_to_schedule(config: Config) -> None:
    """Scheduling is off: settings that only scheduling reads would be silently ignored."""
    if config.tuning or config.tuning_load:
        raise ConfigError(f"{SCHEDULING_OFF}, so there is nothing to tune: unset BYTESCHED_TUNING and "
                          "BYTESCHED_TUNING_LOAD, or choose a policy")
    if config.params != SchedulingParams():
        raise ConfigError(f"{SCHEDULING_OFF}, so nothing is partitioned or held back: unset "
                          "BYTESCHED_PARTITION_BYTES and BYTESCHED_CREDIT_BYTES, or choose a policy")
    if config.policy != "fifo":
        raise ConfigError(f"{SCHEDULING_OFF}: its Core runs fifo, not {config.policy!r}")


# ----------------------------------------------------------------------------------------------
# Environment variables: one table, the single source of truth (docs are generated from it).


@dataclass(frozen=True)
class Variable:
    """One environment variable: where it lands in :class:`Config`, how it parses, what it means."""

    name: str
    target: str
    parse: Callable[[str, str], Any]
    default: str
    doc: str


def _size(name: str, text: str) -> float:
    return parse_size(text, name=name)


def _size_or_off(name: str, text: str) -> float:
    return 0 if text.strip() == "0" else parse_size(text, name=name)


def _size_pair(name: str, text: str) -> tuple[int, int]:
    partition, colon, credit = text.partition(":")
    if not colon:
        raise ConfigError(f"{name}={text!r} is not valid: expected PARTITION:CREDIT, e.g. 256KB:1MB")
    sizes = [parse_size(part, name=name) for part in (partition, credit)]
    if not all(math.isfinite(size) for size in sizes):
        raise ConfigError(f"{name}={text!r} is not valid: both sizes must be finite, e.g. 256KB:1MB")
    return int(sizes[0]), int(sizes[1])


def _check_runtime_policy(name: str, value: str) -> None:
    if value not in POLICIES:
        raise ConfigError(f"{name}={value!r} is unknown: expected one of {', '.join(POLICIES)}"
                          + (f" (or {OFF} in BYTESCHED_POLICY, which sets scheduling=False)" if value == OFF else ""))


def _runtime_policy(name: str, text: str) -> str:
    value = text.strip().lower()
    if value != OFF:
        _check_runtime_policy(name, value)
    return value


def _choice(options: tuple[str, ...], *, upper: bool = False) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in options:
            raise ConfigError(f"{name}={text!r} is not valid: expected one of {', '.join(options)}")
        return value
    return parse


def _finite_float(*, allow_zero: bool, example: str, maximum: float = math.inf) -> Callable[[str, str], float]:
    """A parser of finite numbers > 0 (or >= 0 with ``allow_zero``) up to ``maximum``."""
    bound = ">= 0" if allow_zero else "> 0"
    if maximum < math.inf:
        bound += f" and <= {maximum:g}"

    def parse(name: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a number: expected e.g. {example}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero) or value > maximum:
            raise ConfigError(f"{name}={text!r} must be a finite number {bound}, e.g. {example}")
        return value
    return parse


_WEEK_S = 7 * 24 * 3600.0  # a timeout longer than this is a unit mistake (ms for s), not a setting
_positive_float = _finite_float(allow_zero=False, example="60 (seconds)", maximum=_WEEK_S)
_seconds_or_off = _finite_float(allow_zero=True, example="60 (seconds; 0 switches it off)", maximum=_WEEK_S)
_non_negative_float = _finite_float(allow_zero=True, example="0.1")


def _port(name: str, text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise ConfigError(f"{name}={text!r} is not a TCP port: expected an integer in 1..65535")
    return int(text)


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", "no", "yes"):
        raise ConfigError(f"{name}={text!r} is not a switch: expected 1 or 0 (true/false, on/off, yes/no)")
    return value in ("1", "true", "on", "yes")


def _count(minimum: int, maximum: int = 10**9) -> Callable[[str, str], int]:
    """A parser of integers in ``minimum..maximum`` (larger counts are typos, not settings)."""
    def parse(name: str, text: str) -> int:
        if not text.strip().isdecimal() or not minimum <= int(text) <= maximum:
            raise ConfigError(f"{name}={text!r} is not valid: expected an integer in {minimum}..{maximum}")
        return int(text)
    return parse


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(f"{name} is set but empty: unset it or give a value")
    return text.strip()


VARIABLES: tuple[Variable, ...] = (
    Variable("BYTESCHED_PARTITION_BYTES", "params.partition_bytes", _size, "(policy default: 4MB; p3 160KB)",
             "Partition size: tensors are split into sub-tasks of at most this many bytes."),
    Variable("BYTESCHED_CREDIT_BYTES", "params.credit_bytes", _size, "16MB",
             "Credit size: bytes of sub-tasks allowed in flight at once (the sliding window)."),
    Variable("BYTESCHED_BATCH_BYTES", "params.batch_bytes", _size_or_off, "0 (off)",
             "Batching while busy: sub-tasks smaller than this that become ready while others are in flight "
             "start together as one backend operation of at most this many bytes (over torch.distributed; "
             "0 switches it off). Unset, the start-up plan weighs it with every size (the calibrated per-operation "
             "cost's threshold, or the model's bytes); under BYTESCHED_TUNING it is tuned, this value is trial 0's."),
    Variable("BYTESCHED_FUSION_BYTES", "fusion_bytes", _size, "1MB",
             "Tensor fusion (PyTorch plugin, MXNet over Horovod): gradients of consecutive parameters are "
             "all-reduced as one task while they hold at most this many bytes together (1 switches fusion off). "
             "Unset, where the PyTorch plugin stays out of the way (a start-up plan, or BYTESCHED_POLICY=off) "
             "on a GPU or over torch.distributed, it fuses them further, as BYTESCHED_STAY_OUT_FUSION_BYTES says."),
    Variable("BYTESCHED_STAY_OUT_FUSION_BYTES", "stay_out_fusion_bytes", _size, "25MB",
             "Where the PyTorch plugin stays out of the way (a start-up plan, or BYTESCHED_POLICY=off) on a GPU "
             "or over torch.distributed, it merges consecutive buckets into tasks, each closed once it holds this "
             "many bytes (at most a quarter of the model; the first bucket, which backward fills last, is kept "
             "as it is): DistributedDataParallel's bucket_cap_mb and its rule, and its default. Cannot be combined "
             "with BYTESCHED_FUSION_BYTES, which keeps one bound on every path."),
    Variable("BYTESCHED_PIECE_BYTES", "piece_bytes", _size, "4MB",
             "PyTorch plugin, compiled models (torch.compile): each graph Dynamo captures is split into pieces "
             "holding about this many bytes of parameters (counted in backward's order, as DDP's compiler pass "
             "splits at its buckets); each piece's backward hands out its gradients when it ends, and each "
             "piece waits for the updates of the parameters it reads before it runs."),
    Variable("BYTESCHED_POLICY", "policy", _runtime_policy, "bytescheduler",
             "Scheduling policy: " + ", ".join(POLICIES) + f"; or {OFF}: no scheduling, every plugin hands its "
             "gradients to the framework's own path from the first step (no start-up plan, sizes or tuning)."),
    Variable("BYTESCHED_ORDER", "order", _choice(ORDER_MODES), "auto",
             "Cross-rank order: rank0 (followers obey rank 0's start order over the channel), "
             "immediate (followers start when ready; the backend negotiates order, e.g. Horovod), "
             "auto (the plugin picks)."),
    Variable("BYTESCHED_TIMELINE", "timeline", _text, "(off)",
             "Write a Chrome-trace timeline to this path; when several ranks run, rank r writes the "
             "path with '.r' inserted before the extension (tl.json -> tl.0.json, tl.1.json, ...)."),
    Variable("BYTESCHED_LOG_LEVEL", "log_level", _choice(LOG_LEVELS, upper=True), "WARNING",
             "Log level of the 'bytesched' logger."),
    Variable("BYTESCHED_CHANNEL_HOST", "channel_host", _text, "127.0.0.1",
             "Address rank 0 binds its control channel to (and followers connect to)."),
    Variable("BYTESCHED_CHANNEL_PORT", "channel_port", _port, "(a free port)",
             "TCP port of rank 0's control channel. Unset: rank 0 listens on a free port and tells the "
             "other ranks through the backend's own broadcast (PyTorch plugin), so jobs on one host do "
             "not collide; a plugin without such a broadcast (MXNet) uses 29517 unless its launcher "
             "sets one (bytesched launch does)."),
    Variable("BYTESCHED_CHANNEL_TIMEOUT_S", "channel_timeout_s", _positive_float, "60",
             "Seconds to wait for peers on the control channel before failing."),
    Variable("BYTESCHED_JOB_TOKEN", "job_token", _text, "(derived from the launcher)",
             "Per-job secret shared by all ranks; rank-0 channel messages not authenticated with it "
             "are rejected. Unset: derived from the launcher's rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR/"
             "PORT, DMLC_PS_ROOT_URI/PORT or MASTER_ADDR/PORT), which keeps jobs apart but is no secret."),
    Variable("BYTESCHED_STALL_WARNING_S", "stall_warning_s", _positive_float, "60",
             "Warn when a started sub-task has not finished after this many seconds; the warning names "
             "the tensor, its partition and (when the rank-0 channel is open) the ranks that have not "
             "started it."),
    Variable("BYTESCHED_STALL_TIMEOUT_S", "stall_timeout_s", _seconds_or_off, "0 (off)",
             "Fail the job (every unfinished task raises, the process exits non-zero) when a started "
             "sub-task has not finished after this many seconds; 0: only warn."),
    Variable("BYTESCHED_FAULT_TIMEOUT_S", "fault_timeout_s", _seconds_or_off, "60",
             "Multi-rank jobs: a rank silent on the rank-0 channel this long is lost; every other rank "
             "logs which rank was lost and which tensor it was waiting for, then exits non-zero (at "
             "most 10 s later, even if the backend hangs in a collective). Opens the channel's "
             "heartbeats for every multi-rank job; 0 switches detection off."),
    Variable("BYTESCHED_CHECK", "check_every", _count(0), "0 (off)",
             "Every N steps, compare a checksum of every parameter across ranks and raise naming the "
             "first parameter that differs and the ranks that disagree; 0: never."),
    Variable("BYTESCHED_PLAN", "plan", _flag, "1",
             "1: with neither BYTESCHED_PARTITION_BYTES nor BYTESCHED_CREDIT_BYTES set, the bytescheduler "
             "policy and no tuning, a multi-rank job stays out of the way (no partitioning, no credit "
             "limit) for two steps, times the backend's all-reduce, and rank 0 picks the sizes by "
             "simulating the second step; every rank applies them from the third (docs/plan.md). "
             "0: the fixed default sizes apply."),
    Variable("BYTESCHED_PLAN_TRIAL", "plan_trial", _flag,
             "1 on a parameter server and over torch.distributed on the CPU, else 0",
             "1: sizes the start-up plan chose are kept only if they run faster than staying out: six "
             "steps on the sizes, six passing through to the framework's own path, and every rank keeps "
             "the faster (the sizes only when faster by 2 %); 0: the sizes are kept as predicted."),
    Variable("BYTESCHED_STAY_OUT_PATH", "stay_out_path", _choice(STAY_OUT_PATHS), "auto",
             "Where the start-up plan stays out of the way, which path the PyTorch plugin's gradients take: "
             "measure: six steps through the Core (which crosses the barrier), six on the framework's own "
             "all-reduce, and the faster is kept on every rank (the Core only when faster by 2 %); predict: "
             "the framework's own unless sizes were predicted to gain 2 % (on a GPU, always the framework's); "
             "auto: measure."),
    Variable("BYTESCHED_NATIVE", "native", _choice(NATIVE_MODES), "auto",
             "The PyTorch plugin over torch.distributed: auto: the Core's per-piece work (ready queue, credit, "
             "partitions, each piece's all-reduce and its completion, rank 0's order to the others) runs in C++ "
             "where it can (gradients on the CPU, the bytescheduler or fifo policy), else in the Python Core, "
             "which the log says; on: in C++ or an error naming why it cannot; off: in the Python Core."),
    Variable("BYTESCHED_TUNING", "tuning", _flag, "0",
             "1: rank 0 auto-tunes partition and credit sizes by Bayesian optimisation and broadcasts "
             "them (docs/tuning.md); 0: the fixed BYTESCHED_PARTITION_BYTES / BYTESCHED_CREDIT_BYTES apply."),
    Variable("BYTESCHED_TUNING_MAX_TRIALS", "tuning_max_trials", _count(1), "15",
             "Tuning: most (partition, credit) points tried; it stops earlier when little is left to gain."),
    Variable("BYTESCHED_TUNING_STEPS_PER_TRIAL", "tuning_steps_per_trial", _count(1), "50",
             "Tuning: training steps each trial runs (warm-up, measurement window, announcement lead)."),
    Variable("BYTESCHED_TUNING_WARMUP_STEPS", "tuning_warmup_steps", _count(0), "10",
             "Tuning: steps at the start of each trial that are not measured."),
    Variable("BYTESCHED_TUNING_SEED", "tuning_seed", _count(0), "0",
             "Tuning: seed of the optimiser's random choices (the same seed proposes the same points)."),
    Variable("BYTESCHED_TUNING_XI", "tuning_xi", _non_negative_float, "0.03",
             "Tuning: exploration parameter of Expected Improvement, in log-throughput units."),
    Variable("BYTESCHED_TUNING_LOG", "tuning_log", _text, "(off)",
             "Tuning: rank 0 writes every trial to this CSV file (trial, partition, credit, throughput, best)."),
    Variable("BYTESCHED_TUNING_LOAD", "tuning_load", _text, "(off)",
             "Start from the best point of a previous job's tuning log (alone: use it; with "
             "BYTESCHED_TUNING=1: try it first)."),
    Variable("BYTESCHED_TUNING_PROFILE", "tuning_profile", _text, "(off)",
             "Tuning warm start: model profile (JSON from `bytesched profile`, or vgg16/resnet50/transformer) "
             "the simulator predicts good first points from; needs BYTESCHED_TUNING_BANDWIDTH."),
    Variable("BYTESCHED_TUNING_BANDWIDTH", "tuning_bandwidth", _text, "(off)",
             "Tuning warm start: measured per-worker network bandwidth, e.g. 10Gbps."),
    Variable("BYTESCHED_TUNING_FLOOR", "tuning_floor", _size_pair,
             "(8MB:16MB all-reduce, 500KB:2MB PS; 1/64 of a smaller model)",
             "Tuning: the smallest partition and credit searched, as PARTITION:CREDIT; each knob's lattice "
             "spans six octaves up from there. By default a model smaller than the lattice's top moves it "
             "down to end at the whole model; set it for a slow network, where smaller pieces still pay "
             "off (docs/tuning.md)."),
)

# The original ByteScheduler's variables count 4-byte elements.
_LEGACY_ALIASES = {
    "BYTESCHEDULER_PARTITION": "BYTESCHED_PARTITION_BYTES",
    "BYTESCHEDULER_CREDIT": "BYTESCHED_CREDIT_BYTES",
}


def _legacy_elements(name: str, text: str) -> str:
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"{name}={text!r} must be a positive count of 4-byte elements "
                          f"(or use {_LEGACY_ALIASES[name]} with a byte size)")
    return str(int(text) * 4)


def from_env(environ: Mapping[str, str] | None = None) -> Config:
    """Build a :class:`Config` from ``BYTESCHED_*`` variables (``os.environ`` by default)."""
    env = dict(os.environ if environ is None else environ)
    for old, new in _LEGACY_ALIASES.items():
        if old in env:
            nbytes = _legacy_elements(old, env[old])
            if new in env:
                raise ConfigError(f"both {old} and {new} are set: keep only {new}")
            warnings.warn(f"{old} (4-byte elements) is deprecated: use {new} (bytes); "
                          f"taking {old}={env[old]} as {nbytes} bytes", DeprecationWarning, stacklevel=2)
            env[new] = nbytes
    known = {v.name for v in VARIABLES} | set(_EXTRA_VARIABLES)
    for key in env:
        if key.startswith("BYTESCHED_") and key not in known:
            raise ConfigError(f"{key} is not a bytesched variable: known ones are {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    params: dict[str, Any] = {}
    for var in VARIABLES:
        if var.name in env:
            value = var.parse(var.name, env[var.name])
            if var.target.startswith("params."):
                params[var.target.split(".", 1)[1]] = value
            else:
                values[var.target] = value
    values.setdefault("job_token", launcher_job_token(env))
    values.setdefault("plan", True)
    if params:  # explicit sizes win over the plan
        values["plan"] = False
    if values.get("policy") == OFF:
        values.update(policy="fifo", scheduling=False, plan=False)
    values["fusion_fixed"] = "fusion_bytes" in values
    if values["fusion_fixed"] and "stay_out_fusion_bytes" in values:
        raise ConfigError("BYTESCHED_FUSION_BYTES keeps one fusion bound on every path, so "
                          "BYTESCHED_STAY_OUT_FUSION_BYTES (the bound where the plugin stays out of the way) "
                          "would never apply: set only one of them")
    if "plan_trial" in values and not values["plan"]:
        raise ConfigError(f"BYTESCHED_PLAN_TRIAL={int(values['plan_trial'])} chooses whether a start-up plan's sizes "
                          "are tried, and this job has no plan (BYTESCHED_PLAN=0, a size set, or "
                          "BYTESCHED_POLICY=off): unset it")
    if values.get("stay_out_path", "auto") != "auto" and not values["plan"]:
        raise ConfigError(f"BYTESCHED_STAY_OUT_PATH={values['stay_out_path']} chooses the path of a start-up plan "
                          "that stays out of the way, and this job has none (BYTESCHED_PLAN=0, a size set, or "
                          "BYTESCHED_POLICY=off): unset it")
    return Config(params=SchedulingParams(**params), **values)


# Variables a launcher gives every rank of one job alike, and another job differently (a fresh
# rendezvous port): when BYTESCHED_JOB_TOKEN is unset, the first group present names the job.
LAUNCHER_RENDEZVOUS: tuple[tuple[str, ...], ...] = (
    ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"),  # horovodrun
    ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"),  # MXNet parameter server, bytesched launch
    ("MASTER_ADDR", "MASTER_PORT"),  # torchrun, torch.distributed env://
)


def launcher_job_token(env: Mapping[str, str]) -> str:
    """A job token derived from the launcher's rendezvous, or "" if no launcher variables are set.

    It keeps jobs apart (a stale process of another job cannot join this job's channel) but it
    is not a secret: set BYTESCHED_JOB_TOKEN for that.
    """
    for group in LAUNCHER_RENDEZVOUS:
        if all(env.get(name) for name in group):
            return "launcher:" + ",".join(f"{name}={env[name]}" for name in group)
    return ""


# Variables read by other layers (tuning, launchers, checks) through their own typed config;
# listed so that from_env does not reject them as typos. Each layer registers its names here.
_EXTRA_VARIABLES: dict[str, str] = {
    "BYTESCHED_RANK": "Rank of this worker, set by `bytesched launch` for parameter-server jobs.",
    "BYTESCHED_WORLD_SIZE": "Number of workers, set by `bytesched launch`.",
    "BYTESCHED_TEST_TOKEN": "Set by the test suite (tests/conftest.py) on every process a multi-process "
                            "test starts, to find leftovers; not a setting.",
}


def register_variables(doc_by_name: Mapping[str, str]) -> None:
    """Let another layer declare the ``BYTESCHED_*`` names it reads itself (keeps typo checks)."""
    _EXTRA_VARIABLES.update(doc_by_name)


def describe_variables() -> list[tuple[str, str, str]]:
    """(name, default, meaning) for every variable: the source of the docs' reference table."""
    rows = [(v.name, v.default, v.doc) for v in VARIABLES]
    rows += [(name, "", doc) for name, doc in sorted(_EXTRA_VARIABLES.items())]
    rows += [(old, "", f"Deprecated alias of {new}, in 4-byte elements (the original ByteScheduler's unit).")
             for old, new in _LEGACY_ALIASES.items()]
    return rows


def configure_logging(config: Config) -> None:
    """Apply ``config.log_level`` to the package logger (idempotent)."""
    log.setLevel(config.log_level)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[bytesched %(levelname)s] %(message)s"))
        log.addHandler(handler)


__all__ = [
    "Config", "ConfigError", "SchedulingParams", "UNLIMITED", "OFF", "SCHEDULING_OFF", "POLICIES",
    "SIMULATED_POLICIES", "ORDER_MODES",
    "VARIABLES", "from_env", "parse_size", "format_size", "describe_variables",
    "register_variables", "configure_logging",
]
